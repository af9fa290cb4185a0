"""Streamed replies: time to the first visible text against time to the stored message.

The model is the fake Messages API (``fakes/anthropic_api.py``, the
streaming wire format), pacing its answer: ``--words`` words, ``--word-delay``
seconds apart (after ``--first-delay`` before the first, the model's time to
its first token).  Everything else is the real path: a ``celery worker``
process (as ``orchestrator up`` starts it), the model gateway on its unix
socket, the agent container (cold; ``--warm`` keeps one warm), the draft
written to the database, and ``orchestrator api``'s event stream read over
HTTP as the web page reads it.  For each of ``--runs`` messages, from the
moment it is posted to the API:

* first text: the first ``draft`` event with text on the stream;
* stored: the reply's ``message`` event;

and the number of ``draft`` events in between.  Before streaming, the first
text a person saw was the stored reply; the difference is what streaming
gives.  Embedded stack (SQLite + filesystem://); with ``--pg`` and
``--redis`` the fleet stack too (PostgreSQL + Redis; the Redis database is
flushed).

    .venv/bin/python -m bench.streaming [--runs 5] [--words 40] [--word-delay 0.1] [--warm] [--pg URL --redis URL]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.common import (
    ROOT,
    Extra,
    flush_broker,
    install,
    pct,
    process_logs,
    remove_install_containers,
    stacks,
    stop_processes,
    wait_for,
    worker_env,
)
from fakes.anthropic_api import FakeAnthropic, message, paced
from orchestrator.cli.supervisor import worker_argv
from orchestrator.core.settings import Settings
from orchestrator.http.endpoint import CLIENT_HEADER
from orchestrator.sandbox.containers import docker_client
from orchestrator.sandbox.image import ensure_agent_image
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import FINAL_STATES, list_runs

CHAT = "main@local"
BIN = Path(sys.executable).parent


@dataclass
class Timing:
    first_text: float  # s from the post to the first draft event with text
    stored: float  # s from the post to the stored reply's message event
    drafts: int  # draft events with text before the reply


class StreamLog:
    """The chat's event stream over HTTP, read in a thread: (arrival, event, data)."""

    def __init__(self, url: str) -> None:
        self.events: list[tuple[float, str, dict[str, object]]] = []
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=httpx.Timeout(10, read=None))
        self._cm = self._client.stream("GET", url)
        self._response = self._cm.__enter__()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        event, data = "message", []
        with contextlib.suppress(httpx.HTTPError):
            for line in self._response.iter_lines():
                if line == "":
                    if data:
                        parsed = json.loads("\n".join(data))
                        with self._lock:
                            self.events.append((time.monotonic(), event, parsed))
                    event, data = "message", []
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))

    def since(self, t0: float) -> list[tuple[float, str, dict[str, object]]]:
        with self._lock:
            return [e for e in self.events if e[0] >= t0]

    def close(self) -> None:
        self._client.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def processes(settings: Settings, env: dict[str, str]) -> Iterator[str]:
    """One worker (one slot) and the API; yields the API's base URL."""
    logs = settings.data_dir / "logs"
    logs.mkdir(exist_ok=True)
    port = _free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with open(logs / "worker.log", "ab") as fh:
            procs.append(
                subprocess.Popen(
                    worker_argv(1, "WARNING", name="streaming@%h"),
                    env=env,
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=fh,
                )
            )
        with open(logs / "api.log", "ab") as fh:
            procs.append(
                subprocess.Popen(
                    [str(BIN / "orchestrator"), "api", "--port", str(port)],
                    env=env,
                    cwd=ROOT,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                )
            )
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_for(healthy, 60, "the API to answer /health", settings, poll=0.2)
        yield url
    finally:
        stop_processes(procs)


