"""Channels and deliveries on a real database: mirroring, retries, exactly
once under concurrent deliverers, what is never delivered, attach/detach."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from fakes.channel import RecordingChannel, read_file_channel
from orchestrator.channels.base import LogChannel
from orchestrator.channels.registry import build_registry
from orchestrator.core.errors import ChannelError, UnknownGroup
from orchestrator.core.settings import Settings
from orchestrator.model.envelopes import build_structured_envelope
from orchestrator.model.messages import StoredMessage
from orchestrator.model.render import RenderedMessage
from orchestrator.run import outbound as outbound_module
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry, Deliverer
from orchestrator.run.sweeper import sweep
from orchestrator.store import deliveries as deliveries_module
from orchestrator.store.attachments import attach_channel, detach_channel, list_attachments
from orchestrator.store.db import Database
from orchestrator.store.deliveries import list_deliveries
from orchestrator.store.groups import add_group
from orchestrator.store.history import truncate_after
from orchestrator.store.hosts import database_now
from orchestrator.store.tables import DeliveryRow
from tests.conftest import run_in_threads, wait_until

JID = "team@chat"


@pytest.fixture
def team(db: Database) -> Database:
    add_group(db, chat_jid=JID, name="Team", folder="team", requires_trigger=True, assistant_name="Robo")
    return db


def _say(
    db: Database,
    settings: Settings,
    content: str = "",
    *,
    channel: str | None = None,
    sender: str = "alice",
    **kw: object,
) -> StoredMessage:
    fields = {"sender_name": sender.title(), "content": content, **kw}
    return ingest(
        db,
        settings,
        IncomingMessage(chat_jid=JID, sender=sender, channel=channel, **fields),  # type: ignore[arg-type]
        signal=None,
    ).message


def _conversation(db: Database, settings: Settings, *, origin: str | None) -> list[StoredMessage]:
    """A person's message (from ``origin``), then what a run would store."""
    tool = build_structured_envelope(
        "TOOL_CALL",
        {"tool_name": "bash", "input": {"command": "echo hi"}, "output": "hi\n"},
        extras={"exit_code": 0, "tool": "bash"},
    )
    return [
        _say(db, settings, "@Robo say hi", channel=origin),
        _say(db, settings, "bash: echo hi", sender="tool_use", message_type="assistant", is_from_me=True),
        _say(
            db,
            settings,
            "hi\n",
            sender="command_output",
            sender_name="bash",
            message_type="tool_result",
            is_from_me=True,
            metadata=tool,
        ),
        _say(db, settings, "thinking about it", sender="thinking", message_type="assistant", is_from_me=True),
        _say(db, settings, "hi", sender="bot", sender_name="Robo", message_type="assistant", is_from_me=True),
        _say(
            db, settings, "⚠️ something to know", sender="host", sender_name="host", message_type="host", is_from_me=True
        ),
    ]


def _fast(settings: Settings, **kw: object) -> Settings:
    return settings.replace(**{"delivery_retry_base_s": 0.05, "delivery_retry_max_s": 0.2, **kw})


# -- mirroring ----------------------------------------------------------------------------


