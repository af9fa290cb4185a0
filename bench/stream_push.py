"""Pushed streams: a change stored -> seen on an open ``/api/chats/{jid}/stream``, pushed
and polled, and what an idle stream costs the database, in the same command:

    .venv/bin/python -m bench.stream_push [--deltas N] [--interval S] [--idle-s S] [--pg URL]

Two modes of the same code, each with the API in a process of its own (uvicorn, as
``orchestrator api`` serves it):

* ``poll`` (the baseline): ``ORCHESTRATOR_STREAM_WAKEUP=poll`` and a look every 0.2 s
  (``ORCHESTRATOR_STREAM_SAFETY_POLL_S=0.2``): what the stream did before it was woken;
* ``push`` (the default): ``ORCHESTRATOR_STREAM_WAKEUP=push``, the 2 s safety poll.

This process plays the worker, on a connection of its own: a running run's draft grows by
a word ``--deltas`` times, every ``--interval`` seconds on average (jittered, so that
the writes do not keep step with the baseline's looks), through ``save_draft``, the
worker's own call; then as many messages are stored (``store_message_direct``).  Each is
timed from the moment the call returned (committed) to the arrival of its event (the
draft's ``offset`` + text reaching the new length, with ``drafts=append``; the message's
id) on the HTTP stream, read in a thread as a browser would.

The page: the same draft deltas shown by the web page (``orchestrator/http/web/app.js``)
in headless Chromium (the system's, driven by Playwright, as tests/host/test_web_page.py
does; skipped with a note where there is none, or with ``--no-browser``), timed from the
commit to the page's DOM holding the new text (a MutationObserver's time, on the same
clock as this process's; the paint follows within a frame).

Idle: the statements the API process sends to the database in ``--idle-s`` seconds, with
no stream open and then with one stream open on a quiet chat (SQLite: every statement
the driver runs, BEGIN and COMMIT included, by its trace callback; PostgreSQL: every
statement and transaction end, ``bench/query_counts.py``); the stream's share is the
difference.  Embedded stack (SQLite) always; with ``--pg`` PostgreSQL too (a fresh
database, dropped after).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common import ROOT, fresh_pg_database, pct
from orchestrator.core.settings import Settings
from orchestrator.store.db import Database
from orchestrator.store.drafts import save_draft
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import now_iso, store_message_direct
from orchestrator.store.runs import create_run, finish_run, set_container

MODES = {"poll": {"stream_wakeup": "poll", "stream_safety_poll_s": "0.2"}, "push": {"stream_wakeup": "push"}}
COUNT_EVERY_S = 0.1  # how often the API process writes its statement count


class StreamLog:
    """One chat's event stream over HTTP, read in a thread: (arrival, event, data) of each event."""

    def __init__(self, url: str) -> None:
        self.events: list[tuple[float, str, dict[str, Any]]] = []
        self.cond = threading.Condition()
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
                        with self.cond:
                            self.events.append((time.perf_counter(), event, parsed))
                            self.cond.notify_all()
                    event, data = "message", []
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))

    def wait(self, match: Any, timeout: float = 30) -> float:
        """The arrival time of the first event ``match(event, data)`` accepts."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for arrived, event, data in self.events:
                    if match(event, data):
                        return arrived
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no matching event on the stream")
                self.cond.wait(left)

    def close(self) -> None:
        self._client.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the API process ----------------------------------------------------------------


def _serve_api(port: int, counts: Path) -> None:
    """The API (as ``orchestrator api`` serves it) counting the statements it sends."""
    import uvicorn
    from sqlalchemy import event
    from sqlalchemy.pool import Pool

    from bench import query_counts
    from orchestrator.http.api import create_app
    from orchestrator.root import Orchestrator

    sqlite_statements = [0]

    def _trace(_sql: str) -> None:
        sqlite_statements[0] += 1

    @event.listens_for(Pool, "connect")
    def _count(dbapi_conn: Any, _record: Any) -> None:
        if hasattr(dbapi_conn, "set_trace_callback"):  # sqlite3's
            dbapi_conn.set_trace_callback(_trace)

    query_counts.install()

    def write() -> None:
        while True:
            total = sqlite_statements[0] + sum(int(n) for n, _ in query_counts.snapshot().values())
            tmp = counts.with_suffix(".tmp")
            tmp.write_text(str(total))
            os.replace(tmp, counts)
            time.sleep(COUNT_EVERY_S)

    threading.Thread(target=write, daemon=True).start()
    app = create_app(Orchestrator(Settings.load(env_file=None)))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1)


@contextlib.contextmanager
def api_process(settings: Settings, mode: str) -> Iterator[tuple[str, Path]]:
    port = _free_port()
    counts = settings.data_dir / f"api-{mode}.count"
    env = {
        **os.environ,
        "ORCHESTRATOR_DATA_DIR": str(settings.data_dir),
        "ORCHESTRATOR_DATABASE_URL": settings.database_url,
        "ORCHESTRATOR_LOG_LEVEL": "WARNING",
        **{f"ORCHESTRATOR_{k.upper()}": v for k, v in MODES[mode].items()},
    }
    log = open(settings.data_dir / f"api-{mode}.log", "wb")  # closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.stream_push", "--serve-api", str(port), "--counts", str(counts)],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                    if r.status == 200 and counts.exists():
                        break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the API did not start: {(settings.data_dir / f'api-{mode}.log').read_text()}")
            time.sleep(0.05)
        yield url, counts
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _count(counts: Path) -> int:
    return int(counts.read_text())


# -- one mode -----------------------------------------------------------------------


def idle_rates(db: Database, url: str, counts: Path, chat: str, idle_s: float) -> tuple[float, float]:
    """Statements a second the API sends with no stream open, and with one open on a quiet chat."""
    time.sleep(1.0)  # start-up's reads are over
    before = _count(counts)
    time.sleep(idle_s)
    alone = (_count(counts) - before) / idle_s
    add_group(db, chat_jid=chat, name=chat, folder=chat.split("@")[0], requires_trigger=False)
    stream = StreamLog(f"{url}/api/chats/{chat}/stream?drafts=append")
    try:
        time.sleep(1.0)  # its first look and the listener's start are over
        before = _count(counts)
        time.sleep(idle_s)
        with_stream = (_count(counts) - before) / idle_s
    finally:
        stream.close()
    return alone, with_stream


def latencies(db: Database, url: str, chat: str, n: int, interval: float) -> tuple[list[float], list[float]]:
    """Seconds from stored to seen: ``n`` draft deltas, then ``n`` messages."""
    rng = random.Random(37)
    add_group(db, chat_jid=chat, name=chat, folder=chat.split("@")[0], requires_trigger=False)
    stream = StreamLog(f"{url}/api/chats/{chat}/stream?drafts=append")
    drafts: list[float] = []
    messages: list[float] = []
    try:
        run = create_run(db, chat_jid=chat, cursor_from=0, cursor_to=0, celery_task_id=None)
        set_container(db, run.id, "bench")
        stream.wait(lambda e, d: e == "run" and d["id"] == run.id and d["state"] == "running")
        text = ""
        for version in range(1, n + 1):
            time.sleep(rng.uniform(0.5, 1.5) * interval)
            text += f"word{version} "
            length = len(text)
            save_draft(db, run.id, chat, text, version)
            stored = time.perf_counter()
            seen = stream.wait(lambda e, d, length=length: e == "draft" and d["offset"] + len(d["text"]) == length)
            drafts.append(seen - stored)
        finish_run(db, run.id, state="succeeded")
        for i in range(n):
            time.sleep(rng.uniform(0.5, 1.5) * interval)
            mid = f"bench-{i}"
            store_message_direct(
                db=db, id=mid, chat_jid=chat, sender="u", sender_name="u", content="hi", timestamp=now_iso()
            )
            stored = time.perf_counter()
            seen = stream.wait(lambda e, d, mid=mid: e == "message" and d["id"] == mid)
            messages.append(seen - stored)
    finally:
        stream.close()
    return drafts, messages


_OBSERVE = """() => {
  window.__seen = [];
  new MutationObserver(() => {
    const t = document.querySelector("article.msg-draft .text");
    if (t) window.__seen.push([performance.timeOrigin + performance.now(), t.textContent.length]);
  }).observe(document.getElementById("messages"), {subtree: true, childList: true, characterData: true});
}"""


def page_latencies(page: Any, db: Database, url: str, chat: str, n: int, interval: float) -> list[float]:
    """Seconds from a draft delta stored to the web page's DOM showing it, ``n`` deltas."""
    rng = random.Random(38)
    add_group(db, chat_jid=chat, name=chat, folder=chat.split("@")[0], requires_trigger=False)
    page.goto(f"{url}/#chat_jid={chat}")
    page.wait_for_selector("#conn[data-state='live']")
    page.evaluate(_OBSERVE)
    run = create_run(db, chat_jid=chat, cursor_from=0, cursor_to=0, celery_task_id=None)
    set_container(db, run.id, "bench")
    page.wait_for_selector("#run-status[data-state='running']")
    text, seen = "", []
    for version in range(1, n + 1):
        time.sleep(rng.uniform(0.5, 1.5) * interval)
        text += f"word{version} "  # ASCII: the DOM's UTF-16 length is the text's
        save_draft(db, run.id, chat, text, version)
        stored = time.time()
        shown = page.wait_for_function(
            "n => (window.__seen.find(([, len]) => len >= n) || [null])[0]", arg=len(text), polling=2, timeout=30_000
        ).json_value()
        seen.append(shown / 1000 - stored)
    finish_run(db, run.id, state="succeeded")
    return seen


