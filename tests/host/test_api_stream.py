"""The chat event stream (SSE) against a real uvicorn server on loopback and a real database."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from orchestrator.cli.supervisor import api_argv
from orchestrator.core.settings import Settings
from orchestrator.http import stream as stream_module
from orchestrator.http.api import create_app
from orchestrator.http.endpoint import CLIENT_HEADER
from orchestrator.http.stream import ChatStream
from orchestrator.model.views import REPLY_TO_KEY
from orchestrator.root import Orchestrator
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import now_iso, store_message_direct
from orchestrator.store.runs import create_run, finish_run, park_run, set_container
from tests.live_server import serve

JID = "live@local"
# What this API's clients send with a change while no token is set (orchestrator/http/guards.py).
CLIENT = {CLIENT_HEADER: "tests"}
TOKEN = "stream-token-123"


@dataclass
class Event:
    event: str
    data: str
    id: str | None

    @property
    def json(self) -> Any:
        return json.loads(self.data)


class EventReader:
    """Reads a text/event-stream response in a thread; events queue up for the test."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.events: queue.Queue[Event] = queue.Queue()
        self.comments: list[str] = []
        self.ended = threading.Event()  # the body is over: the server ended it, or the test closed it
        self.error: Exception | None = None  # why reading stopped, if not at the body's proper end
        self._client = httpx.Client(timeout=httpx.Timeout(10, read=None))
        self._cm = self._client.stream("GET", url, headers=headers or {})
        self.response = self._cm.__enter__()
        self._thread = threading.Thread(target=self._read, daemon=True)
        if self.response.status_code == 200:
            self._thread.start()

    def _read(self) -> None:
        event, data, last_id = "message", [], None
        try:
            for line in self.response.iter_lines():
                if line == "":
                    if data:
                        self.events.put(Event(event, "\n".join(data), last_id))
                    event, data, last_id = "message", [], None
                elif line.startswith(":"):
                    self.comments.append(line)
                else:
                    field, _, value = line.partition(":")
                    value = value.removeprefix(" ")
                    if field == "event":
                        event = value
                    elif field == "data":
                        data.append(value)
                    elif field == "id":
                        last_id = value
        except (httpx.HTTPError, RuntimeError) as exc:
            self.error = exc  # closed by the test, or the body was cut short
        finally:
            self.ended.set()

    def next(self, timeout: float = 10) -> Event:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no event within {timeout}s") from None

    def until(self, pred: Callable[[Event], bool], timeout: float = 10) -> tuple[Event, list[Event]]:
        """The first event matching ``pred`` and the ones skipped before it."""
        skipped: list[Event] = []
        deadline = time.monotonic() + timeout
        while True:
            ev = self.next(max(0.01, deadline - time.monotonic()))
            if pred(ev):
                return ev, skipped
            skipped.append(ev)

    def quiet(self, seconds: float) -> list[Event]:
        """Whatever arrives within ``seconds`` (expected: nothing)."""
        time.sleep(seconds)
        out = []
        while not self.events.empty():
            out.append(self.events.get_nowait())
        return out

    def close(self) -> None:
        # Shut the socket down first: closed under the reading thread (blocked in recv) it would
        # send no FIN, and the server would never see this client go.
        stream = self.response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.response.close()
        self._client.close()


def _msg(db: Database, mid: str, content: str, **extra: Any) -> Any:
    fields = {"sender": "u1", "sender_name": "Ann", "is_from_me": False, "message_type": "user", **extra}
    return store_message_direct(db=db, id=mid, chat_jid=JID, content=content, timestamp=now_iso(), **fields)


@pytest.fixture
def base_url(db: Database, settings: Settings) -> Iterator[str]:
    add_group(db, chat_jid=JID, name="Live", folder="live", requires_trigger=False)
    with serve(create_app(Orchestrator(settings))) as url:
        yield url


