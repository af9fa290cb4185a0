"""conversation.build_messages: the host's history as provider messages, earlier
runs' tool calls as real tool_use/tool_result blocks, every call paired with
its result in the very next message (what Anthropic and OpenAI both insist on),
and the Anthropic request that carries them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runner_harness import make_input

from agent_runner.conversation import HISTORY_START, build_messages
from agent_runner.loop import run_agent
from agent_runner.protocol import Event, ModelSettings, SdkMessage, SdkToolUse, decode_input
from agent_runner.providers import anthropic as anthropic_wire
from agent_runner.providers import openai_request
from agent_runner.providers.anthropic import AnthropicProvider
from agent_runner.providers.base import ProviderMessage, ToolResultBlock, ToolUseBlock
from fakes.anthropic_api import FakeAnthropic, PromptCache, message, serve_tcp

__all__ = ["serve_tcp"]  # a fixture, used by name


def user(text: str) -> SdkMessage:
    return SdkMessage(role="user", content=text)


def said(text: str) -> SdkMessage:
    return SdkMessage(role="assistant", content=text)


def call(cid: str, command: str = "ls") -> SdkMessage:
    return SdkMessage(
        role="assistant",
        content=f"bash: {command}",
        tool_use=SdkToolUse(id=cid, name="bash", input={"command": command}),
    )


def result(cid: str | None, output: str = "a.txt", code: int = 0) -> SdkMessage:
    msg = SdkMessage(role="tool_result", content=output, sender_name="bash", metadata={"exit_code": code})
    return msg if cid is None else msg.replace(tool_use_id=cid)


def blocks(messages: list[ProviderMessage]) -> list[tuple[str, list[str]]]:
    """Each message as its role and a short name for each block."""

    def name(b: Any) -> str:
        if isinstance(b, ToolUseBlock):
            return f"use {b.id}"
        if isinstance(b, ToolResultBlock):
            return f"result {b.tool_use_id}"
        return f"text {b.text}"

    return [(m.role, [name(b) for b in m.content]) for m in messages]


def test_earlier_tool_calls_become_tool_blocks_of_one_model_turn() -> None:
    out = build_messages(
        [
            user("list"),
            said("Looking."),
            call("t1"),
            call("t2", "pwd"),
            result("t1"),
            result("t2", "/ws", 2),
            said("Done."),
            user("thanks"),
        ]
    )
    assert blocks(out) == [
        ("user", ["text list"]),
        ("assistant", ["text Looking.", "use t1", "use t2"]),
        ("user", ["result t1", "result t2"]),
        ("assistant", ["text Done."]),
        ("user", ["text thanks"]),
    ]
    assert out[1].content[1] == ToolUseBlock(id="t1", name="bash", input={"command": "ls"})
    assert out[2].content[1] == ToolResultBlock(tool_use_id="t2", content="/ws", exit_code=2)


def test_results_come_before_the_text_of_their_user_turn() -> None:
    # A run stopped by its turn limit after a call: its result, then the next message.
    out = build_messages([user("go"), call("t1"), result("t1"), user("and?")])
    assert blocks(out)[-1] == ("user", ["result t1", "text and?"])


def test_unpaired_calls_are_left_out_and_unpaired_results_become_text() -> None:
    out = build_messages(
        [
            user("go"),
            call("lost"),  # its result was cut off
            user("next"),
            result("orphan", "late", 1),  # its call was cut off
            said("ok"),
            call("t1"),
            call("t2"),
            result("t1"),  # t2 never answered
            user("end"),
        ]
    )
    assert blocks(out) == [
        ("user", ["text go\n\nnext\n\n[tool_result exit_code=1]\nlate"]),
        ("assistant", ["text ok", "use t1"]),
        ("user", ["result t1", "text end"]),
    ]


def test_a_history_that_starts_with_a_call_gets_a_user_turn_first() -> None:
    out = build_messages([call("t1"), result("t1"), user("q")])
    assert blocks(out) == [
        ("user", [f"text {HISTORY_START}"]),
        ("assistant", ["use t1"]),
        ("user", ["result t1", "text q"]),
    ]


def test_an_id_used_again_is_renamed_with_its_result() -> None:
    # Ids are unique within a run; two runs of the offline model both say toolu_offline_0_0.
    out = build_messages(
        [
            user("a"),
            call("t"),
            result("t", "one"),
            said("1"),
            user("b"),
            call("t"),
            result("t", "two"),
            said("2"),
            user("c"),
        ]
    )
    ids = [
        (b.id if isinstance(b, ToolUseBlock) else b.tool_use_id)
        for m in out
        for b in m.content
        if isinstance(b, ToolUseBlock | ToolResultBlock)
    ]
    assert ids == ["t", "t", "t_2", "t_2"]


def test_history_without_tool_fields_reads_as_before() -> None:
    # A recorded input from before the fields: tool results as marked user text.
    out = build_messages([user("go"), result(None, "out", 0), said("done"), user("thanks")])
    assert blocks(out) == [
        ("user", ["text go\n\n[tool_result exit_code=0]\nout"]),
        ("assistant", ["text done"]),
        ("user", ["text thanks"]),
    ]


def _wellformed_for_both_apis(out: list[ProviderMessage]) -> None:
    wire = anthropic_wire.messages_to_wire(out)
    assert [m["role"] for m in wire] == ["user", "assistant"] * (len(wire) // 2) + ["user"] * (len(wire) % 2)
    for i, m in enumerate(wire):
        uses = [b["id"] for b in m["content"] if b["type"] == "tool_use"]
        if uses:
            following = wire[i + 1]["content"]
            results = [b["tool_use_id"] for b in following if b["type"] == "tool_result"]
            assert results == uses and following[: len(results)] == [b for b in following if b["type"] == "tool_result"]
    chat = openai_request.messages_to_wire("sys", out)
    for i, m in enumerate(chat):
        for j, c in enumerate(m.get("tool_calls") or []):
            assert chat[i + 1 + j]["role"] == "tool" and chat[i + 1 + j]["tool_call_id"] == c["id"]


def test_every_shape_is_well_formed_for_anthropic_and_openai() -> None:
    histories = [
        [user("a"), said("x"), call("t1"), result("t1"), said("y"), user("b")],
        [call("t1"), result("t1"), call("t2"), result("t2"), user("b")],
        [user("a"), call("t1"), user("mid"), result("t1"), user("b")],
        [result("t9"), user("a"), call("t1"), call("t1"), result("t1"), result("t1"), user("b")],
    ]
    for history in histories:
        _wellformed_for_both_apis(build_messages(history))


def test_the_api_receives_earlier_tool_calls_as_tool_blocks_with_cache_breakpoints(
    serve_tcp: Any, tmp_path: Path
) -> None:
    cache = PromptCache(min_tokens=1)
    fake = FakeAnthropic(
        message([{"type": "text", "text": "first"}], "end_turn"),
        message([{"type": "text", "text": "second"}], "end_turn"),
        prompt_cache=cache,
    )
    model = ModelSettings(provider="anthropic", model="claude-fake", max_tokens=100, base_url=serve_tcp(fake))
    history = [
        json.loads(m.to_json())
        for m in [user("make f"), call("toolu_x", "touch f"), result("toolu_x", ""), said("Made f.")]
    ]
    events: list[Event] = []
    inp = decode_input(json.dumps(make_input(*history, "and now?", model=json.loads(model.to_json()))))
    run_agent(inp, AnthropicProvider(model), events.append, workspace=tmp_path)
    inp2 = decode_input(
        json.dumps(
            make_input(
                *history,
                "and now?",
                {"role": "assistant", "content": "first"},
                "more?",
                model=json.loads(model.to_json()),
            )
        )
    )
    run_agent(inp2, AnthropicProvider(model), events.append, workspace=tmp_path)

    body = fake.requests[0]
    sent = body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant", "user"]
    assert sent[1]["content"] == [
        {"type": "tool_use", "id": "toolu_x", "name": "bash", "input": {"command": "touch f"}}
    ]
    (done,) = sent[2]["content"]
    assert done["type"] == "tool_result" and done["tool_use_id"] == "toolu_x"
    assert sent[-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    # The second run repeats the first run's prompt: it is read from the cache.
    first, second = (reply[1]["usage"] for reply in fake.sent)
    assert first["cache_read_input_tokens"] == 0 and first["cache_creation_input_tokens"] > 0
    assert second["cache_read_input_tokens"] == first["cache_creation_input_tokens"] + first["input_tokens"]
