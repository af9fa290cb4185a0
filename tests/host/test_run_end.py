"""How a run ends, on both databases: its records and what the chat is told.

The real pipeline with a fake sandbox (``fakes/sandbox.py``) and, for a
real model, the real model gateway with a fake Anthropic upstream on
loopback: tool results are stored with the ``tool_result`` sender (older
``command_output`` rows read the same), thinking with ``thinking``; every
run ends with a ``result_meta`` record (model, stop reason, usage, duration,
cost estimate) that reaches neither the model nor a channel; a run stopped
by a limit (turns, output tokens, token budget, time) says which and how to
raise it.  Also the price table, and the defaults compose passes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import text

from agent_runner.protocol import (
    AssistantEvent,
    ErrorEvent,
    ResultEvent,
    SdkToolUse,
    ThinkingEvent,
    ToolResultEvent,
    ToolUseEvent,
    Usage,
)
from fakes.anthropic_api import FakeAnthropic, message
from fakes.channel import RecordingChannel, attach_recorder
from fakes.clock import FakeClock
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.clock import Clock
from orchestrator.core.errors import SettingsError
from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.model.pricing import estimate_cost, price_of
from orchestrator.model.render import displayed, render
from orchestrator.model.views import format_messages_for_sdk
from orchestrator.run.assembly import rebuild_input, stored_input
from orchestrator.run.attempt import GATEWAY_SOCKET
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.sandbox.config import set_container_config
from orchestrator.sandbox.containers import GATEWAY_MOUNT
from orchestrator.store import leases
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group, get_group
from orchestrator.store.message_log import get_messages_after, store_message_direct
from orchestrator.store.runs import list_runs

JID = "main@local"
ROOT = Path(__file__).resolve().parents[2]


class Deadline(Exception):
    """Stands for Celery's SoftTimeLimitExceeded."""


def _pipeline(
    settings: Settings, db: Database, sandbox: FakeSandbox, clock: Clock | None = None, **changes: Any
) -> tuple[Pipeline, RecordingChannel]:
    ensure_main_group(db)
    rec = attach_recorder(db, JID)
    s = settings.replace(**{"max_attempts": 1, **changes})
    return Pipeline(
        s, db, ChannelRegistry([rec]), sandbox, clock=clock or FakeClock(), deadline_exceptions=(Deadline,)
    ), rec


def _say(p: Pipeline, text: str = "hello") -> StoredMessage:
    return ingest(p.db, p.settings, IncomingMessage(chat_jid=JID, sender="u", content=text), signal=None).message


def _history(p: Pipeline) -> list[StoredMessage]:
    return get_messages_after(JID, 0, db=p.db)


def _by(p: Pipeline, sender: str) -> list[StoredMessage]:
    return [m for m in _history(p) if m.sender == sender]


TOOL_RUN = Script(
    [
        ThinkingEvent(text="I should look at the files."),
        ToolUseEvent(id="toolu_1", name="bash", input={"command": "ls"}),
        ToolResultEvent(tool_use_id="toolu_1", name="bash", output="a.txt\n", exit_code=0),
        AssistantEvent(text="There is a.txt."),
        ResultEvent(usage=Usage(input_tokens=12, output_tokens=5), stop_reason="end_turn", num_turns=2),
    ]
)