def test_a_message_on_one_channel_shows_the_same_history_on_the_others(team: Database, settings: Settings) -> None:
    channels = {n: RecordingChannel(n) for n in ("phone", "desk", "wall")}
    for name in channels:
        attach_channel(team, JID, name, address=f"{name}:room-7" if name == "wall" else None)
    msgs = _conversation(team, settings, origin="phone")
    report = Deliverer(team, settings, ChannelRegistry(channels.values())).deliver_due(JID)

    expected = [
        "Alice: @Robo say hi",
        '🔧 ✅ exit 0 · bash\ninput: {"command": "echo hi"}\nhi',
        "Robo: hi",
        "🏠 ⚠️ something to know",
    ]
    assert channels["desk"].rendered == channels["wall"].rendered == expected
    # Not echoed back to where it came from; the replies do go there.
    assert channels["phone"].rendered == expected[1:]
    assert report.sent == 3 + 4 + 4 and report.failed_attempts == 0
    assert channels["wall"].addresses == ["wall:room-7"] * 4 and channels["desk"].addresses == [JID] * 4
    # The rendered message names its source.
    first = channels["desk"].sent[0]
    assert (first.seq, first.id, first.message_type, first.origin_channel) == (msgs[0].seq, msgs[0].id, "user", "phone")
    assert msgs[0].metadata == {"origin_channel": "phone"}
    rows = list_deliveries(team, message_seq=msgs[0].seq)
    assert sorted(d.channel for d in rows) == ["desk", "wall"]
    assert {(d.state, d.attempts) for d in list_deliveries(team)} == {("sent", 1)}
    # Nothing is left to send, and nothing is sent twice.
    again = Deliverer(team, settings, ChannelRegistry(channels.values())).deliver_due()
    assert again.sent == 0 and len(channels["desk"].sent) == 4


def test_only_channels_attached_at_the_time_get_a_message(team: Database, settings: Settings) -> None:
    early, late = RecordingChannel("early"), RecordingChannel("late")
    attach_channel(team, JID, "early")
    _say(team, settings, "one")
    attach_channel(team, JID, "late")
    _say(team, settings, "two")
    Deliverer(team, settings, ChannelRegistry([early, late])).deliver_due()
    assert early.rendered == ["Alice: one", "Alice: two"] and late.rendered == ["Alice: two"]


# -- retries ------------------------------------------------------------------------------


def test_a_channel_that_fails_twice_gets_the_message_exactly_once(team: Database, settings: Settings) -> None:
    # Long enough that a loaded machine cannot reach the retry within the same call.
    settings = _fast(settings, delivery_retry_base_s=0.6, delivery_retry_max_s=1.2)
    flaky = RecordingChannel("flaky", fail_times=2)
    attach_channel(team, JID, "flaky")
    first = _say(team, settings, "first")
    second = _say(team, settings, "second")
    deliverer = Deliverer(team, settings, ChannelRegistry([flaky]))

    report = deliverer.deliver_due()
    assert report.sent == 0 and report.failed_attempts == 1 and report.retry_in is not None
    assert report.retry_in <= 0.6
    [row] = list_deliveries(team, message_seq=first.seq)
    assert (row.state, row.attempts) == ("pending", 1) and "flaky is down (call 1)" in (row.last_error or "")
    # The second message waits behind the first: the channel shows them in order.
    assert list_deliveries(team, message_seq=second.seq)[0].attempts == 0

    def drained() -> bool:
        deliverer.deliver_due()
        return len(flaky.sent) == 2

    wait_until(drained, 10, "the flaky channel to take both messages")
    assert flaky.calls == 4 and flaky.rendered == ["Alice: first", "Alice: second"]
    [row] = list_deliveries(team, message_seq=first.seq)
    assert (row.state, row.attempts) == ("sent", 3) and row.sent_at is not None
    assert "call 2" in (row.last_error or "")  # the last failure stays on record
    assert [(d.state, d.attempts) for d in list_deliveries(team, message_seq=second.seq)] == [("sent", 1)]
    for _ in range(3):
        deliverer.deliver_due()
    assert flaky.calls == 4  # never again


def test_a_channel_that_keeps_failing_gives_up_and_the_next_message_goes_on(team: Database, settings: Settings) -> None:
    settings = _fast(settings, delivery_max_attempts=2, delivery_retry_base_s=0.0)
    down = RecordingChannel("down", fail_times=2)
    attach_channel(team, JID, "down")
    first = _say(team, settings, "lost")
    _say(team, settings, "kept")
    Deliverer(team, settings, ChannelRegistry([down])).deliver_due()
    [row] = list_deliveries(team, message_seq=first.seq)
    assert (row.state, row.attempts) == ("failed", 2)
    assert down.rendered == ["Alice: kept"]


