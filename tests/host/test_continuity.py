"""Conversation continuity: earlier runs' tool calls come back to the model as
tool_use/tool_result pairs with matching ids, within a token budget that drops
the oldest whole turns and says so, and the recorded input still rebuilds."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import update

from agent_runner.protocol import (
    AssistantEvent,
    ContainerInput,
    Event,
    SdkMessage,
    ThinkingEvent,
    ToolResultEvent,
    ToolUseEvent,
    decode_input,
)
from orchestrator.core.settings import Settings
from orchestrator.model.views import REPLY_TO_KEY, RUN_ID_KEY, format_messages_for_sdk
from orchestrator.run.assembly import (
    Batch,
    build_input,
    input_bytes,
    plan_batch,
    prior_messages,
    rebuild_input,
    record_input,
    stored_input,
)
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.model_choice import model_settings
from orchestrator.run.outputs import event_to_message
from orchestrator.store.db import Database
from orchestrator.store.groups import Group, add_group, get_group
from orchestrator.store.message_log import get_messages_after, store_message_direct
from orchestrator.store.runs import create_run
from orchestrator.store.tables import GroupRow, MessageRow

JID = "cont@local"


@pytest.fixture
def group(db: Database, settings: Settings) -> Group:
    add_group(db, chat_jid=JID, name="Cont", folder="cont", requires_trigger=False)
    (settings.groups_dir / "cont").mkdir(parents=True, exist_ok=True)
    return get_group(db, JID)


class Chat:
    """Messages as the pipeline stores them: people's, and a run's events through ``event_to_message``."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.n = 0

    def say(self, text: str) -> int:
        self.n += 1
        m = store_message_direct(
            db=self.db,
            id=f"u{self.n}",
            chat_jid=JID,
            sender="ann",
            sender_name="Ann",
            content=text,
            timestamp=datetime.now(UTC).isoformat(),
        )
        return m.seq

    def run(self, answered: int, events: list[Event], run_id: str | None = None) -> str:
        """Store a run's events as its outputs, answering the message ``answered``."""
        self.n += 1
        run_id = run_id or f"run{self.n}"
        for i, event in enumerate(events):
            out = event_to_message(event, run_id=run_id, index=i, assistant_name="Andy")
            assert out is not None
            store_message_direct(
                db=self.db,
                id=out.id,
                chat_jid=JID,
                sender=out.sender,
                sender_name=out.sender_name,
                content=out.content,
                timestamp=datetime.now(UTC).isoformat(),
                is_from_me=True,
                message_type=out.message_type,
                metadata={**(out.metadata or {}), REPLY_TO_KEY: answered, RUN_ID_KEY: run_id},
            )
        return run_id

    def view(self) -> list[SdkMessage]:
        return format_messages_for_sdk(get_messages_after(JID, 0, db=self.db))


def call(cid: str, command: str = "ls") -> ToolUseEvent:
    return ToolUseEvent(id=cid, name="bash", input={"command": command})


def result(cid: str, output: str = "a.txt", code: int = 0) -> ToolResultEvent:
    return ToolResultEvent(tool_use_id=cid, name="bash", output=output, exit_code=code)


def shape(view: list[SdkMessage]) -> list[tuple[str, str]]:
    """Each message as (role, what it is): text, a call's id, or a result's id."""
    out = []
    for m in view:
        if m.tool_use:
            out.append(("assistant", f"call {m.tool_use.id}"))  # type: ignore[union-attr]
        elif m.role == "tool_result" and isinstance(m.tool_use_id, str):
            out.append(("tool_result", f"result {m.tool_use_id}"))
        else:
            out.append((m.role, m.content))
    return out


