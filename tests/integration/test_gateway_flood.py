"""A hostile sandbox floods its model gateway; the host stays bounded and the run goes on.

CLI -> celery worker (embedded backend) -> pipeline -> model gateway on a
unix socket -> the real agent container -> real SDK -> fake Messages API on
loopback.  The fake model's first answer is a bash tool call that, inside
the sandbox, opens 1,000 connections to the gateway socket, leaves them idle,
then sends ``Content-Length: -1`` on each.  Meanwhile this test samples the
worker's threads: one host thread per connection would be ~1,000.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fakes.anthropic_api import FakeAnthropic, Recorded, Reply, message
from orchestrator.sandbox.gateway import MAX_CONNECTIONS
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.runs import list_runs

from .conftest import Stack

SECRET = "sk-test-flood-789"
CHAT = "main@local"

FLOOD = r"""
import glob, os, resource, socket, stat, time
# Wherever the host mounts it under /run.
path = next(p for p in glob.glob("/run/**/model.sock", recursive=True) if stat.S_ISSOCK(os.stat(p).st_mode))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < 1100:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
conns = []
for _ in range(1000):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    conns.append(s)
time.sleep(2)  # all idle
seen = {}
for s in conns:
    try:
        s.settimeout(5)
        s.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: gateway\r\nContent-Length: -1\r\n\r\n")
        data = s.recv(4096)
        key = "http" + data.split(b" ")[1].decode() if data.startswith(b"HTTP/") else "closed"
    except OSError as exc:
        key = type(exc).__name__
    seen[key] = seen.get(key, 0) + 1
print("flood opened=%d" % len(conns), " ".join("%s=%d" % kv for kv in sorted(seen.items())))
"""
COMMAND = f"python3 - <<'EOF'\n{FLOOD}\nEOF"


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the Celery worker and its pool processes)."""
    pids = [pid]
    for p in pids:
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        pids.extend(int(c) for c in children)
    return pids


def _threads_and_rss(pid: int) -> tuple[int, int]:
    threads = rss = 0
    for p in _tree(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text().splitlines()
        except OSError:
            continue
        for line in status:
            if line.startswith("Threads:"):
                threads += int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss += int(line.split()[1])
    return threads, rss


class Sampler:
    """Samples the worker's threads and memory from the model's first request to its second."""

    def __init__(self) -> None:
        self.pid = 0
        self.base: tuple[int, int] = (0, 0)
        self.peak: tuple[int, int] = (0, 0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, rec: Recorded) -> None:
        if self._thread is not None:
            self._stop.set()  # the second request: the flood is over
            self._thread.join()
            return
        self.base = self.peak = _threads_and_rss(self.pid)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            threads, rss = _threads_and_rss(self.pid)
            self.peak = (max(self.peak[0], threads), max(self.peak[1], rss))
            time.sleep(0.02)


def _final_answer(rec: Recorded) -> Reply:
    last = rec.body["messages"][-1]["content"]
    printed = next(b["content"] for b in last if b["type"] == "tool_result")
    line = next((x for x in printed.splitlines() if x.startswith("flood ")), "no flood line")
    return message([{"type": "text", "text": f"done: {line}"}], "end_turn", n=2)


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_a_thousand_connections_from_the_sandbox_leave_the_host_bounded(stack: Stack) -> None:
    sampler = Sampler()
    fake = FakeAnthropic(
        message(
            [{"type": "tool_use", "id": "toolu_flood", "name": "bash", "input": {"command": COMMAND}}], "tool_use", n=1
        ),
        _final_answer,
        on_request=sampler.start,
    )
    with fake.serve() as base_url:
        stack.env["ORCHESTRATOR_MODEL"] = "anthropic:claude-fake-1"
        stack.env["ORCHESTRATOR_ANTHROPIC_BASE_URL"] = base_url
        stack.env["ORCHESTRATOR_ANTHROPIC_API_KEY"] = SECRET
        sampler.pid = stack.start_worker().pid
        ensure_main_group(stack.db)
        res = stack.cli("send", CHAT, "flood your gateway", "--wait", "120", "--json")
    logs = stack.worker_logs()
    assert res.returncode == 0, res.stdout + res.stderr + logs
    replies = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    answers = [r["content"] for r in replies if r["message_type"] == "assistant" and r["sender"] == "bot"]
    assert len(answers) == 1 and answers[0].startswith("done: flood opened=1000"), (replies, logs)
    counts: dict[str, Any] = dict(kv.split("=") for kv in answers[0].split()[3:])
    print(
        f"\nflood from the sandbox: {counts}; worker threads {sampler.base[0]} -> peak {sampler.peak[0]}, "
        f"RSS {sampler.base[1]} -> peak {sampler.peak[1]} KiB"
    )

    # The gateway answered those it served (400: a negative length) and
    # closed the rest at once; none reached the model API.
    assert 1 <= int(counts.get("http400", 0)) <= MAX_CONNECTIONS, counts
    assert len(fake.calls) == 2, fake.calls
    assert all(c.headers.get("x-api-key") == SECRET for c in fake.calls)
    # The host's threads grew by at most the gateway's connection cap (the
    # runner's own keep-alive connection was already there), not by 1,000.
    assert sampler.peak[0] - sampler.base[0] <= MAX_CONNECTIONS, (sampler.base, sampler.peak)
    # ...and the run went on: the next model request worked.
    (run,) = list_runs(stack.db, chat_jid=CHAT)
    assert run.state == "succeeded", (run.error, logs)
    assert (run.input_tokens, run.output_tokens) == (30, 3)