def test_a_run_stores_tool_results_thinking_and_ends_with_its_record(settings: Settings, db: Database) -> None:
    sandbox = FakeSandbox(TOOL_RUN, Script([AssistantEvent(text="again"), ResultEvent(num_turns=1)]))
    p, rec = _pipeline(settings, db, sandbox)
    _say(p, "what is here?")
    [first] = p.drain_group(JID)

    history = _history(p)
    assert [(m.message_type, m.sender) for m in history] == [
        ("user", "u"),
        ("assistant", "thinking"),
        ("assistant", "tool_use"),
        ("tool_result", "tool_result"),
        ("assistant", "bot"),
        ("assistant", "result_meta"),
    ]
    meta_row = history[-1]
    meta = meta_row.metadata or {}
    assert meta["run_id"] == first.run.id and meta_row.id == f"{first.run.id}-meta"
    assert {k: meta[k] for k in ("provider", "model", "state", "stop_reason", "limit", "num_turns", "attempts")} == {
        "provider": "offline",
        "model": "offline",
        "state": "succeeded",
        "stop_reason": "end_turn",
        "limit": None,
        "num_turns": 2,
        "attempts": 1,
    }
    assert meta["usage"] == {
        "input_tokens": 12,
        "output_tokens": 5,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }
    assert meta["cost_usd"] is None and meta["cost_basis"] == "no price known for this model"
    assert isinstance(meta["duration_s"], float) and 0 <= meta["duration_s"] < 60
    assert meta_row.content.startswith("offline · end_turn · 2 turns · 12 in / 5 out tokens · ")
    assert meta_row.content.endswith("no cost estimate")

    # Channels got the person's message, the tool result and the reply: no thinking, no record.
    assert [(m.message_type, m.sender) for m in rec.sent] == [
        ("user", "u"),
        ("tool_result", "tool_result"),
        ("assistant", "bot"),
    ]
    assert not displayed(meta_row)

    # The next run's input: the tool call and its result (ids matched) and the reply,
    # never the thinking or the record.
    _say(p, "and now?")
    p.drain_group(JID)
    seen = sandbox.started[1][1].messages
    assert [(m.role, m.content) for m in seen] == [
        ("user", "what is here?"),
        ("assistant", "bash: ls"),
        ("tool_result", "a.txt\n"),
        ("assistant", "There is a.txt."),
        ("user", "and now?"),
    ]
    assert seen[1].tool_use == SdkToolUse(id="toolu_1", name="bash", input={"command": "ls"})
    assert seen[2].metadata == {"exit_code": 0} and seen[2].tool_use_id == "toolu_1"
    # The recorded inputs still rebuild byte for byte from the history, records and all.
    runs = {m.metadata["run_id"] for m in _by(p, "result_meta") if m.metadata}
    assert len(runs) == 2
    for run_id in runs:
        assert rebuild_input(p.db, p.settings, run_id) == stored_input(p.db, run_id)


def test_old_command_output_rows_read_as_tool_results_still_do(settings: Settings, db: Database) -> None:
    sandbox = FakeSandbox(Script([AssistantEvent(text="ok"), ResultEvent()]))
    p, _ = _pipeline(settings, db, sandbox)
    for sender in ("command_output", "tool_result"):
        store_message_direct(
            db=db,
            id=f"old-{sender}",
            chat_jid=JID,
            sender=sender,
            sender_name="bash",
            content=f"output of {sender}",
            timestamp="2026-01-01T00:00:00+00:00",
            is_from_me=True,
            message_type="tool_result",
            metadata={"exit_code": 1},
        )
    _say(p)
    p.drain_group(JID)
    seen = sandbox.started[0][1].messages
    assert [(m.role, m.content, m.metadata) for m in seen[:2]] == [
        ("tool_result", "output of command_output", {"exit_code": 1}),
        ("tool_result", "output of tool_result", {"exit_code": 1}),
    ]
    # Shown the same on a channel (stored directly here, so rendered rather than delivered).
    shown = [render(m, "Andy").text for m in _history(p) if m.message_type == "tool_result" and displayed(m)]
    assert shown == ["🔧 ❌ exit 1 · bash\noutput of command_output", "🔧 ❌ exit 1 · bash\noutput of tool_result"]


def test_result_meta_never_reaches_the_model(settings: Settings, db: Database) -> None:
    ensure_main_group(db)
    for i, sender in enumerate(("result_meta", "thinking", "bot")):
        store_message_direct(
            db=db,
            id=f"m{i}",
            chat_jid=JID,
            sender=sender,
            sender_name=sender,
            content=f"from {sender}",
            timestamp="2026-01-01T00:00:00+00:00",
            is_from_me=True,
            message_type="assistant",
        )
    view = format_messages_for_sdk(get_messages_after(JID, 0, db=db))
    assert [m.content for m in view] == ["from bot"]


def _host(p: Pipeline) -> str:
    [host] = [m.content for m in _by(p, "host")]
    return host


def _meta(p: Pipeline) -> dict[str, Any]:
    [row] = _by(p, "result_meta")
    assert row.metadata is not None
    return row.metadata


def test_a_run_stopped_by_its_turn_limit_says_so(settings: Settings, db: Database) -> None:
    sandbox = FakeSandbox(Script([AssistantEvent(text="half way"), ResultEvent(stop_reason="max_turns", num_turns=50)]))
    p, rec = _pipeline(settings, db, sandbox)
    _say(p)
    [outcome] = p.drain_group(JID)
    assert outcome.run.state == "succeeded"
    host = _host(p)
    assert host.startswith("⏹️ The run stopped after 50 model calls, its turn limit")
    assert "raise ORCHESTRATOR_MAX_TURNS (now 50)" in host and "continue" in host
    assert any(m.message_type == "host" and "turn limit" in m.text for m in rec.sent)  # people see it
    assert (_meta(p)["limit"], _meta(p)["stop_reason"]) == ("max_turns", "max_turns")
    assert sandbox.started[0][1].limits.max_turns == 50  # the default suits real tasks