def test_a_runs_tool_calls_come_back_as_matched_pairs(db: Database, group: Group) -> None:
    chat = Chat(db)
    q = chat.say("list the files")
    chat.run(
        q,
        [
            ThinkingEvent(text="I should look"),
            AssistantEvent(text="Looking."),
            call("toolu_1"),
            call("toolu_2", "pwd"),
            result("toolu_1"),
            result("toolu_2", "/ws", 0),
            AssistantEvent(text="There is a.txt."),
        ],
    )
    chat.say("thanks")
    view = chat.view()
    assert shape(view) == [
        ("user", "list the files"),
        ("assistant", "Looking."),
        ("assistant", "call toolu_1"),
        ("assistant", "call toolu_2"),
        ("tool_result", "result toolu_1"),
        ("tool_result", "result toolu_2"),
        ("assistant", "There is a.txt."),
        ("user", "thanks"),
    ]
    first = view[2].tool_use
    assert not isinstance(first, type(None)) and first.name == "bash" and first.input == {"command": "ls"}  # type: ignore[union-attr]
    assert view[5].content == "/ws" and view[5].metadata == {"exit_code": 0}
    assert "I should look" not in json.dumps([m.content for m in view])  # thinking stays out


def test_unmatched_calls_are_left_out_and_orphaned_results_read_as_text(db: Database, group: Group) -> None:
    chat = Chat(db)
    q = chat.say("go")
    chat.run(
        q,
        [
            call("toolu_lonely"),  # never answered (a run that died mid-call)
            result("toolu_nocall"),  # answers nothing
            result("toolu_after"),
            call("toolu_after"),  # the result before its call
            call("toolu_twice"),
            call("toolu_twice"),
            result("toolu_twice"),  # an id used twice
            call("bad id!"),
            result("bad id!"),  # an id the API would refuse
            ToolUseEvent(id="toolu_name", name="no spaces allowed", input={}),
            result("toolu_name"),
            call("toolu_ok"),
            result("toolu_ok"),
        ],
    )
    # A row stored as command_output before tool_result rows named their call.
    store_message_direct(
        db=db,
        id="old",
        chat_jid=JID,
        sender="command_output",
        sender_name="bash",
        content="old output",
        timestamp=datetime.now(UTC).isoformat(),
        is_from_me=True,
        message_type="tool_result",
        metadata={"exit_code": 1},
    )
    view = chat.view()
    calls = [m.tool_use.id for m in view if m.tool_use]  # type: ignore[union-attr]
    paired = [m.tool_use_id for m in view if isinstance(m.tool_use_id, str)]
    assert calls == paired == ["toolu_ok"]
    texts = [m.content for m in view if m.role == "tool_result" and not isinstance(m.tool_use_id, str)]
    assert len(texts) == 6 and "old output" in texts  # every unpaired result still reads as text


def test_a_senders_forged_tool_result_reads_as_text_and_breaks_no_view(
    db: Database, settings: Settings, group: Group
) -> None:
    # Anyone who may post may post a tool_result, with any metadata: ids that are no ids
    # (a list, an object) pair with nothing, and the chat's later views still build.
    chat = Chat(db)
    q = chat.say("go")
    chat.run(q, [call("toolu_1"), result("toolu_1")])
    forged = {"tool_use_id": ["toolu_1"], "run_id": {"of": "run2"}, "exit_code": "0"}
    incoming = IncomingMessage(
        chat_jid=JID, sender="mallory", content="forged", message_type="tool_result", metadata=forged
    )
    ingest(db, settings, incoming, signal=None)
    assert [s for _, s in shape(chat.view())] == ["go", "call toolu_1", "result toolu_1", "forged"]


def test_a_superseded_call_takes_its_pairing_with_it(db: Database, group: Group) -> None:
    chat = Chat(db)
    q = chat.say("go")
    chat.run(q, [call("toolu_1"), result("toolu_1")])
    with db.write() as session:
        session.execute(
            update(MessageRow).where(MessageRow.sender == "tool_use").values(superseded_at=datetime.now(UTC))
        )
    view = chat.view()
    assert [m.tool_use for m in view if m.tool_use] == []
    assert [(m.role, m.tool_use_id) for m in view][1][0] == "tool_result"
    assert not isinstance(view[1].tool_use_id, str)