def measure(data_dir: Path, image: str, extra: Extra, args: argparse.Namespace) -> list[Timing]:
    reply = message(
        [{"type": "text", "text": " ".join(f"word{i}" for i in range(args.words))}], "end_turn", n=args.words
    )
    # One more than timed: the first run is not timed (the worker's imports, the first container).
    fake = FakeAnthropic(*[paced(reply, args.word_delay, args.first_delay)] * (args.runs + 1))
    timings: list[Timing] = []
    with extra() as more, fake.serve() as base_url:
        settings, db = install(data_dir, image, warm_idle_s=300 if args.warm else 0, **more)
        flush_broker(settings)
        ensure_main_group(db)
        env = worker_env(settings) | {
            "ORCHESTRATOR_MODEL": "anthropic:claude-fake-1",
            "ORCHESTRATOR_ANTHROPIC_BASE_URL": base_url,
            "ORCHESTRATOR_ANTHROPIC_API_KEY": "bench-streaming-key",
            "ORCHESTRATOR_LOG_LEVEL": "WARNING",
        }
        env["NO_PROXY"] = env["no_proxy"] = ",".join(filter(None, [env.get("NO_PROXY", ""), "127.0.0.1"]))
        try:
            with processes(settings, env) as api:
                stream = StreamLog(f"{api}/api/chats/{CHAT}/stream?after=0")
                try:
                    for i in range(args.runs + 1):
                        t0 = time.monotonic()
                        posted = httpx.post(
                            f"{api}/api/messages",
                            json={"chat_jid": CHAT, "sender": "bench", "content": f"talk {i}"},
                            headers={CLIENT_HEADER: "bench"},
                        )
                        posted.raise_for_status()

                        def replied(t0: float = t0) -> bool:
                            return any(e == "message" and d.get("sender") == "bot" for _, e, d in stream.since(t0))

                        wait_for(replied, 180, f"the reply to message {i}", settings)
                        events = stream.since(t0)
                        stored = next(t for t, e, d in events if e == "message" and d.get("sender") == "bot")
                        texts = [t for t, e, d in events if e == "draft" and d.get("text") and t <= stored]
                        if not texts:
                            seen = [
                                (round(t - t0, 2), e, d.get("state") or d.get("sender") or d.get("text", "")[:20])
                                for t, e, d in events
                            ]
                            sent = [
                                (c.body or {}).get("stream") if isinstance(c.body, dict) else None for c in fake.calls
                            ]
                            runs = [(r.state, r.started_at, r.finished_at) for r in list_runs(db, chat_jid=CHAT)]
                            raise SystemExit(
                                f"no draft before the reply to message {i}: {seen}; requests asking "
                                f"for a stream: {sent}; runs: {runs}; logs:\n{process_logs(settings)}"
                            )
                        if i:
                            timings.append(Timing(texts[0] - t0, stored - t0, len(texts)))
                        # The run's end: the next message starts a run of its own.
                        wait_for(
                            lambda: all(r.state in FINAL_STATES for r in list_runs(db, chat_jid=CHAT)),
                            60,
                            f"the run of message {i} to end",
                            settings,
                            poll=0.05,
                        )
                finally:
                    stream.close()
            replies = [m for m in get_messages_after(CHAT, 0, db=db) if m.sender == "bot"]
            if len(replies) != args.runs + 1:
                raise SystemExit(f"{len(replies)} replies stored for {args.runs + 1} messages")
        finally:
            remove_install_containers(settings)
            db.dispose()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--words", type=int, default=40)
    parser.add_argument("--word-delay", type=float, default=0.1, help="seconds between two words")
    parser.add_argument("--first-delay", type=float, default=0.5, help="seconds before the first word")
    parser.add_argument("--warm", action="store_true", help="keep the group's container warm")
    parser.add_argument("--pg", default="", help="PostgreSQL URL (a fresh database is made from it)")
    parser.add_argument("--redis", default="", help="Redis broker URL (its database is flushed)")
    args = parser.parse_args()

    settings = Settings.load(env_file=None)
    ensure_agent_image(docker_client(settings), settings)
    writing = args.first_delay + (args.words - 1) * args.word_delay
    print(
        f"fake model: first word after {args.first_delay:g} s, {args.words} words {args.word_delay:g} s apart "
        f"({writing:.1f} s of writing); {'warm' if args.warm else 'cold'} container; {args.runs} runs"
    )
    for label, extra in stacks(args.pg, args.redis):
        with tempfile.TemporaryDirectory(prefix="bench-streaming-") as tmp:
            timings = measure(Path(tmp) / "data", settings.sandbox.agent_image, extra, args)
        first = [t.first_text for t in timings]
        stored = [t.stored for t in timings]
        gain = [t.stored - t.first_text for t in timings]
        print(f"{label}:")
        print(f"  first visible text  p50 {pct(first, 50):6.2f} s  max {max(first):6.2f} s")
        print(f"  stored message      p50 {pct(stored, 50):6.2f} s  max {max(stored):6.2f} s")
        print(
            f"  text seen earlier   p50 {pct(gain, 50):6.2f} s  (median draft events per reply: "
            f"{statistics.median(t.drafts for t in timings):.0f})"
        )


if __name__ == "__main__":
    main()