def test_an_answer_cut_at_its_output_limit_says_so(settings: Settings, db: Database) -> None:
    sandbox = FakeSandbox(
        Script([AssistantEvent(text="the list is: 1, 2,"), ResultEvent(stop_reason="max_tokens", num_turns=1)])
    )
    p, _ = _pipeline(settings, db, sandbox, max_tokens=300)
    _say(p)
    p.drain_group(JID)
    assert _host(p) == (
        "✂️ The model's last answer was cut off at its output limit of 300 tokens. "
        "Raise ORCHESTRATOR_MAX_TOKENS (now 300) for longer answers."
    )


def test_a_run_stopped_by_its_time_limit_says_so(settings: Settings, db: Database) -> None:
    sandbox = FakeSandbox(Script([AssistantEvent(text="working")], exit_code=137, timed_out=True))
    p, _ = _pipeline(settings, db, sandbox, run_timeout_s=120.0)
    _say(p)
    [outcome] = p.drain_group(JID)
    assert outcome.run.state == "timed_out"
    assert _host(p) == (
        "⏱️ The run stopped at its time limit of 120 s, so the task may be unfinished. "
        "To give runs longer, raise ORCHESTRATOR_RUN_TIMEOUT_S (now 120 s)."
    )
    assert (_meta(p)["state"], _meta(p)["limit"]) == ("timed_out", "timeout")


def test_a_groups_own_shorter_time_limit_is_named(settings: Settings, db: Database) -> None:
    sandbox = FakeSandbox(Script([], exit_code=137, timed_out=True))
    p, _ = _pipeline(settings, db, sandbox, run_timeout_s=120.0)
    set_container_config(db, p.settings, JID, {"run_timeout_s": 30})
    _say(p)
    p.drain_group(JID)
    host = _host(p)
    assert host.startswith("⏱️ The run stopped at its time limit of 30 s")
    assert (
        f"raise this group's container_config run_timeout_s (now 30 s) with `orchestrator groups set {JID} "
        "--container-config ...`, up to ORCHESTRATOR_RUN_TIMEOUT_S (120 s)" in host
    )


def test_the_workers_task_limit_is_named(settings: Settings, db: Database) -> None:
    sandbox = FakeSandbox(Script([AssistantEvent(text="working")], raise_after_events=Deadline()))
    p, _ = _pipeline(settings, db, sandbox, run_timeout_s=120.0)
    _say(p)
    p.drain_group(JID)
    assert _host(p).startswith(
        "⏱️ The run stopped at the worker's time limit for a run (ORCHESTRATOR_RUN_TIMEOUT_S + 30 s, 150 s)"
    )


def test_an_ordinary_failure_is_still_an_agent_error(settings: Settings, db: Database) -> None:
    sandbox = FakeSandbox(Script([ErrorEvent(message="bad API key", retryable=False)], exit_code=1))
    p, _ = _pipeline(settings, db, sandbox)
    _say(p)
    p.drain_group(JID)
    assert _host(p) == "⚠️ Agent error: bad API key"
    assert (_meta(p)["state"], _meta(p)["limit"], _meta(p)["stop_reason"]) == ("failed", None, None)


def _gateway_socket(sandbox: FakeSandbox) -> str:
    """The run's gateway socket on the host, as a short path (the run folder's may be long)."""
    spec = sandbox.started[-1][0]
    folder = next(host for host, inside in spec.readonly_mounts.items() if inside == GATEWAY_MOUNT)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{GATEWAY_SOCKET}"


