"""CLI start-up: how long the ``orchestrator`` command takes before it does
anything, against ``python -c pass`` (the interpreter's own floor) measured
in the same run.

    .venv/bin/python -m bench.cli [--runs N]

Rows, interleaved over N rounds so a busy machine slows them alike; each
figure is the median wall time and the median CPU time (user + system, from
``os.wait4``) of one whole process:

* ``python -c pass``: the floor;
* ``orchestrator --help``: target <= 0.25 s wall (issue 13);
* ``orchestrator send (in process)``: to an installation with no API and
  no worker running (the message stored in process, the group's signal
  published on the embedded broker): the whole command, signal included;
* ``orchestrator send (via the API)``: the same with the installation's API
  running (``orchestrator api``), which stores and signals: the CLI only
  POSTs (orchestrator/cli/send.py);
* ``... CPU until "stored"``: each send's CPU time (user + system, from
  ``/proc/PID/stat``) at the moment it prints "stored #N", i.e. once the
  message is committed and before any signal: target <= 0.5 s to a running
  installation (issue 13).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

BIN = Path(sys.executable).parent


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``argv`` (which must succeed)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed ({proc.returncode}): {err.decode(errors='replace')[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_until_stored(argv: list[str], env: dict[str, str]) -> float:
    """CPU seconds ``argv`` had used when it said "stored #N" (read from /proc as it says it)."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    cpu = None
    for line in proc.stderr:
        if cpu is None and line.startswith(b"stored #"):
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
    if proc.wait() != 0 or cpu is None:
        raise SystemExit(f"{argv} failed or never said 'stored' ({proc.returncode})")
    return cpu


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_api(cli: str, env: dict[str, str]) -> Iterator[str]:
    """``orchestrator api`` on a free loopback port; yields its URL."""
    port = _free_port()
    proc = subprocess.Popen(
        [cli, "api", "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the API did not start") from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
        env.update(
            ORCHESTRATOR_DATA_DIR=str(Path(tmp) / "data"),
            ORCHESTRATOR_WORKSPACE_QUOTA="0",
            ORCHESTRATOR_LOG_LEVEL="WARNING",
        )
        cli = str(BIN / "orchestrator")
        setup = subprocess.run(
            [cli, "groups", "add", "bench@local", "--name", "bench", "--folder", "bench", "--no-trigger"],
            env=env,
            capture_output=True,
            text=True,
        )
        if setup.returncode != 0:
            raise SystemExit(setup.stderr)
        with running_api(cli, env) as url:
            # The in-process row must not find the API: it is named to the other row only.
            (Path(env["ORCHESTRATOR_DATA_DIR"]) / "api.json").unlink()
            via_api = dict(env, ORCHESTRATOR_API_URL=url)
            rows: dict[str, tuple[list[str], dict[str, str]]] = {
                "python -c pass": ([sys.executable, "-c", "pass"], env),
                "orchestrator --help": ([cli, "--help"], env),
                "orchestrator send (in process)": ([cli, "send", "bench@local", "hello"], env),
                "orchestrator send (via the API)": ([cli, "send", "bench@local", "hello"], via_api),
            }
            sends = [name for name in rows if name.startswith("orchestrator send")]
            walls: dict[str, list[float]] = {name: [] for name in rows}
            cpus: dict[str, list[float]] = {name: [] for name in rows}
            for cmd, cmd_env in rows.values():  # one warm-up each (page cache, .pyc)
                timed(cmd, cmd_env)
            before_stored: dict[str, list[float]] = {name: [] for name in sends}
            for _ in range(args.runs):
                for name, (cmd, cmd_env) in rows.items():
                    wall, cpu = timed(cmd, cmd_env)
                    walls[name].append(wall)
                    cpus[name].append(cpu)
                for name in sends:
                    before_stored[name].append(cpu_until_stored(*rows[name]))
    floor = statistics.median(walls["python -c pass"])
    print(f"{'command':34} {'wall p50':>9} {'cpu p50':>9} {'wall / floor':>13}   (n={args.runs})")
    for name in rows:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        print(f"{name:34} {wall * 1000:7.0f}ms {cpu * 1000:7.0f}ms {wall / floor:12.1f}x")
    for name in sends:
        stored = statistics.median(before_stored[name])
        label = f'... CPU until "stored" ({name.split("(")[1]}'
        target = "target <= 500 ms: " + ("met" if stored <= 0.5 else "MISSED") if "API" in name else "no target"
        print(f"{label:34} {'':>9} {stored * 1000:7.0f}ms   ({target})")


if __name__ == "__main__":
    main()