def test_a_rate_limited_channel_delays_a_message_but_never_fails_it(team: Database, settings: Settings) -> None:
    """Told "not now" (429) more times than a delivery may fail: no attempt is used up
    by a rate limit, so the message is sent once the platform takes it, never failed."""
    from orchestrator.core.errors import ChannelRateLimited

    class Limited(RecordingChannel):
        def __init__(self, name: str, limited_times: int) -> None:
            super().__init__(name)
            self.limited_times = limited_times

        def send(self, address: str, rendered) -> None:  # type: ignore[no-untyped-def]
            if self.limited_times > 0:
                self.limited_times -= 1
                raise ChannelRateLimited("rate limited (retry after 0.01 s)", 0.01)
            super().send(address, rendered)

    settings = _fast(settings, delivery_max_attempts=2, delivery_retry_base_s=0.0, delivery_retry_max_s=0.0)
    limited = Limited("limited", limited_times=5)
    attach_channel(team, JID, "limited")
    msg = _say(team, settings, "patience")
    deliverer = Deliverer(team, settings, ChannelRegistry([limited]))

    def drained() -> bool:
        deliverer.deliver_due()
        return bool(limited.sent)

    wait_until(drained, 10, "the rate-limited channel to take the message")
    [row] = list_deliveries(team, message_seq=msg.seq)
    assert (row.state, row.attempts) == ("sent", 1), row  # five 429s used up no attempt
    assert "rate limited" in (row.last_error or "")
    assert [m.seq for m in limited.sent] == [msg.seq]


def test_retry_delays_grow_exponentially_with_jitter() -> None:
    from orchestrator.core.backoff import backoff_delay  # the one policy: deliveries and runs

    for attempt, cap in [(1, 1.0), (2, 2.0), (3, 4.0), (10, 30.0)]:
        delays = [backoff_delay(attempt, 1.0, 30.0) for _ in range(200)]
        assert all(cap / 2 <= d <= cap for d in delays)
        assert len(set(delays)) > 100  # jitter


# -- exactly once ----------------------------------------------------------------------------


def test_concurrent_deliverers_never_send_a_message_twice(team: Database, settings: Settings) -> None:
    class Slow(RecordingChannel):
        def send(self, address: str, rendered) -> None:  # type: ignore[no-untyped-def]
            time.sleep(0.002)  # so that claims really overlap
            super().send(address, rendered)

    channels = [Slow("one"), Slow("two")]
    for ch in channels:
        attach_channel(team, JID, ch.name)
    sent = [_say(team, settings, f"message {i}").seq for i in range(25)]
    registry = ChannelRegistry(channels)
    errors = run_in_threads(lambda i: Deliverer(team, settings, registry).deliver_due(), 8)
    assert errors == []
    for ch in channels:
        assert [m.seq for m in ch.sent] == sent  # each once, in order
    assert {(d.state, d.attempts) for d in list_deliveries(team)} == {("sent", 1)}


def test_an_abandoned_send_is_never_retried_and_due_chats_are_signalled(team: Database, settings: Settings) -> None:
    rec = RecordingChannel("rec")
    attach_channel(team, JID, "rec")
    cut = _say(team, settings, "cut off mid-send")
    _say(team, settings, "next")
    with team.write() as session:  # a deliverer claimed it, then died: its deadline passed (database's clock)
        session.execute(
            update(DeliveryRow)
            .where(DeliveryRow.message_seq == cut.seq)
            .values(
                state="sending",
                attempts=1,
                claimed_by="dead:1:x",
                claimed_until=database_now(team) - timedelta(seconds=1),
            )
        )
    signals: list[str] = []
    report = sweep(team, signal=None, signal_delivery=signals.append)
    assert report.abandoned_deliveries == 1
    [row] = list_deliveries(team, message_seq=cut.seq)
    assert row.state == "failed" and "never sent twice" in (row.last_error or "")
    assert signals == [JID] == report.delivery_signals
    Deliverer(team, settings, ChannelRegistry([rec])).deliver_due()
    assert rec.rendered == ["Alice: next"]


