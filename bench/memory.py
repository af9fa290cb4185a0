"""Memory: peak RSS of a worker (the ``celery worker`` process and its pool
child) while it runs the agent, cold and warm, and what an idle warm
container holds.

A sampler reads the RSS of every process of the worker every 20 ms while
``--runs`` runs go through it (offline model; every other message runs a
command with the bash tool).  RSS counts the pages parent and child share
after the fork twice; PSS (smaps, read once at the end) shares them out.
The idle warm container is read after its last run: ``docker stats``
(usage minus page cache, as the CLI shows it) and its memory cgroup
(``memory.current`` on cgroup v2; ``memory.usage_in_bytes`` and the peak
``memory.max_usage_in_bytes`` on v1).

    .venv/bin/python -m bench.memory [--runs 20]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import threading
import time
from pathlib import Path

import docker
import psutil

from bench.common import Workers, install, remove_install_containers, signals_for
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.sandbox.containers import LABEL_INSTALL, LABEL_WARM, docker_client
from orchestrator.sandbox.image import ensure_agent_image
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group, get_group

MiB = 1024 * 1024
JID = "main@local"


class Sampler(threading.Thread):
    """Peak RSS of the worker's processes (total, parent, pool children)."""

    def __init__(self, workers: Workers) -> None:
        super().__init__(daemon=True)
        self.workers = workers
        self.stop = threading.Event()
        self.peak = self.peak_parent = self.peak_children = 0

    def rss(self) -> tuple[int, int]:
        parent = children = 0
        for proc in self.workers.procs:
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(proc.pid)
                parent += p.memory_info().rss
                children += sum(c.memory_info().rss for c in p.children(recursive=True))
        return parent, children

    def run(self) -> None:
        while not self.stop.wait(0.02):
            with contextlib.suppress(psutil.Error):
                parent, children = self.rss()
                self.peak = max(self.peak, parent + children)
                self.peak_parent = max(self.peak_parent, parent)
                self.peak_children = max(self.peak_children, children)

    def pss(self) -> int:
        return sum(p.memory_full_info().pss for p in self.workers.trees())


def drive(db: Database, settings: Settings, runs: int, workers: Workers) -> None:
    for i in range(runs):
        text = f"$ echo run {i} && ls /workspace" if i % 2 else f"hello {i}"
        seq = ingest(
            db,
            settings,
            IncomingMessage(chat_jid=JID, sender="bench", content=text),
            signal=signals_for(settings).group,
        ).message.seq
        deadline = time.monotonic() + 120
        while get_group(db, JID).cursor_seq < seq:
            if time.monotonic() > deadline:
                raise SystemExit(f"run {i} not answered in 120 s:\n{workers.logs()}")
            time.sleep(0.02)


def cgroup_memory(container_id: str) -> dict[str, int]:
    """The container's memory cgroup figures (v2 or v1, whichever the host has)."""
    for v2 in (
        Path(f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope"),
        Path(f"/sys/fs/cgroup/docker/{container_id}"),
    ):
        if (v2 / "memory.current").exists():
            out = {"memory.current": int((v2 / "memory.current").read_text())}
            if (v2 / "memory.peak").exists():
                out["memory.peak"] = int((v2 / "memory.peak").read_text())
            return out
    v1 = Path(f"/sys/fs/cgroup/memory/docker/{container_id}")
    if (v1 / "memory.usage_in_bytes").exists():
        stat = dict(line.split() for line in (v1 / "memory.stat").read_text().splitlines())
        return {
            "memory.usage_in_bytes": int((v1 / "memory.usage_in_bytes").read_text()),
            "memory.max_usage_in_bytes": int((v1 / "memory.max_usage_in_bytes").read_text()),
            "rss": int(stat.get("total_rss", stat.get("rss", 0))),
            "cache": int(stat.get("total_cache", stat.get("cache", 0))),
        }
    return {}


def measure(base: Path, image: str, runs: int, warm_idle_s: float) -> None:
    settings, db = install(base, image, warm_idle_s)
    ensure_main_group(db)
    mode = "warm" if warm_idle_s else "cold"
    try:
        with Workers(settings, 1) as workers:
            time.sleep(3)
            sampler = Sampler(workers)
            parent, children = sampler.rss()
            print(
                f"{mode}: worker idle after start: {parent / MiB:5.1f} MiB (parent) + {children / MiB:5.1f} MiB"
                f" (pool child) = {(parent + children) / MiB:5.1f} MiB RSS"
            )
            sampler.start()
            drive(db, settings, runs, workers)
            sampler.stop.set()
            sampler.join()
            print(
                f"{mode}: worker peak during {runs} runs: {sampler.peak / MiB:5.1f} MiB RSS"
                f" (parent peak {sampler.peak_parent / MiB:5.1f}, pool child peak {sampler.peak_children / MiB:5.1f});"
                f" PSS after the runs {sampler.pss() / MiB:5.1f} MiB"
            )
            if warm_idle_s:
                time.sleep(2)  # idle: between runs
                client = docker.from_env()
                labels = [f"{LABEL_WARM}=1", f"{LABEL_INSTALL}={settings.install_id}"]
                for c in client.containers.list(filters={"label": labels}):
                    stats = c.stats(stream=False)["memory_stats"]
                    cache = stats.get("stats", {}).get("cache", stats.get("stats", {}).get("inactive_file", 0))
                    top = c.top()
                    col = top["Titles"].index("PID")
                    runner_rss = 0
                    for row in top["Processes"] or []:
                        with contextlib.suppress(psutil.Error, ValueError):
                            runner_rss += psutil.Process(int(row[col])).memory_info().rss
                    cg = cgroup_memory(c.id)
                    print(
                        f"idle warm container {c.name}: docker stats {(stats['usage'] - cache) / MiB:5.1f} MiB"
                        f" (usage {stats['usage'] / MiB:5.1f} incl. {cache / MiB:4.1f} page cache,"
                        f" limit {stats.get('limit', 0) / MiB:,.0f}); its processes' RSS {runner_rss / MiB:5.1f} MiB;"
                        " cgroup " + ", ".join(f"{k} {v / MiB:5.1f} MiB" for k, v in cg.items())
                    )
    finally:
        remove_install_containers(settings)
        db.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    settings = Settings.load(env_file=None)
    ensure_agent_image(docker_client(settings), settings)
    with tempfile.TemporaryDirectory() as tmp:
        measure(Path(tmp) / "cold", settings.sandbox.agent_image, args.runs, 0)
        measure(Path(tmp) / "warm", settings.sandbox.agent_image, args.runs, 300)


if __name__ == "__main__":
    main()