@contextlib.contextmanager
def chromium(wanted: bool) -> Iterator[Any]:
    """A headless Chromium page (None: not wanted, or no Chromium or Playwright here)."""
    from tests.web_browser import chromium_path

    path = chromium_path() if wanted else None
    if path is None:
        if wanted:
            print("(no Chromium here: the page is not timed)")
        yield None
        return
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("(no Playwright here: the page is not timed)")
        yield None
        return
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, chromium_sandbox=False)
        try:
            yield browser
        finally:
            browser.close()


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:7.1f}ms"


def measure(backend: str, database_url: str, args: argparse.Namespace, browser: Any) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-stream-push-") as tmp:
        settings = Settings.load(data_dir=Path(tmp) / "data", database_url=database_url, env_file=None)
        settings.ensure_dirs()
        db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
        db.migrate()
        try:
            for mode in MODES:
                with api_process(settings, mode) as (url, counts):
                    alone, with_stream = idle_rates(db, url, counts, f"idle-{mode}@local", args.idle_s)
                    drafts, messages = latencies(db, url, f"live-{mode}@local", args.deltas, args.interval)
                    shown: list[float] = []
                    if browser is not None:
                        context = browser.new_context()
                        try:
                            page = context.new_page()
                            shown = page_latencies(page, db, url, f"page-{mode}@local", args.deltas, args.interval)
                        finally:
                            context.close()
                results[mode] = {
                    "alone": alone,
                    "stream": with_stream,
                    "drafts": drafts,
                    "messages": messages,
                    "page": shown,
                }
                r = results[mode]
                name = "poll every 0.2 s (baseline)" if mode == "poll" else "push (2 s safety poll)"
                print(
                    f"{backend:<11} {name:<29} draft p50 {_ms(pct(drafts, 50))} p95 {_ms(pct(drafts, 95))}   "
                    f"message p50 {_ms(pct(messages, 50))} p95 {_ms(pct(messages, 95))}   "
                    f"idle stream {r['stream'] - r['alone']:6.2f} q/s (API alone {r['alone']:.2f} q/s)",
                    flush=True,
                )
                if shown:
                    print(
                        f"{'':<11} {'  the page (Chromium DOM)':<29} draft p50 {_ms(pct(shown, 50))} "
                        f"p95 {_ms(pct(shown, 95))}",
                        flush=True,
                    )
        finally:
            db.dispose()
    poll, push = results["poll"], results["push"]
    idle_poll, idle_push = poll["stream"] - poll["alone"], push["stream"] - push["alone"]
    print(
        f"{backend}: poll / push: draft p50 {pct(poll['drafts'], 50) / pct(push['drafts'], 50):.1f}x, "
        f"p95 {pct(poll['drafts'], 95) / pct(push['drafts'], 95):.1f}x; "
        f"message p50 {pct(poll['messages'], 50) / pct(push['messages'], 50):.1f}x; "
        + (
            f"idle stream queries {idle_poll / idle_push:.1f}x"
            if idle_push > 0
            else f"idle stream queries {idle_poll:.2f}/s against none counted in {args.idle_s:g} s"
        )
        + (f"; the page's draft p50 {pct(poll['page'], 50) / pct(push['page'], 50):.1f}x" if push["page"] else ""),
        flush=True,
    )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--deltas", type=int, default=200, help="draft deltas (and messages) timed per mode")
    parser.add_argument("--interval", type=float, default=0.1, help="mean seconds between two of them")
    parser.add_argument("--idle-s", type=float, default=10.0, help="seconds an idle stream is counted")
    parser.add_argument("--no-browser", action="store_true", help="do not time the web page in Chromium")
    parser.add_argument("--pg", default="", help="a PostgreSQL server (a role that may create databases)")
    parser.add_argument("--serve-api", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--counts", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_api:
        _serve_api(args.serve_api, Path(args.counts))
        return
    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs ({_cpu_model()}), Python "
        f"{platform.python_version()}, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"stored -> seen on an open /api/chats/{{jid}}/stream (drafts=append), n={args.deltas} per mode, "
        f"one every ~{args.interval:g} s; idle: statements a second the API sends for one open quiet stream "
        f"({args.idle_s:g} s)"
    )
    with chromium(not args.no_browser) as browser:
        measure("sqlite", "", args, browser)
        if args.pg:
            with fresh_pg_database(args.pg) as url:
                measure("postgresql", url, args, browser)


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


if __name__ == "__main__":
    main()