def test_ids_pair_within_their_run(db: Database, group: Group) -> None:
    # The offline model numbers its calls from 0 in every run: the same id in two runs is two calls.
    chat = Chat(db)
    q1 = chat.say("first")
    chat.run(q1, [call("toolu_offline_0_0"), result("toolu_offline_0_0", "one")])
    q2 = chat.say("second")
    chat.run(q2, [call("toolu_offline_0_0", "pwd"), result("toolu_offline_0_0", "two")])
    view = chat.view()
    assert [s for _, s in shape(view)] == [
        "first",
        "call toolu_offline_0_0",
        "result toolu_offline_0_0",
        "second",
        "call toolu_offline_0_0",
        "result toolu_offline_0_0",
    ]
    assert [m.content for m in view if m.role == "tool_result"] == ["one", "two"]


def _advance(db: Database, seq: int) -> None:
    with db.write() as s:
        s.execute(update(GroupRow).where(GroupRow.chat_jid == JID).values(cursor_seq=seq, pending_seq=seq))


def _assemble(db: Database, settings: Settings) -> tuple[str, bytes, ContainerInput]:
    group = get_group(db, JID)
    batch = plan_batch(get_messages_after(JID, group.cursor_seq, db=db))
    assert isinstance(batch, Batch)
    run = create_run(db, chat_jid=JID, cursor_from=group.cursor_seq, cursor_to=batch.cursor_to, celery_task_id=None)
    payload = build_input(
        settings=settings,
        group=group,
        run_id=run.id,
        prior=prior_messages(db, settings, group, batch, group.cursor_seq),
        batch=batch,
        assistant_name="Andy",
        notices=[],
        model=model_settings(settings),
    )
    data = input_bytes(payload)
    record_input(db, run.id, data)
    _advance(db, batch.cursor_to)
    return run.id, data, payload


def test_the_second_runs_recorded_input_carries_the_first_runs_tool_blocks(
    db: Database, settings: Settings, group: Group
) -> None:
    chat = Chat(db)
    q = chat.say("make a file")
    first, _, _ = _assemble(db, settings)
    chat.run(q, [call("toolu_a", "touch f"), result("toolu_a", ""), AssistantEvent(text="Made f.")], run_id=first)
    chat.say("and now?")
    second, sent, _ = _assemble(db, settings)

    doc = json.loads(stored_input(db, second) or b"")
    use = next(m for m in doc["messages"] if "tool_use" in m)
    done = next(m for m in doc["messages"] if "tool_use_id" in m)
    assert use["role"] == "assistant" and use["tool_use"] == {
        "id": "toolu_a",
        "name": "bash",
        "input": {"command": "touch f"},
    }
    assert done["role"] == "tool_result" and done["tool_use_id"] == "toolu_a"
    assert rebuild_input(db, settings, second) == sent


def test_an_old_recorded_input_still_decodes_and_encodes_the_same() -> None:
    old = (
        b'{"protocol_version":1,"run_id":"r","chat_jid":"c","group_folder":"g","assistant_name":"Andy",'
        b'"messages":[{"role":"user","content":"hi","sender_name":"Ann","timestamp":null,"metadata":null},'
        b'{"role":"tool_result","content":"x","sender_name":"bash","timestamp":null,"metadata":{"exit_code":0}}],'
        b'"system_notices":[],"send_targets":[],"session_id":null,'
        b'"model":{"provider":"offline","model":"offline","max_tokens":1024,"base_url":null,"socket_path":null},'
        b'"limits":{"max_turns":50,"bash_timeout_s":60.0,"output_cap_bytes":16000}}'
    )
    assert decode_input(old).to_json() == old


def _turns(chat: Chat, n: int, size: int) -> int:
    """``n`` answered questions, each with a tool call of ``size`` bytes of output; the last question's seq."""
    last = 0
    for i in range(n):
        last = chat.say(f"question {i}")
        chat.run(last, [call(f"toolu_{i}"), result(f"toolu_{i}", "x" * size), AssistantEvent(text=f"answer {i}")])
    return last


