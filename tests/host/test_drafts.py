"""Streamed replies on the host, on both databases: the run's draft, bounded, in place, and gone when stored.

The real pipeline with a fake sandbox (``fakes/sandbox.py``) playing
``text_delta`` events as a streaming runner writes them; the draft read
back from the database (``orchestrator/store/drafts.py``), by the chat's
event stream (``ChatStream.poll``) and by the terminal chat's follower, the
way the other processes read it.  The container is hostile: an endless or
huge stream of deltas must stay bounded and never become rows, and what the
draft writes (each write is the whole text) is bounded in bytes per run.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from sqlalchemy import event, func, select, update

from agent_runner.protocol import AssistantEvent, Event, ResultEvent, TextDeltaEvent
from fakes.clock import FakeClock
from fakes.sandbox import FakeSandbox, Script
from orchestrator.cli.chat import Follower
from orchestrator.core.settings import Settings
from orchestrator.http.stream import ChatStream
from orchestrator.model.messages import StoredMessage
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.live_draft import FREE_LINES_PER_EVENT, WRITE_RATE, LiveDraft
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.store.db import Database
from orchestrator.store.drafts import chat_drafts, drop_draft, save_draft
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import create_run
from orchestrator.store.tables import MessageRow, RunDraftRow, RunRow
from tests.conftest import wait_until

JID = "main@local"


def _pipeline(settings: Settings, db: Database, sandbox: FakeSandbox, **changes: Any) -> Pipeline:
    ensure_main_group(db)
    s = settings.replace(**{"max_attempts": 1, **changes})
    return Pipeline(s, db, ChannelRegistry([]), sandbox, clock=FakeClock())


def _say(p: Pipeline, text: str = "hello") -> StoredMessage:
    return ingest(p.db, p.settings, IncomingMessage(chat_jid=JID, sender="u", content=text), signal=None).message


def _draft_rows(db: Database) -> int:
    with db.read() as session:
        return int(session.scalar(select(func.count()).select_from(RunDraftRow)) or 0)


def _message_rows(db: Database) -> int:
    with db.read() as session:
        return int(session.scalar(select(func.count()).select_from(MessageRow)) or 0)


def _set_state(db: Database, run_id: str, state: str) -> None:
    with db.write() as session:
        session.execute(update(RunRow).where(RunRow.id == run_id).values(state=state))


def _running_run(db: Database) -> str:
    ensure_main_group(db)
    run = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=0, celery_task_id=None)
    _set_state(db, run.id, "running")
    return run.id


# -- the store -----------------------------------------------------------------


def test_a_draft_is_one_row_updated_in_place_and_listed_while_its_run_runs(db: Database) -> None:
    run_id = _running_run(db)
    for i in range(1, 30):
        save_draft(db, run_id, JID, "word " * i, i)
    assert _draft_rows(db) == 1
    [draft] = chat_drafts(db, JID)
    assert (draft.run_id, draft.text, draft.version) == (run_id, "word " * 29, 29)
    assert chat_drafts(db, "other@local") == []

    _set_state(db, run_id, "succeeded")  # a worker that died before deleting it: never shown
    assert chat_drafts(db, JID) == []
    drop_draft(db, run_id)
    assert _draft_rows(db) == 0


# -- the run's draft: bounded and throttled ---------------------------------------


class Ticks:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_draft_is_written_at_most_every_interval_and_capped(db: Database) -> None:
    run_id = _running_run(db)
    clock = Ticks()
    draft = LiveDraft(
        db, run_id, JID, max_bytes=1000, free_lines=10_000, free_bytes=10**6, max_written=10**9, clock=clock
    )
    for i in range(200):  # 200 pieces, 10 ms apart: 2 s of streaming
        clock.now += 0.01
        assert draft.add(TextDeltaEvent(block="1.0", text=f"w{i:03d} "))
    assert 15 <= draft.writes <= 21  # one per 100 ms, not one per piece
    [row] = chat_drafts(db, JID)
    assert len(row.text.encode()) <= 1000 and row.text.startswith("w000 w001")
    assert draft.dropped == 200 * 5 - 1000

    # A new block of the same reply: a new paragraph; a multi-byte character is never cut in two.
    draft.stored()
    assert chat_drafts(db, JID) == []
    clock.now += 1
    draft.add(TextDeltaEvent(block="2.0", text="é" * 600))  # 1200 bytes
    assert chat_drafts(db, JID)[0].text == "é" * 500
    draft.close()
    assert _draft_rows(db) == 0


def test_deltas_past_the_free_allowance_are_dropped_and_counted(db: Database) -> None:
    draft = LiveDraft(db, _running_run(db), JID, max_bytes=10**6, free_lines=5, free_bytes=100, max_written=10**9)
    taken = [draft.add(TextDeltaEvent(block="1.0", text="x" * 10)) for _ in range(8)]
    assert taken == [True] * 5 + [False] * 3
    assert draft.text == "x" * 50
    draft = LiveDraft(db, _running_run(db), JID, max_bytes=10**6, free_lines=1000, free_bytes=100, max_written=10**9)
    assert [draft.add(TextDeltaEvent(block="1.0", text="y" * 40)) for _ in range(3)] == [True, True, False]


# -- what the draft writes, in bytes: bounded per run (issue 29) -----------------------------


class DraftWrites:
    """The bytes of the parameters of every statement that wrote a ``run_drafts`` row (an UPDATE
    that found none wrote nothing), and how many statements read a draft's text."""

    def __init__(self, db: Database) -> None:
        self.engine = db.engine
        self.bytes = 0
        self.statements = 0
        self.text_reads = 0

    def _seen(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        sql = " ".join(statement.split()).lower()
        if ("update run_drafts" in sql or "insert into run_drafts" in sql) and cursor.rowcount > 0:
            values = parameters.values() if isinstance(parameters, dict) else parameters
            self.bytes += sum(len(v.encode()) for v in values if isinstance(v, str))
            self.statements += 1
        elif sql.startswith("select") and "run_drafts.text" in sql:
            self.text_reads += 1

    def __enter__(self) -> DraftWrites:
        event.listen(self.engine, "after_cursor_execute", self._seen)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "after_cursor_execute", self._seen)