@pytest.fixture
def open_stream(base_url: str) -> Iterator[Callable[..., EventReader]]:
    readers: list[EventReader] = []

    def opener(query: str = "", headers: dict[str, str] | None = None) -> EventReader:
        reader = EventReader(f"{base_url}/api/chats/{JID}/stream{query}", headers)
        readers.append(reader)
        return reader

    yield opener
    for r in readers:
        r.close()


def test_new_messages_and_run_states_arrive_live(
    db: Database, base_url: str, open_stream: Callable[..., EventReader]
) -> None:
    first = _msg(db, "m1", "before the stream opened")
    events = open_stream("?after=0")
    assert events.response.status_code == 200
    assert events.response.headers["content-type"].startswith("text/event-stream")
    ev = events.next()
    assert (ev.event, ev.id, ev.json["id"], ev.json["seq"]) == ("message", str(first.seq), "m1", first.seq)

    run = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=first.seq, celery_task_id=None)
    ev = events.next()
    assert ev.event == "run" and ev.id is None and (ev.json["id"], ev.json["state"]) == (run.id, "queued")
    set_container(db, run.id, "c0ffee")
    assert events.next().json["state"] == "running"

    sent = time.monotonic()
    posted = httpx.post(
        f"{base_url}/api/messages", json={"chat_jid": JID, "sender": "u2", "content": "over HTTP"}, headers=CLIENT
    )
    assert posted.status_code == 201
    ev = events.next()
    latency = time.monotonic() - sent
    assert ev.event == "message" and ev.json == posted.json()["message"]
    assert latency < 2.0, latency

    reply = _msg(db, "a1", "the answer", sender="bot", sender_name="Andy", is_from_me=True, message_type="assistant")
    host = _msg(db, "h1", "a note for people", sender="host", sender_name="host", is_from_me=True, message_type="host")
    got = [events.next(), events.next()]
    assert [(e.event, e.json["id"], e.json["message_type"]) for e in got] == [
        ("message", "a1", "assistant"),
        ("message", "h1", "host"),
    ]
    assert [int(e.id or 0) for e in got] == [reply.seq, host.seq]

    park_run(
        db,
        run.id,
        attempts=2,
        error="model error, retrying",
        retry_at=datetime.now(UTC),
        input_tokens=0,
        output_tokens=0,
    )
    ev = events.next()
    assert (ev.json["state"], ev.json["attempts"]) == ("queued", 2)
    finish_run(db, run.id, state="succeeded", output_tokens=7)
    ev = events.next()
    assert (ev.event, ev.json["state"], ev.json["output_tokens"]) == ("run", "succeeded", 7)

    # A run that starts and fails between two looks is still reported.
    fast = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=first.seq, celery_task_id=None)
    finish_run(db, fast.id, state="failed", error="boom")
    ev, skipped = events.until(lambda e: e.event == "run" and e.json["state"] == "failed")
    assert ev.json["id"] == fast.id and ev.json["error"] == "boom"
    assert all(e.json["id"] == fast.id for e in skipped)
    # Other chats' messages never show up; nothing is sent twice.
    store_message_direct(db=db, id="x", chat_jid="other@local", sender="u", content="elsewhere", timestamp=now_iso())
    assert events.quiet(0.8) == []


def test_cursor_and_last_event_id(db: Database, open_stream: Callable[..., EventReader]) -> None:
    seqs = [_msg(db, f"m{i}", f"message {i}").seq for i in range(5)]
    run = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=seqs[-1], celery_task_id=None)
    finish_run(db, run.id, state="succeeded")

    events = open_stream(f"?after={seqs[2]}")
    first = events.next()
    assert first.event == "run" and first.json["state"] == "succeeded"  # the newest run, when the stream opens
    assert [events.next().json["seq"] for _ in range(2)] == seqs[3:]
    # EventSource reconnects with Last-Event-ID: it wins over the URL's cursor.
    again = open_stream("?after=0", headers={"Last-Event-ID": str(seqs[3])})
    got = [e for e in (again.next(), again.next()) if e.event == "message"]
    assert [e.json["seq"] for e in got] == seqs[4:]
    assert open_stream("?after=-1").response.status_code == 400
    assert open_stream("", headers={"Last-Event-ID": "abc"}).response.status_code == 400


