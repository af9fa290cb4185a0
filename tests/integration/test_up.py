"""`orchestrator up`: one command runs worker, beat and API; a child that dies
is restarted; Ctrl-C stops everything it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request

import pytest

from tests.conftest import wait_until

from .conftest import BIN, Stack


def _children(pid: int) -> dict[int, str]:
    # -ww: without a terminal ps cuts args at 80 columns, which cut "-Q delivery"
    # off the deliverer's command line in a clone with a longer path.
    out = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    kids = {}
    for line in out.splitlines():
        p, _, args = line.strip().partition(" ")
        kids[int(p)] = args
    return kids


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_up_restarts_a_dead_child_and_stops_on_ctrl_c(stack: Stack) -> None:
    port = _free_port()
    log = stack.settings.data_dir.parent / "up.log"
    with open(log, "wb") as fh:
        up = subprocess.Popen(
            [str(BIN / "orchestrator"), "up", "--port", str(port), "--concurrency", "1"],
            env=stack.env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def health() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    return bool(json.load(r)["status"] == "ok")
            except OSError:
                return False

        wait_until(health, 60, "the API to answer /health")
        # The agent worker and, apart, the delivery worker (replies never wait for an agent slot),
        # each up (or restarted by the supervisor) within a few seconds.
        wait_until(
            lambda: sum(" worker " in a for a in _children(up.pid).values()) == 2,
            30,
            "the agent worker and the delivery worker",
            lambda: f"{_children(up.pid)}\n{log.read_text()[-4000:]}",
        )
        kids = _children(up.pid)
        workers = [p for p, a in kids.items() if " worker " in a and " -Q agent " in a]
        assert len(workers) == 1 and any(" beat " in a for a in kids.values()), kids
        assert any(" worker " in a and " -Q delivery " in a for a in kids.values()), kids
        os.kill(workers[0], signal.SIGKILL)
        wait_until(
            lambda: any(" -Q agent " in a and p != workers[0] for p, a in _children(up.pid).items()),
            30,
            "a new agent worker child",
        )
        res = stack.cli("send", "main@local", "$ echo after-restart", "--wait", "60")
        assert res.returncode == 0 and "after-restart" in res.stdout, res.stderr + log.read_text()
    finally:
        kids = _children(up.pid)
        os.killpg(up.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
        up.wait(timeout=40)
    assert up.returncode == 0
    wait_until(lambda: all(not os.path.exists(f"/proc/{p}") for p in kids), 10, "every child to exit")