def test_a_run_through_the_gateway_is_held_counted_priced_and_stopped_by_its_budget(
    settings: Settings, db: Database
) -> None:
    """A real model through the real gateway: the agent (played here, on the gateway's
    socket) asks for another model (refused), spends, then asks for more than is left."""
    fake = FakeAnthropic(message([{"type": "text", "text": "ok"}], "end_turn", n=3, cache_read=10))
    answers: list[tuple[int, str]] = []

    def agent(index: int) -> None:
        if index != 0:
            return
        uds = _gateway_socket(sandbox)
        with httpx.Client(transport=httpx.HTTPTransport(uds=uds), base_url="http://gateway", timeout=10) as c:
            for model, cap in (("claude-opus-4-1", 10), ("claude-sonnet-4-5", 10), ("claude-sonnet-4-5", 50)):
                resp = c.post("/v1/messages", json={"model": model, "max_tokens": cap, "messages": []})
                answers.append((resp.status_code, resp.json().get("error", {}).get("type", "")))

    sandbox = FakeSandbox(
        Script(
            [AssistantEvent(text="spent"), ErrorEvent(message="Anthropic API error 403: budget", retryable=False)],
            exit_code=1,
            before_event=agent,
        )
    )
    with fake.serve() as upstream:
        p, _ = _pipeline(
            settings,
            db,
            sandbox,
            model="anthropic:claude-sonnet-4-5",
            anthropic_base_url=upstream,
            anthropic_api_key="k",
            run_token_budget=80,
            max_tokens=64,
        )
        _say(p)
        [outcome] = p.drain_group(JID)
    assert answers == [(403, "model_not_allowed"), (200, ""), (403, "budget_exceeded")]
    assert [c.body["model"] for c in fake.calls] == ["claude-sonnet-4-5"]
    assert outcome.run.state == "failed"
    assert _host(p).startswith(
        "🪙 The run stopped at its token budget (43 of 80 tokens spent, and its next request did not fit)"
    )
    assert "raise ORCHESTRATOR_RUN_TOKEN_BUDGET" in _host(p)
    meta = _meta(p)
    assert (meta["provider"], meta["model"], meta["limit"]) == ("anthropic", "claude-sonnet-4-5", "token_budget")
    # The gateway's count: 30 input + 10 cache reads, 3 output.
    assert meta["usage"] == {
        "input_tokens": 40,
        "output_tokens": 3,
        "cache_read_input_tokens": 10,
        "cache_creation_input_tokens": 0,
    }
    assert meta["cost_usd"] == pytest.approx((30 * 3 + 10 * 0.3 + 3 * 15) / 1e6)
    assert meta["cost_basis"].startswith("an estimate at list prices of ")
    assert "≈ $0.0001 (estimate)" in _by(p, "result_meta")[0].content


def test_a_thinking_budget_reaches_the_input_of_anthropic_runs_only(settings: Settings, db: Database) -> None:
    sandbox = FakeSandbox(Script([AssistantEvent(text="ok"), ResultEvent()]))
    p, _ = _pipeline(settings, db, sandbox, thinking_budget=1024, max_tokens=2048)
    _say(p)
    p.drain_group(JID)
    assert b"thinking_budget" not in (stored_input(db, sandbox.started[0][1].run_id) or b"")  # offline: ignored
    from orchestrator.run.model_choice import model_settings

    assert model_settings(p.settings.replace(model="anthropic:claude-x")).thinking_budget == 1024
    assert (
        b'"thinking_budget"'
        not in model_settings(p.settings.replace(model="anthropic:claude-x", thinking_budget=0)).to_json()
    )


def test_the_thinking_budget_is_checked_against_max_tokens() -> None:
    assert (
        Settings.load(
            env_file=None, environ={"ORCHESTRATOR_THINKING_BUDGET": "1024", "ORCHESTRATOR_MAX_TOKENS": "4096"}
        ).provider.thinking_budget
        == 1024
    )
    for budget, cap in (("1024", "1024"), ("500", "4096")):
        with pytest.raises(SettingsError, match="ORCHESTRATOR_THINKING_BUDGET=.*ORCHESTRATOR_MAX_TOKENS"):
            Settings.load(
                env_file=None, environ={"ORCHESTRATOR_THINKING_BUDGET": budget, "ORCHESTRATOR_MAX_TOKENS": cap}
            )


@pytest.mark.parametrize(
    ("provider", "model", "known"),
    [
        ("anthropic", "claude-sonnet-4-5-20250929", True),
        ("anthropic", "claude-sonnet-4-5", True),
        ("anthropic", "claude-opus-4-5-20251101", True),
        ("anthropic", "claude-3-5-sonnet-latest", True),
        ("openai", "gpt-4o-2024-08-06", True),
        ("openai", "gpt-4o-mini", True),
        # never a guess from a similar name
        ("anthropic", "claude-opus-4-6", False),
        ("anthropic", "claude-sonnet-4-5-turbo", False),
        ("openai", "llama3.1:8b", False),
        ("openai", "gpt-oss:20b", False),
        ("anthropic", "gpt-4o", False),
        ("offline", "offline", False),
    ],
)
def test_prices_are_known_by_family_or_not_at_all(provider: str, model: str, known: bool) -> None:
    assert (price_of(provider, model) is not None) is known
    cost = estimate_cost(provider, model, Usage(input_tokens=1_000_000, output_tokens=0))
    assert (cost is not None) is known