def test_a_long_history_arrives_whole_a_page_at_a_time(
    db: Database, open_stream: Callable[..., EventReader], monkeypatch: pytest.MonkeyPatch
) -> None:
    """More pages than one, and a message stored while the stream is still paging:
    every message once, in seq order, with no poll interval between pages."""
    monkeypatch.setattr(stream_module, "PAGE", 20)
    seqs = [_msg(db, f"m{i}", f"message {i}").seq for i in range(95)]
    events = open_stream("?after=0")
    got = [events.next().json["seq"] for _ in range(50)]
    seqs.append(_msg(db, "late", "stored while paging").seq)
    got += [events.next().json["seq"] for _ in range(46)]
    assert got == seqs


def test_history_changes_reset_the_view(db: Database, base_url: str, open_stream: Callable[..., EventReader]) -> None:
    q = _msg(db, "q1", "@Andy first")
    run = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=q.seq, celery_task_id=None)
    a = _msg(
        db,
        "a1",
        "answer",
        sender="bot",
        sender_name="Andy",
        is_from_me=True,
        message_type="assistant",
        metadata={REPLY_TO_KEY: q.seq, "run_id": run.id},
    )
    finish_run(db, run.id, state="succeeded")
    events = open_stream()
    events.until(lambda e: e.event == "message" and e.json["id"] == "a1")

    r = httpx.post(
        f"{base_url}/api/chats/{JID}/messages/q1/edit", json={"content": "@Andy first, edited"}, headers=CLIENT
    )
    assert r.status_code == 200
    ev, _ = events.until(lambda e: e.event == "reset", timeout=5)
    assert ev.json == {"reason": "history changed"}
    resent = [events.next(), events.next()]
    assert [(e.json["id"], e.json["content"]) for e in resent] == [("q1", "@Andy first, edited"), ("a1", "answer")]
    assert resent[0].json["edited_at"]

    r = httpx.post(f"{base_url}/api/chats/{JID}/messages/{a.id}/regenerate", headers=CLIENT)
    assert r.status_code == 200 and r.json()["superseded"] == [a.seq]
    events.until(lambda e: e.event == "reset", timeout=5)
    ev = events.next()
    assert ev.json["id"] == "q1"
    assert [e for e in events.quiet(0.6) if e.event == "message"] == []  # the superseded reply is gone


def test_stream_needs_the_token_when_one_is_set(db: Database, settings: Settings) -> None:
    add_group(db, chat_jid=JID, name="Live", folder="live")
    _msg(db, "m1", "hello")
    with serve(create_app(Orchestrator(settings.replace(**{"api_token": TOKEN})))) as url:
        target = f"{url}/api/chats/{JID}/stream"
        assert httpx.get(target).status_code == 401
        assert httpx.get(target, headers={"Authorization": "Bearer nope"}).status_code == 401
        reader = EventReader(target, {"Authorization": f"Bearer {TOKEN}"})
        try:
            assert reader.response.status_code == 200 and reader.next().json["id"] == "m1"
        finally:
            reader.close()


def test_idle_stream_sends_keepalives(
    db: Database, open_stream: Callable[..., EventReader], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_module, "KEEPALIVE_S", 0.3)
    events = open_stream()
    time.sleep(1.2)
    assert events.comments and events.comments[0] == ": keepalive"