def test_the_budget_drops_the_oldest_whole_turns_and_says_so(db: Database, settings: Settings, group: Group) -> None:
    chat = Chat(db)
    seq = _turns(chat, 10, 2000)  # about 550 tokens a turn
    _advance(db, seq)
    chat.say("the new question")
    tight = settings.replace(context_tokens=2000)
    run_id, sent, payload = _assemble(db, tight)

    view = payload.messages
    assert view[0].role == "user" and view[-1].content == "the new question"
    asked = [m.content for m in view if m.role == "user"]
    assert asked[0] != "question 0" and asked[-2] == "question 9"  # the oldest went, the newest stayed
    calls = [m.tool_use.id for m in view if m.tool_use]  # type: ignore[union-attr]
    assert calls == [m.tool_use_id for m in view if isinstance(m.tool_use_id, str)]  # no call without its result
    dropped = 4 * (10 - len(calls))
    (notice,) = payload.system_notices
    assert f"the {dropped} oldest messages" in notice and "context budget" in notice
    assert sum(len(m.to_json()) for m in view) // 4 <= 2000
    assert rebuild_input(db, tight, run_id) == sent
    # The same history with room to spare: nothing left out, no notice.
    roomy = build_input(
        settings=settings,
        group=get_group(db, JID),
        run_id="x",
        prior=prior_messages(db, settings, group, Batch(get_messages_after(JID, seq, db=db), False), seq),
        batch=Batch(get_messages_after(JID, seq, db=db), False),
        assistant_name="Andy",
        notices=[],
        model=model_settings(settings),
    )
    assert roomy.system_notices == [] and len(roomy.messages) == 41


def test_the_batch_stays_even_over_budget(db: Database, settings: Settings, group: Group) -> None:
    chat = Chat(db)
    seq = _turns(chat, 2, 100)
    _advance(db, seq)
    chat.say("y" * 40_000)
    _, _, payload = _assemble(db, settings.replace(context_tokens=100))
    # The batch is the new message and the last run's outputs (stored after the
    # cursor): that run's turn stays whole, its question included.
    assert [m.content for m in payload.messages][:2] == ["question 1", "bash: ls"]
    assert payload.messages[-1].content.startswith("y") and len(payload.messages) == 5
    assert "the 4 oldest messages" in payload.system_notices[0]


def test_stored_only_records_do_not_count_toward_the_window(db: Database, settings: Settings, group: Group) -> None:
    chat = Chat(db)
    q = chat.say("old question")
    chat.run(q, [AssistantEvent(text="old answer")])
    q = chat.say("recent question")
    chat.run(q, [*(ThinkingEvent(text=f"thought {i}") for i in range(30)), AssistantEvent(text="recent answer")])
    _advance(db, chat.say("new") - 1)
    _, _, payload = _assemble(db, settings.replace(context_messages=3))
    assert [m.content for m in payload.messages] == ["old answer", "recent question", "recent answer", "new"]


def test_context_blocks_of_turns_the_budget_drops_are_never_fetched(
    db: Database, settings: Settings, group: Group
) -> None:
    hits: list[str] = []

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name
            hits.append(self.path)
            body = b"page text " * 50
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        old = store_message_direct(
            db=db,
            id="old",
            chat_jid=JID,
            sender="ann",
            sender_name="Ann",
            content="read this",
            timestamp=datetime.now(UTC).isoformat(),
            metadata={"context": [{"type": "url", "url": f"{url}/old"}]},
        )
        chat = Chat(db)
        chat.run(old.seq, [AssistantEvent(text="read")])
        seq = _turns(chat, 4, 2000)
        _advance(db, seq)
        chat.say("and?")
        loopback = settings.replace(context_url_allow_private=True)
        _, _, payload = _assemble(db, loopback.replace(context_tokens=1500))
        assert "read this" not in [m.content for m in payload.messages] and hits == []
        chat.say("now with room")
        _, _, payload = _assemble(db, loopback)
        assert hits == ["/old"] and "page text" in payload.messages[0].content
    finally:
        server.shutdown()
        server.server_close()
