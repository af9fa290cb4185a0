"""The runner's fence: it stops once the host that handed it the run is gone
(``agent_runner/fence.py``), and only then."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from runner_harness import CONTAINER_DIR, make_input

from agent_runner.fence import EXIT_FENCED, HostWatch


def _watch(silence_s: float) -> tuple[HostWatch, int, list[str], threading.Event]:
    read_fd, write_fd = os.pipe()
    gone: list[str] = []
    called = threading.Event()

    def on_gone(why: str) -> None:
        gone.append(why)
        called.set()

    return HostWatch(read_fd, silence_s, on_gone).start(), write_fd, gone, called


def test_the_end_of_the_hosts_stream_mid_run_stops_the_run() -> None:
    watch, write_fd, gone, called = _watch(30.0)
    os.write(write_fd, b"\n")
    os.close(write_fd)  # the worker died: the kernel closed its end
    assert called.wait(5), "the watch did not see the host go"
    assert gone == ["its end of the run's stream was closed"]
    watch.close()


def test_a_silent_host_stops_the_run_and_beats_keep_it_going() -> None:
    watch, write_fd, gone, called = _watch(0.5)
    for _ in range(8):  # 1.6 s of beats, three times the silence allowed
        os.write(write_fd, b"\n")
        time.sleep(0.2)
    assert not called.is_set()
    assert called.wait(5) and gone == ["no word from it for 0.5s"]
    watch.close()
    os.close(write_fd)


def test_after_the_final_event_the_host_may_hang_up() -> None:
    watch, write_fd, gone, called = _watch(0.3)
    watch.finished()
    os.close(write_fd)
    time.sleep(0.8)  # the hang-up and a silence past the bound, both after the end
    assert not called.is_set() and gone == []
    watch.close()


def test_the_runner_stops_its_agent_when_stdin_ends_mid_run(workspace: Path) -> None:
    """The real runner, as the image runs it: a silent command, then the host's end of
    stdin closes (what a SIGKILLed worker's does): the runner exits at once with its
    fence's code.  (Its pid-1 kill of the rest is the container's: test_sandbox_fence.py.)"""
    doc = make_input("$ sleep 3; echo late > late.txt", host_fence_s=30.0)
    env = {
        **os.environ,
        "PYTHONPATH": str(CONTAINER_DIR),
        "AGENT_WORKSPACE": str(workspace),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_runner"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=workspace,
        start_new_session=True,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(doc).encode() + b"\n")
        proc.stdin.flush()
        first = json.loads(proc.stdout.readline())
        assert first["type"] == "tool_use", first  # the command runs
        t0 = time.monotonic()
        proc.stdin.close()
        code = proc.wait(timeout=10)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == EXIT_FENCED and elapsed < 2, (code, elapsed, proc.stderr.read().decode() if proc.stderr else "")
    assert "the host is gone" in (proc.stderr.read().decode() if proc.stderr else "")


def test_a_run_that_ends_exits_normally_with_its_stream_still_open(workspace: Path) -> None:
    doc = make_input("$ echo fine", host_fence_s=30.0)
    env = {
        **os.environ,
        "PYTHONPATH": str(CONTAINER_DIR),
        "AGENT_WORKSPACE": str(workspace),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_runner"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=workspace,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(doc).encode() + b"\n\n\n")  # the input, then beats; stdin left open
    proc.stdin.flush()
    code = proc.wait(timeout=15)
    events = [json.loads(line) for line in proc.stdout.read().decode().splitlines()]
    proc.stdin.close()
    assert code == 0 and events[-1]["type"] == "result", events


def test_a_watch_after_a_watch_runs_on_the_same_thread() -> None:
    """A warm runner's runs: the next run's watch starts on the thread the last one used
    (no thread start on the run's path), and still sees its own host go."""
    threads: list[threading.Thread] = []
    for _ in range(3):
        read_fd, write_fd = os.pipe()
        called = threading.Event()

        def on_gone(why: str, called: threading.Event = called) -> None:
            threads.append(threading.current_thread())
            called.set()

        watch = HostWatch(read_fd, 30.0, on_gone).start()
        os.close(write_fd)
        assert called.wait(5), "the watch did not see the host go"
        watch.close()
    assert len(threads) == 3 and all(t is threads[0] for t in threads), threads
