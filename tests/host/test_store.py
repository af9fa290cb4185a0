"""The message store: schema, idempotency, seq cursor, filtering."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import inspect, text

from orchestrator import format_messages_for_sdk, get_messages_since, store_message_direct
from orchestrator.core.errors import InvalidMessage
from orchestrator.store.db import Database
from orchestrator.store.message_log import get_messages_after, get_recent_messages
from tests.conftest import run_in_threads


def _store(db: Database, mid: str, chat: str = "chat@g.us", **kw: object):
    args = dict(
        id=mid,
        chat_jid=chat,
        sender="u1",
        sender_name="Ann",
        content=f"text {mid}",
        timestamp="2026-01-01T00:00:00+00:00",
        is_from_me=False,
    )
    args.update(kw)
    return store_message_direct(db=db, **args)  # type: ignore[arg-type]


def test_schema_matches_reference(db: Database) -> None:
    insp = inspect(db.engine)
    cols = {c["name"]: c for c in insp.get_columns("messages")}
    for name in (
        "id",
        "chat_jid",
        "sender",
        "sender_name",
        "content",
        "timestamp",
        "is_from_me",
        "message_type",
        "metadata",
        "seq",
    ):
        assert name in cols, name
    assert cols["message_type"]["nullable"] is False
    assert "user" in str(cols["message_type"]["default"])
    assert insp.get_pk_constraint("messages")["constrained_columns"] == ["id", "chat_jid"]
    idx = {i["name"]: i["column_names"] for i in insp.get_indexes("messages")}
    assert idx["idx_messages_by_chat"] == ["chat_jid", "timestamp"]
    assert {"groups", "runs", "alembic_version"} <= set(insp.get_table_names())


def test_migrate_twice_is_a_no_op(db: Database) -> None:
    _store(db, "a")
    db.migrate()
    assert [m.id for m in get_messages_after("chat@g.us", 0, db=db)] == ["a"]


def test_store_is_idempotent_on_id_and_chat(db: Database) -> None:
    first = _store(db, "same", content="first")
    again = _store(db, "same", content="second")
    other_chat = _store(db, "same", chat="other@g.us", content="other")
    assert again == first and again.content == "first"
    assert other_chat.seq > first.seq
    assert len(get_messages_after("chat@g.us", 0, db=db)) == 1


def test_seq_is_the_cursor_even_with_equal_timestamps(db: Database) -> None:
    seqs = [_store(db, f"m{i}").seq for i in range(5)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 5
    after = get_messages_after("chat@g.us", seqs[1], db=db)
    assert [m.id for m in after] == ["m2", "m3", "m4"]
    # A timestamp cursor would lose all of these: they share one timestamp.
    assert get_messages_since("chat@g.us", "2026-01-01T00:00:00+00:00", db=db) == []


def test_get_messages_since_orders_by_seq_and_filters_time(db: Database) -> None:
    _store(db, "old", timestamp="2025-12-31T00:00:00+00:00")
    _store(db, "new", timestamp="2026-01-02T00:00:00+00:00")
    got = get_messages_since("chat@g.us", "2026-01-01T00:00:00+00:00", db=db)
    assert [m.id for m in got] == ["new"]


def test_get_messages_since_compares_timestamps_bytewise(db: Database) -> None:
    if not db.is_sqlite:
        # A fleet database may well use a linguistic collation; make this
        # column use one (ICU en-US orders "00.000001+00:00" before "00+00:00").
        with db.write() as session:
            if session.scalar(text("SELECT count(*) FROM pg_collation WHERE collname = 'en-US-x-icu'")):
                session.execute(text('ALTER TABLE messages ALTER COLUMN "timestamp" TYPE text COLLATE "en-US-x-icu"'))
    _store(db, "on-the-second", timestamp="2026-01-01T00:00:00+00:00")
    _store(db, "just-after", timestamp="2026-01-01T00:00:00.000001+00:00")
    got = get_messages_since("chat@g.us", "2026-01-01T00:00:00+00:00", db=db)
    assert [m.id for m in got] == ["just-after"]


def test_recent_messages_window(db: Database) -> None:
    for i in range(10):
        _store(db, f"m{i}")
    recent = get_recent_messages("chat@g.us", 3, db=db)
    assert [m.id for m in recent] == ["m7", "m8", "m9"]
    before = get_recent_messages("chat@g.us", 2, before_seq=recent[0].seq, db=db)
    assert [m.id for m in before] == ["m5", "m6"]


@pytest.mark.parametrize(
    "bad",
    [
        {"message_type": "robot"},
        {"metadata": ["not", "an", "object"]},
        {"timestamp": "yesterday"},
        {"sender": "system_notice"},
        {"id": ""},
    ],
)
def test_bad_input_is_refused_and_nothing_stored(db: Database, bad: dict[str, object]) -> None:
    with pytest.raises(InvalidMessage):
        _store(db, "x", **bad)
    assert get_messages_after("chat@g.us", 0, db=db) == []


def test_host_messages_never_reach_the_model(db: Database) -> None:
    _store(db, "u1", content="hello")
    _store(
        db,
        "h1",
        sender="host",
        sender_name="host",
        content="⚠️ Agent error occurred",
        is_from_me=True,
        message_type="host",
    )
    _store(
        db,
        "t1",
        sender="command_output",
        sender_name="command",
        content="ok",
        is_from_me=True,
        message_type="tool_result",
        metadata={"exit_code": 0},
    )
    _store(db, "s1", sender="system", sender_name="system", content="Be brief.", is_from_me=True, message_type="system")
    _store(
        db, "tu", sender="tool_use", sender_name="bash", content="bash: ls", is_from_me=True, message_type="assistant"
    )
    _store(db, "a1", sender="bot", sender_name="Andy", content="hi", is_from_me=True, message_type="assistant")
    view = format_messages_for_sdk(get_messages_since("chat@g.us", None, db=db))
    assert [(m.role, m.content) for m in view] == [
        ("user", "hello"),
        ("tool_result", "ok"),
        ("system", "Be brief."),
        ("assistant", "hi"),
    ]
    assert view[1].metadata == {"exit_code": 0}


def test_nul_characters_are_stored_on_every_backend(db: Database) -> None:
    # PostgreSQL text cannot hold U+0000 (a command's output can): stored as U+FFFD.
    m = _store(db, "nul", content="a\x00b", sender_name="An\x00n", metadata={"out": "x\x00y"})
    (got,) = get_messages_after("chat@g.us", 0, db=db)
    assert got == m
    assert (got.content, got.sender_name) == ("a\ufffdb", "An\ufffdn")
    assert got.metadata == {"out": "x\x00y"}
    with pytest.raises(InvalidMessage):
        _store(db, "bad\x00id")


def test_concurrent_duplicates_are_stored_once(db: Database) -> None:
    # The same (id, chat_jid) from several writers at once (a redelivered
    # signal, two sweepers): one row, every writer gets it back, no error.
    results: list[int] = []
    start = threading.Barrier(6)

    def writer(n: int) -> None:
        for i in range(15):
            start.wait(timeout=30)
            results.append(_store(db, f"dup-{i}", content=f"from {n}").seq)

    errors = run_in_threads(writer, 6)
    assert not errors, errors[:3]
    stored = get_messages_after("chat@g.us", 0, db=db)
    assert [m.id for m in stored] == [f"dup-{i}" for i in range(15)]
    assert sorted(set(results)) == [m.seq for m in stored] and len(results) == 6 * 15


def test_concurrent_writers_get_unique_increasing_seqs(db: Database) -> None:
    def writer(n: int) -> None:
        for i in range(20):
            _store(db, f"w{n}-{i}")

    assert run_in_threads(writer, 4) == []
    seqs = [m.seq for m in get_messages_after("chat@g.us", 0, db=db)]
    assert len(seqs) == 80 and seqs == sorted(set(seqs))


def test_seq_cursor_is_commit_ordered_under_concurrent_writers(db: Database) -> None:
    """A reader that follows the seq cursor while four writers insert never
    finds a message behind its cursor (one committed with a smaller seq after
    it saw a bigger one), so it sees every message exactly once."""
    chat, writers, per_writer = "cursor@g.us", 4, 50
    errors: list[BaseException] = []
    done = threading.Event()
    seen: list[int] = []
    seen_ids: set[str] = set()
    behind: list[tuple[int, int]] = []  # (seq that showed up late, cursor at the time)

    def writer(n: int) -> None:
        for i in range(per_writer):
            _store(db, f"w{n}-{i}", chat=chat)

    def reader() -> None:
        last = 0
        try:
            while True:
                finished = done.is_set()  # read once more after the writers end
                new = get_messages_after(chat, last, db=db)
                for m in new:
                    assert m.seq > last, (m.seq, last)
                    assert m.id not in seen_ids, m.id
                    seen.append(m.seq)
                    seen_ids.add(m.id)
                    last = m.seq
                # Everything at or below the cursor must already have been seen.
                for m in get_messages_after(chat, 0, db=db):
                    if m.seq <= last and m.id not in seen_ids:
                        behind.append((m.seq, last))
                if finished or behind:
                    return
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    watcher = threading.Thread(target=reader)
    watcher.start()
    errors.extend(run_in_threads(writer, writers))
    done.set()
    watcher.join(timeout=60)
    assert not watcher.is_alive()
    assert not errors, errors
    assert behind == [], f"messages appeared behind the cursor: {behind[:5]}"
    assert len(seen) == writers * per_writer == len(set(seen))
    assert seen == sorted(seen)
    assert len(seen_ids) == writers * per_writer


def test_model_view_puts_a_runs_replies_before_messages_that_arrived_during_it(db: Database) -> None:
    q1 = _store(db, "q1", content="first question")
    # While the run answers q1, q2 arrives: its seq falls between the replies.
    _store(
        db,
        "r1",
        sender="tool_use",
        sender_name="bash",
        content="bash: ls",
        is_from_me=True,
        message_type="assistant",
        metadata={"reply_to_seq": q1.seq},
    )
    _store(db, "q2", content="second question")
    _store(
        db,
        "r2",
        sender="bot",
        sender_name="Andy",
        content="first answer",
        is_from_me=True,
        message_type="assistant",
        metadata={"reply_to_seq": q1.seq},
    )
    view = format_messages_for_sdk(get_messages_after("chat@g.us", 0, db=db))
    assert [m.content for m in view] == ["first question", "first answer", "second question"]


@pytest.mark.parametrize("db_backend", ["postgresql"])  # SQLite's reads are local calls: no round trips to save
def test_postgresql_reads_open_no_transaction_and_writes_still_do(db: Database) -> None:
    """A read is its statements alone (no BEGIN, no COMMIT: at READ COMMITTED each
    statement has its own snapshot anyway); a write on the same pooled connection
    afterwards is still one transaction, rolled back whole on an error."""
    from psycopg.pq import TransactionStatus

    def status(session: object) -> TransactionStatus:
        return session.connection().connection.dbapi_connection.info.transaction_status  # type: ignore[attr-defined]

    _store(db, "a")
    with db.read() as session:
        assert session.execute(text("SELECT count(*) FROM messages")).scalar_one() == 1
        assert status(session) is TransactionStatus.IDLE
    with pytest.raises(RuntimeError), db.write() as session:
        session.execute(text("DELETE FROM messages"))
        assert status(session) is TransactionStatus.INTRANS
        raise RuntimeError("half-way")
    with db.read() as session:
        assert session.execute(text("SELECT count(*) FROM messages")).scalar_one() == 1


def test_a_group_read_back_is_the_group_written_on_every_backend(db: Database) -> None:
    """get_group reads the row on the driver (store/groups.py): its booleans, JSON and
    NULLs come back as the model's types on both databases."""
    from sqlalchemy import update

    from orchestrator.store.groups import add_group, get_group, update_group
    from orchestrator.store.tables import GroupRow

    add_group(db, chat_jid="g@x", name="G", folder="g", requires_trigger=True, assistant_name="Zed")
    update_group(db, "g@x", {"runs_per_hour": 5})
    with db.write() as session:  # as sandbox/config.py stores it
        session.execute(update(GroupRow).where(GroupRow.chat_jid == "g@x").values(container_config={"memory_mb": 768}))
    group = get_group(db, "g@x")
    assert (group.is_main, group.requires_trigger, group.assistant_name) == (False, True, "Zed")
    assert group.container_config == {"memory_mb": 768}
    assert (group.runs_per_hour, group.tokens_per_day, group.session_id, group.placed_host) == (5, None, None, None)
    assert (group.cursor_seq, group.pending_seq) == (0, 0)
    add_group(db, chat_jid="m@x", name="M", folder="m", is_main=True, requires_trigger=True)
    main = get_group(db, "m@x")
    assert main.is_main and not main.requires_trigger and main.container_config is None