def _as_the_pipeline_makes_it(db: Database, settings: Settings, run_id: str, clock: Ticks) -> LiveDraft:
    return LiveDraft(
        db,
        run_id,
        JID,
        max_bytes=settings.runs.max_event_line_bytes,
        free_lines=FREE_LINES_PER_EVENT * settings.runs.max_run_events,
        free_bytes=settings.runs.max_run_stored_bytes,
        max_written=settings.runs.max_run_stored_bytes,
        clock=clock,
    )


def test_a_huge_delta_then_a_byte_every_100_ms_writes_bounded_bytes(settings: Settings, db: Database) -> None:
    """The review's pattern: one 1 MB delta, then a 1-byte delta every 100 ms for a whole run
    (the default 300 s).  Each write is the whole draft, so today's writer rewrote 1 MB ten
    times a second (3 GB a run), and every open stream got each version.  Bounded now by the
    pace (after n bytes, the next write waits n / 64 KiB/s) and the run's budget; the stream
    reads and sends each version once."""
    run_id = _running_run(db)
    clock = Ticks()
    draft = _as_the_pipeline_makes_it(db, settings, run_id, clock)
    stream = ChatStream(db, JID, 0)
    stream.poll()  # the run: live
    run_s = settings.runs.run_timeout_s
    # One burst, then the pace; and never past the run's budget.
    bound = min(10**6 + WRITE_RATE * run_s, settings.runs.max_run_stored_bytes) + 64 * 1024  # + the row's other fields
    sent = 0
    polls = 0
    with DraftWrites(db) as writes:
        assert draft.add(TextDeltaEvent(block="1.0", text="x" * 10**6))
        while clock.now < run_s:
            clock.now += 0.1
            assert draft.add(TextDeltaEvent(block="1.0", text="y"))
            if round(clock.now * 10) % 2 == 0:  # a page polls every 200 ms
                polls += 1
                sent += sum(len(f.data.encode()) for f in stream.poll() if f.event == "draft")
            # Today's writer passes the bound within two seconds: fail there, not after 3 GB.
            assert writes.bytes <= bound, f"{writes.bytes} bytes written by {clock.now:.1f} s"
        # The writer's own count is the database's: the texts, and the row's few other fields.
        assert draft.written <= writes.bytes <= draft.written + writes.statements * 200
        assert 10**6 <= draft.written <= settings.runs.max_run_stored_bytes
        assert sent <= draft.written + writes.statements * 100  # each version at most once, JSON around it
        assert writes.text_reads <= writes.statements + 1 < polls / 10  # not the text of every tick
    [row] = chat_drafts(db, JID)
    assert row.text.startswith("x" * 10**6)  # what was written last stays until the reply is stored
    draft.stored()
    assert chat_drafts(db, JID) == []