@pytest.mark.parametrize("skew_h", [-1, 1])
def test_a_claims_deadline_is_on_the_databases_clock(
    team: Database,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    skew_h: int,
) -> None:
    """A deliverer on a host whose clock is an hour off: its claim's deadline is still the
    database's now + delivery_claim_s, so a sweep during the send (on any host) leaves the
    live claim alone (an hour behind, the old deadline had passed before the send began)."""
    real = deliveries_module.utc_now
    for module in (deliveries_module, outbound_module):  # this whole host is skewed
        monkeypatch.setattr(module, "utc_now", lambda: real() + timedelta(hours=skew_h))
    seen: list[tuple[datetime | None, int]] = []

    class SweptWhileSending(RecordingChannel):
        def send(self, address: str, rendered: RenderedMessage) -> None:
            with team.read() as session:
                until = session.scalar(select(DeliveryRow.claimed_until).where(DeliveryRow.state == "sending"))
            seen.append((until, sweep(team, signal=None).abandoned_deliveries))
            super().send(address, rendered)

    rec = SweptWhileSending("rec")
    attach_channel(team, JID, "rec")
    before = database_now(team)
    _say(team, settings, "hello")
    Deliverer(team, settings, ChannelRegistry([rec])).deliver_due()
    [(until, abandoned)] = seen
    assert abandoned == 0 and rec.rendered == ["Alice: hello"]
    assert until is not None
    assert before + timedelta(seconds=settings.delivery.claim_s) <= until
    assert until <= database_now(team) + timedelta(seconds=settings.delivery.claim_s)
    assert [d.state for d in list_deliveries(team)] == ["sent"]


# -- what is never delivered -------------------------------------------------------------------


def test_stored_only_and_superseded_messages_are_not_delivered(team: Database, settings: Settings) -> None:
    rec = RecordingChannel("rec")
    attach_channel(team, JID, "rec")
    _say(team, settings, "@Robo go")
    for sender in ("tool_use", "thinking", "result_meta"):
        m = _say(team, settings, f"{sender} record", sender=sender, message_type="assistant", is_from_me=True)
        assert list_deliveries(team, message_seq=m.seq) == []
    # No sender name: shown under the group's assistant name.
    keep = _say(team, settings, "answer", sender="bot", sender_name="", message_type="assistant", is_from_me=True)
    dropped = _say(
        team, settings, "a reply that gets truncated", sender="bot", message_type="assistant", is_from_me=True
    )
    truncate_after(team, settings, JID, keep.id)
    report = Deliverer(team, settings, ChannelRegistry([rec])).deliver_due()
    assert rec.rendered == ["Alice: @Robo go", "Robo: answer"]
    # Cancelled by the truncate itself, in its transaction: no deliverer ever claimed it.
    assert report.cancelled == 0
    [row] = list_deliveries(team, message_seq=dropped.seq)
    assert (row.state, row.attempts, row.last_error) == ("cancelled", 0, "superseded before it was sent")


def test_detach_cancels_what_was_not_sent(team: Database, settings: Settings) -> None:
    rec = RecordingChannel("rec")
    attach_channel(team, JID, "rec")
    m = _say(team, settings, "never shown")
    assert detach_channel(team, JID, "rec") is True
    assert detach_channel(team, JID, "rec") is False
    assert [d.state for d in list_deliveries(team, message_seq=m.seq)] == ["cancelled"]
    _say(team, settings, "after")
    Deliverer(team, settings, ChannelRegistry([rec])).deliver_due()
    assert rec.sent == [] and list_attachments(team, JID) == []


