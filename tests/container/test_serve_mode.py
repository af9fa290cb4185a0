"""Warm mode: one runner process serves several runs on a unix socket, then idles out."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from runner_harness import make_input


def _run_on(path: Path, doc: dict[str, Any]) -> list[dict[str, Any]]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(path))
        conn.sendall(json.dumps(doc).encode() + b"\n")
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    return [json.loads(line) for line in data.decode().splitlines()]


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 10
    while not path.exists():
        assert time.monotonic() < deadline, "the runner never opened its socket"
        time.sleep(0.02)


def test_one_process_serves_runs_until_idle(tmp_path: Path) -> None:
    sock = tmp_path / "agent.sock"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_runner", "--serve", str(sock), "--idle-timeout", "1.5"],
        env={"AGENT_WORKSPACE": str(workspace), "PATH": "/usr/bin:/bin"},
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for(sock)
        first = _run_on(sock, make_input("$ echo one > f.txt && cat f.txt", run_id="r1"))
        assert [e["type"] for e in first] == ["tool_use", "tool_result", "assistant", "result"]
        assert first[1]["output"] == "one\n" and first[1]["exit_code"] == 0
        # same process, same workspace: the file is still there
        second = _run_on(sock, make_input("$ cat f.txt", run_id="r2"))
        assert second[1]["output"] == "one\n"
        bad = _run_on(sock, {"not": "an input"})
        assert [e["type"] for e in bad] == ["error"] and "invalid ContainerInput" in bad[0]["message"]
        third = _run_on(sock, make_input("hello", run_id="r3"))  # still serving after a bad input
        assert third[-1]["type"] == "result"
        assert proc.poll() is None
        assert proc.wait(timeout=10) == 0  # idle timeout
        assert not sock.exists()
        assert "exiting" in proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_standby_waits_longer_for_its_first_run_then_idles_out(tmp_path: Path) -> None:
    """``--standby S``: no group yet, so the first run is waited for ``S`` (not the idle
    time); the workspace it serves is whatever is at its path when the run comes (a
    standby's is bound in later: here, made after the runner started)."""
    sock = tmp_path / "sockets" / "agent.sock"
    workspace = tmp_path / "ws"
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_runner", "--serve", str(sock), "--standby", "60", "--idle-timeout", "1"],
        env={"AGENT_WORKSPACE": str(workspace), "PATH": "/usr/bin:/bin"},
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for(sock)
        time.sleep(2.5)  # past the idle timeout: a warm runner would have exited by now
        assert proc.poll() is None
        workspace.mkdir()
        (workspace / "bound.txt").write_text("the group's\n")
        first = _run_on(sock, make_input("$ cat bound.txt; pwd", run_id="r1"))
        assert first[1]["output"] == f"the group's\n{workspace}\n"
        assert proc.wait(timeout=10) == 0  # then the idle timeout counts
        assert "after 1 run(s)" in proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