def test_a_stream_stops_polling_when_its_client_goes(
    db: Database, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    ticks: list[float] = []
    poll = ChatStream.poll
    monkeypatch.setattr(
        ChatStream, "poll", lambda self, woken=False: (ticks.append(time.monotonic()), poll(self, woken))[1]
    )
    add_group(db, chat_jid=JID, name="Live", folder="live", requires_trigger=False)
    # Looks every 0.2 s with nothing to wake it: a second without one after the client went says it stopped.
    with serve(create_app(Orchestrator(settings.replace(stream_safety_poll_s=0.2)))) as base_url:
        _stops_when_the_client_goes(base_url, ticks)


def _stops_when_the_client_goes(base_url: str, ticks: list[float]) -> None:
    # A raw client, so that going away is a real FIN (a socket closed under a thread blocked in recv is not).
    host, port = base_url.removeprefix("http://").split(":")
    client = socket.create_connection((host, int(port)), timeout=10)
    client.sendall(f"GET /api/chats/{JID}/stream HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    assert client.recv(4096).startswith(b"HTTP/1.1 200")
    deadline = time.monotonic() + 10
    while len(ticks) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(ticks) >= 3
    client.shutdown(socket.SHUT_RDWR)
    client.close()
    time.sleep(0.5)  # a tick under way finishes
    after_close = len(ticks)
    time.sleep(1.0)  # five more ticks, were it still running
    assert len(ticks) == after_close


def test_a_tick_holds_no_connection_or_transaction(db: Database, settings: Settings) -> None:
    add_group(db, chat_jid=JID, name="Live", folder="live")
    seqs = [_msg(db, f"m{i}", "x").seq for i in range(401)]  # three pages
    create_run(db, chat_jid=JID, cursor_from=0, cursor_to=1, celery_task_id=None)
    chat = ChatStream(db, JID, 0)
    frames = chat.poll()
    assert db.engine.pool.checkedout() == 0  # every read transaction ended with the tick
    assert [f.event for f in frames].count("run") == 1
    # A long history goes a page a tick: a tick never holds more than a page of it.
    sent = [int(f.id) for f in frames if f.event == "message"]
    pages = [len(sent)]
    while chat.behind:
        more = [int(f.id) for f in chat.poll() if f.event == "message"]
        assert db.engine.pool.checkedout() == 0
        pages.append(len(more))
        sent += more
    assert pages == [stream_module.PAGE, stream_module.PAGE, 1]
    assert sent == seqs  # each once, in order
    assert chat.cursor == seqs[-1]
    assert chat.poll() == [] and db.engine.pool.checkedout() == 0


def test_open_streams_end_cleanly_when_the_server_stops(db: Database, settings: Settings) -> None:
    """The production command (``orchestrator up``'s API process) under SIGTERM with a stream open:
    the stream ends on its own, the response complete, well within uvicorn's 3 s graceful shutdown."""
    add_group(db, chat_jid=JID, name="Live", folder="live")
    _msg(db, "m1", "hello")
    env = {
        **os.environ,
        "ORCHESTRATOR_DATA_DIR": str(settings.data_dir),
        "ORCHESTRATOR_DATABASE_URL": settings.database_url,
    }
    server = subprocess.Popen(
        api_argv("127.0.0.1", 0),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    log_lines: list[str] = []
    started: queue.Queue[str] = queue.Queue()

    def read_log() -> None:
        assert server.stderr is not None
        for line in server.stderr:
            log_lines.append(line)
            if "Uvicorn running on " in line:
                started.put(line.split("Uvicorn running on ", 1)[1].split()[0])

    threading.Thread(target=read_log, daemon=True).start()
    reader = None
    try:
        try:
            url = started.get(timeout=60)
        except queue.Empty:
            raise AssertionError("the API did not start:\n" + "".join(log_lines)) from None
        reader = EventReader(f"{url}/api/chats/{JID}/stream")
        assert reader.response.status_code == 200 and reader.next().json["id"] == "m1"

        sent = time.monotonic()
        server.send_signal(signal.SIGTERM)
        assert reader.ended.wait(5), "the stream did not end"
        ended = time.monotonic() - sent
        assert reader.error is None, reader.error  # a complete response, not one cut off
        assert ended < 2.0, ended
        # After its graceful shutdown uvicorn re-raises the signal it got (the exit a caller expects).
        assert server.wait(timeout=10) in (0, -signal.SIGTERM)
    finally:
        if reader is not None:
            reader.close()
        if server.poll() is None:
            server.kill()
            server.wait()
    log_text = "".join(log_lines)
    assert "timeout graceful shutdown exceeded" not in log_text, log_text
    assert "without completing response" not in log_text and "Traceback" not in log_text, log_text