def test_channels_of_another_process_are_left_alone_unless_told(team: Database, settings: Settings) -> None:
    attach_channel(team, JID, "elsewhere")
    m = _say(team, settings, "hi")
    assert Deliverer(team, settings, ChannelRegistry([])).deliver_due().failed_attempts == 0
    assert list_deliveries(team, message_seq=m.seq)[0].attempts == 0
    # A worker owns every channel name: one it does not have is a failure (retried, then failed).
    report = Deliverer(
        team, _fast(settings, delivery_max_attempts=1), ChannelRegistry([]), only_known=False
    ).deliver_due()
    assert report.failed_attempts == 1
    [row] = list_deliveries(team, message_seq=m.seq)
    assert row.state == "failed" and "no channel named 'elsewhere'" in (row.last_error or "")


# -- registry and attachments ------------------------------------------------------------------


def test_registry_is_keyed_by_name_and_checks_addresses(team: Database, settings: Settings) -> None:
    class Rooms(RecordingChannel):
        def owns(self, address: str) -> bool:
            return address.startswith("room:")

    with pytest.raises(ChannelError, match="two channels"):
        ChannelRegistry([RecordingChannel("x"), RecordingChannel("x")])
    with pytest.raises(ChannelError, match="lowercase"):
        ChannelRegistry([RecordingChannel("Bad Name")])
    with pytest.raises(ChannelError, match="lowercase"):
        ChannelRegistry([RecordingChannel("log\n")])  # "$" alone would let the newline through
    registry = ChannelRegistry([LogChannel(), Rooms("rooms")])
    assert registry.names == ["log", "rooms"] and "rooms" in registry and registry.get("nope") is None
    with pytest.raises(ChannelError, match="cannot reach"):
        attach_channel(team, JID, "rooms", registry=registry)
    with pytest.raises(ChannelError, match="no channel named"):
        attach_channel(team, JID, "nope", registry=registry)
    with pytest.raises(UnknownGroup):
        attach_channel(team, "nobody@chat", "log", registry=registry)
    a = attach_channel(team, JID, "rooms", address="room:1", config={"thread": True}, registry=registry)
    assert (a.address, a.config) == ("room:1", {"thread": True})
    a = attach_channel(team, JID, "rooms", address="room:2", registry=registry)  # again: moved
    assert [x.address for x in list_attachments(team, JID)] == ["room:2"]

    with pytest.raises(ChannelError, match="cannot be loaded"):
        build_registry(settings.replace(**{"channel_plugins": "fakes.channel:nothing"}))
    plugged = build_registry(settings.replace(**{"channel_plugins": "fakes.channel:plugin"}))
    assert plugged.names == ["flaky", "log", "mirror-a", "mirror-b", "webhook"]


