"""What gVisor costs: runc and runsc side by side, in one command.

For each runtime (``ORCHESTRATOR_SANDBOX_RUNTIME``), through the real path of
``bench/overhead.py`` (ingest, Celery signal, a `celery worker` process, the
sandbox, the offline model): a cold container's and a warm session's latency
from message stored to first reply stored, and a quiet group's first run with
standby sandboxes (off under gVisor: the reason is printed).  Then work inside
the sandbox, timed inside it (container start excluded), in a hardened
container of the agent image under each runtime:

* ``git status`` in a repository of 2,000 committed files with 100 changed;
* ``pip download`` of a few packages from a local index (a folder of wheels
  bound in read-only, ``--no-index --find-links``: the sandbox has no network),
  with pip run from its wheel (the agent image has no pip).

    .venv/bin/python -m bench.gvisor [--runs N]

Needs runsc registered with the engine (``scripts/gvisor.sh``).  The wheels are
downloaded once into ``data/build/bench-wheels`` (PyPI).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import docker

from bench.common import pct
from bench.overhead import late_mounts_reason, measure, measure_quiet
from orchestrator.core.settings import Settings
from orchestrator.sandbox.containers import docker_client
from orchestrator.sandbox.image import ensure_agent_image
from orchestrator.sandbox.runtime import GVISOR, gvisor_problem

RUNTIMES = ("runc", GVISOR)
PACKAGES = ("requests", "idna", "certifi", "urllib3", "charset-normalizer", "pip")
WORK = r"""
import glob, json, os, statistics, subprocess, sys, time
def timed(argv, n, cwd):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(argv, cwd=cwd, check=True, capture_output=True)
        out.append(time.perf_counter() - t)
    return statistics.median(out)
n = int(sys.argv[1])
git = timed(["git", "status", "--porcelain"], n, "/repo")
pip = glob.glob("/wheels/pip-*.whl")[0]
packages = ["requests", "idna", "certifi", "urllib3", "charset-normalizer"]
dl = timed([sys.executable, pip + "/pip", "download", "--no-index", "--find-links", "/wheels", "--no-cache-dir",
            "--disable-pip-version-check", "-q", "-d", "/tmp/dl", *packages], n, "/tmp")
print(json.dumps({"git status": git, "pip download": dl}))
"""


def wheels(data_dir: Path) -> Path:
    folder = data_dir / "build" / "bench-wheels"
    if not list(folder.glob("pip-*.whl")):
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(folder), *PACKAGES],
            check=True,
        )
    return folder


def repository(base: Path) -> Path:
    repo = base / "repo"
    repo.mkdir()
    for i in range(2000):
        sub = repo / f"d{i % 40}"
        sub.mkdir(exist_ok=True)
        (sub / f"f{i}.txt").write_text(f"file {i}\n" * 20)
    git = ["git", "-c", "user.name=b", "-c", "user.email=b@b", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "files"], check=True)
    for i in range(0, 2000, 20):
        (repo / f"d{i % 40}" / f"f{i}.txt").write_text("changed\n")
    # The agent's uid: git refuses a repository another user owns.
    subprocess.run(["chown", "-R", "1000:1000", str(repo)], check=True)
    return repo


def inside(image: str, runtime: str, repo: Path, wheelhouse: Path, n: int) -> dict[str, float]:
    import json

    out = docker.from_env().containers.run(
        image,
        entrypoint=["python3", "-c", WORK, str(n)],
        runtime=runtime,
        user="1000:1000",
        network_mode="none",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        read_only=True,
        tmpfs={"/tmp": "rw,size=256m"},
        environment={"HOME": "/tmp"},
        mem_limit="512m",
        volumes={str(repo): {"bind": "/repo", "mode": "rw"}, str(wheelhouse): {"bind": "/wheels", "mode": "ro"}},
        remove=True,
    )
    return {k: float(v) for k, v in json.loads(out.decode().strip().splitlines()[-1]).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    settings = Settings.load(env_file=None)
    client = docker_client(settings)
    ensure_agent_image(client, settings)
    image = settings.sandbox.agent_image
    problem = gvisor_problem(client, image)
    if problem is not None:
        raise SystemExit(f"gVisor cannot be measured here: {problem}")
    wheelhouse = wheels(settings.data_dir)
    results: dict[str, dict[str, float | str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = repository(Path(tmp))
        for runtime in RUNTIMES:
            os.environ["ORCHESTRATOR_SANDBOX_RUNTIME"] = runtime  # the worker processes' too
            base = Path(tmp) / runtime
            row: dict[str, float | str] = {
                "cold run": pct(measure(base / "cold", image, args.runs, warm_idle_s=0), 50),
                "warm run": pct(measure(base / "warm", image, args.runs, warm_idle_s=120), 50),
            }
            reason = late_mounts_reason()
            if runtime == GVISOR:
                reason = "off under gVisor (late bind mounts are not seen)"
            row["quiet group, standby"] = reason or pct(
                measure_quiet(base / "standby", image, args.runs, standby=2), 50
            )
            row.update(inside(image, runtime, repo, wheelhouse, args.runs))
            results[runtime] = row
    print(f"{'p50 (median), n=' + str(args.runs):28} {'runc':>10} {'runsc':>10} {'runsc/runc':>11}")
    for key in results["runc"]:
        a, b = results["runc"][key], results[GVISOR][key]
        if isinstance(a, float) and isinstance(b, float):
            print(f"{key:28} {a * 1000:8.0f}ms {b * 1000:8.0f}ms {b / a:10.1f}x")
        else:
            print(f"{key:28} {_shown(a):>10} {_shown(b):>10}")
    print(f"({os.cpu_count()} cores; medians of {args.runs} each)")


def _shown(value: float | str) -> str:
    return value if isinstance(value, str) else f"{value * 1000:.0f}ms"


if __name__ == "__main__":
    main()