def test_the_pace_keeps_a_readable_draft_live_and_slows_a_big_one(db: Database) -> None:
    """What a person watching sees: a reply of a few KiB every 100 ms, as before; a 64 KiB
    draft about once a second; the pace holds across a stored reply."""
    clock = Ticks()
    draft = LiveDraft(
        db, _running_run(db), JID, max_bytes=2**20, free_lines=10**6, free_bytes=10**9, max_written=10**9, clock=clock
    )
    for _ in range(60):  # 60 pieces of 100 bytes, 100 ms apart (and a hair, for the float sums): 6 KB
        clock.now += 0.101
        draft.add(TextDeltaEvent(block="1.0", text="w" * 100))
    assert draft.writes == 60
    draft.stored()
    writes = draft.writes
    for _ in range(100):  # 64 KiB at once, then 10 s of a piece each 100 ms
        clock.now += 0.101
        draft.add(TextDeltaEvent(block="2.0", text="z" * (64 * 1024 if _ == 0 else 10)))
    assert 9 <= draft.writes - writes <= 11


def test_past_the_runs_budget_the_draft_stays_until_stored_and_no_new_one_is_written(db: Database) -> None:
    clock = Ticks()
    draft = LiveDraft(
        db, _running_run(db), JID, max_bytes=2**20, free_lines=10**6, free_bytes=10**9, max_written=10_000, clock=clock
    )
    for i in range(10):  # 1 KB each 100 ms: writes of 1, 2, 3, 4 KB; the 5 KB one would pass 10 KB
        clock.now += 0.101
        draft.add(TextDeltaEvent(block="1.0", text=str(i) * 1000))
    assert (draft.writes, draft.written, draft.spent) == (4, 10_000, True)
    assert chat_drafts(db, JID)[0].text == "0" * 1000 + "1" * 1000 + "2" * 1000 + "3" * 1000
    draft.stored()
    clock.now += 60
    assert draft.add(TextDeltaEvent(block="2.0", text="next reply"))
    assert chat_drafts(db, JID) == [] and draft.writes == 4


# -- through the pipeline -----------------------------------------------------


