"""Anthropic extended thinking in the runner, against the fake Messages API.

With a thinking budget in the input the provider asks for thinking, the
loop reports the model's thinking as ``thinking`` events, and a tool turn's
thinking (signed, or redacted) goes back to the API as it came, which the
API requires; without one the request never mentions thinking.  The cache
counts the API reports reach the run's result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from runner_harness import RunRunner, make_input

from agent_runner.loop import run_agent
from agent_runner.protocol import Event, ModelSettings, ResultEvent, TextDeltaEvent, ThinkingEvent, decode_input
from agent_runner.providers.anthropic import AnthropicProvider
from fakes.anthropic_api import FakeAnthropic, message, serve_tcp

__all__ = ["serve_tcp"]  # a fixture, used by name

THOUGHT = "The user wants the date; the shell has it."
SIGNATURE = "EqQBCkYIARgCIkBsig=="
REDACTED = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"


def thinking_then_text() -> FakeAnthropic:
    return FakeAnthropic(
        message(
            [
                {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE},
                {"type": "redacted_thinking", "data": REDACTED},
                {"type": "tool_use", "id": "toolu_t1", "name": "bash", "input": {"command": "echo today"}},
            ],
            "tool_use",
            n=1,
            cache_creation=50,
            cache_read=0,
        ),
        message(
            [
                {"type": "thinking", "thinking": "It printed today.", "signature": "sig2"},
                {"type": "text", "text": "It is today."},
            ],
            "end_turn",
            n=2,
            cache_read=50,
        ),
    )


def model(base_url: str, **extra: Any) -> ModelSettings:
    return ModelSettings(provider="anthropic", model="claude-fake", max_tokens=4096, base_url=base_url, **extra)


def run_with(provider: AnthropicProvider, workspace: Path) -> list[Event]:
    events: list[Event] = []
    inp = decode_input(json.dumps(make_input("what day is it?")))

    def keep(event: Event) -> None:
        if not isinstance(event, TextDeltaEvent):  # the streamed text: test_streaming.py
            events.append(event)

    run_agent(inp, provider, keep, workspace=workspace)
    return events


def test_a_thinking_budget_asks_for_thinking_and_reports_it(serve_tcp: Any, workspace: Path) -> None:
    fake = thinking_then_text()
    events = run_with(AnthropicProvider(model(serve_tcp(fake), thinking_budget=2048)), workspace)

    assert [e.type for e in events] == ["thinking", "tool_use", "tool_result", "thinking", "assistant", "result"]
    thoughts = [e.text for e in events if isinstance(e, ThinkingEvent)]
    assert thoughts == [THOUGHT, "It printed today."]  # redacted thinking has no text to show
    assert all(r["thinking"] == {"type": "enabled", "budget_tokens": 2048} for r in fake.requests)
    assert all(r["max_tokens"] == 4096 for r in fake.requests)

    # The tool turn goes back with its thinking first, signed and redacted blocks as they came.
    assistant_turn = fake.requests[1]["messages"][1]
    assert assistant_turn["role"] == "assistant"
    assert assistant_turn["content"][:2] == [
        {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE},
        {"type": "redacted_thinking", "data": REDACTED},
    ]
    assert assistant_turn["content"][2]["type"] == "tool_use"

    result = events[-1]
    assert isinstance(result, ResultEvent)
    # 10*n input plus the cache counts, which the API reports apart.
    assert (result.usage.input_tokens, result.usage.output_tokens) == (10 + 50 + 20 + 50, 3)
    assert (result.usage.cache_creation_input_tokens, result.usage.cache_read_input_tokens) == (50, 50)


def test_without_a_budget_the_request_never_mentions_thinking(serve_tcp: Any, workspace: Path) -> None:
    fake = FakeAnthropic(message([{"type": "text", "text": "hi"}], "end_turn"))
    run_with(AnthropicProvider(model(serve_tcp(fake))), workspace)
    assert "thinking" not in fake.requests[0]


def test_the_budget_is_left_out_of_the_input_when_off() -> None:
    # Recorded inputs from before the field rebuild byte for byte (runs show --verify).
    assert b"thinking_budget" not in ModelSettings().to_json()
    assert b'"thinking_budget":1024' in ModelSettings(thinking_budget=1024).to_json()
    with pytest.raises(msgspec.ValidationError, match="thinking_budget"):
        decode_input(json.dumps(make_input("x", model={"provider": "anthropic", "thinking_budget": 100})))


def test_the_runner_process_streams_thinking_events(serve_tcp: Any, run_runner: RunRunner) -> None:
    fake = thinking_then_text()
    settings = json.loads(model(serve_tcp(fake), thinking_budget=1024).to_json())
    res = run_runner(make_input("what day is it?", model=settings))
    assert res.returncode == 0, res.stderr
    assert res.types == ["thinking", "tool_use", "tool_result", "thinking", "assistant", "result"]
    assert res.of_type("thinking")[0]["text"] == THOUGHT
    assert res.of_type("result")[0]["usage"]["cache_read_input_tokens"] == 50