def test_cost_estimates_price_cache_reads_and_writes_apart() -> None:
    # Sonnet: $3 in, $15 out per million; cache writes 1.25x, reads 0.1x the input price.
    usage = Usage(
        input_tokens=1_000_000 + 200_000 + 800_000,
        output_tokens=100_000,
        cache_creation_input_tokens=200_000,
        cache_read_input_tokens=800_000,
    )
    assert estimate_cost("anthropic", "claude-sonnet-4-5", usage) == pytest.approx(3 + 0.75 + 0.24 + 1.5)
    assert estimate_cost("anthropic", "claude-opus-4-5", Usage(input_tokens=1_000_000)) == pytest.approx(5)
    assert estimate_cost("anthropic", "claude-opus-4-1", Usage(input_tokens=1_000_000)) == pytest.approx(15)


def test_the_defaults_suit_real_work_and_compose_passes_them() -> None:
    defaults = Settings.load(env_file=None, environ={})
    assert (defaults.provider.max_turns, defaults.provider.run_token_budget, defaults.gateway.model_policy) == (
        50,
        1_000_000,
        "refuse",
    )
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    env = (
        compose["x-orchestrator"]["environment"]
        if "x-orchestrator" in compose
        else compose["services"]["worker"]["environment"]
    )
    expected = {
        "ORCHESTRATOR_MAX_TURNS": defaults.provider.max_turns,
        "ORCHESTRATOR_RUN_TOKEN_BUDGET": defaults.provider.run_token_budget,
        "ORCHESTRATOR_THINKING_BUDGET": defaults.provider.thinking_budget,
        "ORCHESTRATOR_GATEWAY_MODEL_POLICY": defaults.gateway.model_policy,
    }
    for name, value in expected.items():
        assert env[name] == f"${{{name}:-{value}}}", name


def _refuse_run_ends(db: Database) -> None:
    """A trigger that fails the statement ending a run (``finished_at`` set), on either database."""
    with db.write() as session:
        if db.is_sqlite:
            session.execute(
                text(
                    "CREATE TRIGGER refuse_end BEFORE UPDATE OF finished_at ON runs "
                    "WHEN NEW.finished_at IS NOT NULL BEGIN SELECT RAISE(ABORT, 'refused end'); END"
                )
            )
        else:
            session.execute(
                text(
                    "CREATE FUNCTION refuse_end() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RAISE EXCEPTION 'refused end'; END $$"
                )
            )
            session.execute(
                text(
                    "CREATE TRIGGER refuse_end BEFORE UPDATE OF finished_at ON runs FOR EACH ROW "
                    "WHEN (NEW.finished_at IS NOT NULL) EXECUTE FUNCTION refuse_end()"
                )
            )


def test_a_runs_end_is_one_transaction_and_a_failed_end_still_lets_the_lease_go(
    settings: Settings,
    db: Database,
) -> None:
    """The run's record, the cursor's move, the lease's release and the run row's end commit
    together: when the end fails, none of them is left half done (no record without an
    ended run, no cursor past an unended run), and the step still lets go of the lease."""
    sandbox = FakeSandbox(
        Script([AssistantEvent(text="hi there"), ResultEvent(num_turns=1)]),
        Script([AssistantEvent(text="again"), ResultEvent(num_turns=1)]),
    )
    p, _ = _pipeline(settings, db, sandbox)
    asked = _say(p)
    _refuse_run_ends(db)
    with pytest.raises(db.driver_errors, match="refused end"):  # the driver's own (fixed SQL)
        p.step(JID)
    # The reply (its own transaction, before the end) stands; the end's record does not.
    assert [m.sender for m in _history(p)] == ["u", "bot"]
    group = get_group(db, JID)
    assert group.cursor_seq < asked.seq <= group.pending_seq
    [run] = list_runs(db, chat_jid=JID)
    assert run.finished_at is None
    # The lease was let go of: another worker takes the group at once.
    assert leases.acquire(db, JID, "another-worker", 30)
    leases.release(db, JID, "another-worker")

    # With the end allowed again, the next step's holder closes the run the failed end left
    # (a reply was stored: the cursor moves past its batch, no second answer).
    with db.write() as session:
        session.execute(text("DROP TRIGGER refuse_end" + ("" if db.is_sqlite else " ON runs")))
    p2 = Pipeline(p.settings, db, p.channels, sandbox, clock=p.clock)
    assert p2.step(JID).recovered == [run.id]
    assert get_group(db, JID).cursor_seq >= asked.seq
    assert [m.sender for m in _by(p, "bot")] == ["bot"]