def test_a_streamed_reply_shows_as_a_draft_and_is_stored_once(settings: Settings, db: Database) -> None:
    words = [f"word{i} " for i in range(40)]
    seen: dict[str, Any] = {}
    events: list[Event] = [TextDeltaEvent(block="1.0", text=w) for w in words]
    events += [AssistantEvent(text="".join(words)), ResultEvent(num_turns=1)]
    gate = threading.Event()
    stream = ChatStream(db, JID, 0)

    def look(index: int) -> None:
        if index == len(words):  # every delta read, the reply not yet stored
            frames = stream.poll()
            seen.update(frames=frames, drafts=chat_drafts(db, JID))

    sandbox = FakeSandbox(Script(events, before_event=look, gate=gate))
    p = _pipeline(settings, db, sandbox)
    _say(p, "talk to me")
    before = _message_rows(db)
    worker = threading.Thread(target=p.drain_group, args=(JID,))
    worker.start()
    try:
        wait_until(lambda: "drafts" in seen, 10, "the run to read its deltas")
        [draft] = seen["drafts"]
        assert draft.text and "".join(words).startswith(draft.text)  # the text so far, in one row
        drafts = [json.loads(f.data) for f in seen["frames"] if f.event == "draft"]
        assert drafts == [{"run_id": draft.run_id, "offset": 0, "text": draft.text}]
        wait_until(lambda: not chat_drafts(db, JID), 10, "the draft to go when the reply is stored")
        # The stream says the draft is gone, after the stored reply.
        frames = stream.poll()
        kinds = [f.event for f in frames]
        assert kinds.index("message") < kinds.index("draft")
        assert json.loads(frames[kinds.index("draft")].data) == {"run_id": draft.run_id, "offset": 0, "text": ""}
    finally:
        gate.set()
        worker.join(10)
    replies = [m for m in get_messages_after(JID, 0, db=db) if m.sender == "bot"]
    assert [m.content for m in replies] == ["".join(words)]
    assert _message_rows(db) - before == 2  # the reply and the run's record: nothing per delta
    assert _draft_rows(db) == 0


def test_the_terminal_chat_prints_the_draft_as_it_grows(settings: Settings, db: Database) -> None:
    run_id = _running_run(db)
    printed: list[str] = []
    follower = Follower(db, settings, JID, printed.append, after=0)
    save_draft(db, run_id, JID, "Hello", 1)
    follower.poll()
    save_draft(db, run_id, JID, "Hello there, world", 2)
    follower.poll()
    follower.poll()  # nothing new
    assert [line for line in printed if "✎" in line] == ["   ✎ Hello", "   ✎ there, world"]


def test_a_hostile_endless_delta_stream_stays_bounded(settings: Settings, db: Database) -> None:
    # Small limits: a draft of at most 4 KiB, deltas free up to 100 lines and 64 KiB.
    sizes: list[int] = []

    def look(index: int) -> None:
        if index % 50 == 0:
            sizes.extend(len(d.text.encode()) for d in chat_drafts(db, JID))

    flood: list[Event] = [TextDeltaEvent(block=f"1.{i % 3}", text="ü" * 400) for i in range(5000)]
    sandbox = FakeSandbox(Script([*flood, AssistantEvent(text="never"), ResultEvent()], before_event=look))
    p = _pipeline(settings, db, sandbox, max_run_events=10, max_event_line_bytes=4096, max_run_stored_bytes=65536)
    _say(p)
    before = _message_rows(db)
    [step] = p.drain_group(JID)

    # 164 lines of 800 bytes are free (64 KiB), the next 10 count: the agent is stopped there.
    assert step.run.state == "failed" and "ORCHESTRATOR_MAX_RUN_EVENTS=10" in (step.run.error or "")
    assert sandbox.agents[0].killed.is_set()
    assert sizes and max(sizes) <= 4096
    assert _draft_rows(db) == 0  # nothing left behind
    stored = get_messages_after(JID, 0, db=db)
    assert not [m for m in stored if m.sender == "bot"]
    assert _message_rows(db) - before <= 2  # the 🏠 notice and the run's record, never a delta


def test_a_long_honest_stream_fits_and_never_counts_as_output_lines(settings: Settings, db: Database) -> None:
    # 400 delta lines, with room for 50 output lines: free (up to 10 x 50 lines), never counted.
    text = "".join(f"t{i} " for i in range(400))
    deltas: list[Event] = [TextDeltaEvent(block="1.0", text=f"t{i} ") for i in range(400)]
    sandbox = FakeSandbox(Script([*deltas, AssistantEvent(text=text), ResultEvent(num_turns=1)]))
    p = _pipeline(settings, db, sandbox, max_run_events=50)
    _say(p)
    [step] = p.drain_group(JID)
    assert step.run.state == "succeeded"
    assert [m.content for m in get_messages_after(JID, 0, db=db) if m.sender == "bot"] == [text]