def test_the_log_channel_writes_the_rendered_text(
    team: Database, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    attach_channel(team, JID, "log")
    m = _say(team, settings, "hello log")
    with caplog.at_level("INFO", logger="orchestrator.channel.log"):
        Deliverer(team, settings, build_registry(settings)).deliver_due()
    assert f"[{JID} #{m.seq}] Alice: hello log" in caplog.text


def test_attach_detach_and_deliveries_from_the_cli(team: Database, settings: Settings) -> None:
    env = {
        **os.environ,
        "ORCHESTRATOR_DATA_DIR": str(settings.data_dir),
        "ORCHESTRATOR_DATABASE_URL": settings.database_url,
        "ORCHESTRATOR_CHANNEL_PLUGINS": "fakes.channel:plugin",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    cli = str(Path(sys.executable).parent / "orchestrator")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([cli, *args], env=env, capture_output=True, text=True, timeout=60)

    ok = run("groups", "attach", JID, "mirror-a", "--address", "desk-1")
    assert ok.returncode == 0 and "attached to mirror-a at desk-1" in ok.stdout, ok.stderr
    bad = run("groups", "attach", JID, "telegram")
    assert bad.returncode == 1 and "no channel named 'telegram'" in bad.stderr
    attach_channel(team, JID, "log")
    listed = json.loads(run("groups", "channels", JID, "--json").stdout)
    assert [(a["channel"], a["address"]) for a in listed] == [("log", JID), ("mirror-a", "desk-1")]

    sent = run("send", JID, "from the cli")  # no worker: the deliveries wait
    assert sent.returncode == 0, sent.stderr
    pending = json.loads(run("deliveries", "--group", JID, "--json").stdout)
    assert sorted((d["channel"], d["state"]) for d in pending) == [("log", "pending"), ("mirror-a", "pending")]
    flushed = run("deliveries", "flush", "--chat-jid", JID)
    assert flushed.returncode == 0 and "sent 2" in flushed.stdout, flushed.stderr
    assert [(r["address"], r["text"]) for r in read_file_channel(settings, "mirror-a")] == [
        ("desk-1", "cli-user: from the cli")
    ]

    gone = run("groups", "detach", JID, "mirror-a")
    assert gone.returncode == 0 and "detached from mirror-a" in gone.stdout, gone.stderr
    assert [a.channel for a in list_attachments(team, JID)] == ["log"]
    with team.read() as session:
        assert session.scalar(select(DeliveryRow.state).where(DeliveryRow.channel == "mirror-a")) == "sent"


def test_a_claim_reads_only_the_unfinished_rows_of_a_line_whatever_its_history(
    team: Database,
    settings: Settings,
    db_backend: str,
) -> None:
    """The 30-minute PostgreSQL soak's deliverer slowed as the table grew: "no earlier
    unfinished row" read the line's whole history.  The claim's statements must find
    their rows through the unfinished rows' partial index (revision 0016), on both
    databases, so that a claim costs the same after 10 or 10 million sends."""
    from sqlalchemy import event, insert, text

    from orchestrator.store.deliveries import utc_now

    unfinished_reads = ("idx_deliveries_unfinished", "idx_deliveries_due", "PRIMARY KEY")
    now = utc_now()
    history = [
        {
            "message_seq": seq,
            "chat_jid": JID,
            "channel": "rec",
            "address": JID,
            "state": "sent",
            "attempts": 1,
            "next_attempt_at": now,
            "created_at": now,
        }
        for seq in range(-300, 0)
    ]
    with team.write() as session:
        session.execute(insert(DeliveryRow), history)
    attach_channel(team, JID, "rec")
    _say(team, settings, "one")
    _say(team, settings, "two")

    seen: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        # The sends' claim statements (the changes' have indexes of their own: test_delivery_changes.py).
        if "FROM deliveries" in statement and "EXISTS" in statement and "delivery_changes" not in statement:
            seen.append((statement, parameters))

    event.listen(team.engine, "before_cursor_execute", capture)
    try:
        rec = RecordingChannel("rec")
        Deliverer(team, settings, ChannelRegistry([rec])).deliver_due(JID)
    finally:
        event.remove(team.engine, "before_cursor_execute", capture)
    assert [m.content for m in rec.sent] == ["one", "two"]
    assert seen, "the deliverer's claim statements were not seen"

    for statement, parameters in {s: p for s, p in seen}.items():
        with team.engine.connect() as conn:
            raw = conn.connection.driver_connection
            cur = raw.cursor()
            if db_backend == "sqlite":
                cur.execute("EXPLAIN QUERY PLAN " + statement, parameters)
                plan = "\n".join(str(row[-1]) for row in cur.fetchall())
                # Every read of deliveries (the candidates and the "earlier" probe) by an index
                # of unfinished or due rows, never the line's history or the whole table.
                reads = [line for line in plan.splitlines() if "deliveries" in line]
                assert reads and all(any(ix in line for ix in unfinished_reads) for line in reads), plan
                assert "idx_deliveries_unfinished" in plan, plan
            else:
                # A small table makes a sequential scan cheapest; forbid it to see which
                # index the planner *can* use for each read.
                conn.execute(text("SET enable_seqscan = off"))
                cur.execute("EXPLAIN " + statement, parameters)
                plan = "\n".join(row[0] for row in cur.fetchall())
                assert "idx_deliveries_unfinished" in plan, plan
                assert "idx_deliveries_line" not in plan, plan
            conn.rollback()
