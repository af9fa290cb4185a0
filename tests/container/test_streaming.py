"""Streamed answers: the SSE decoder, both providers' stream parsers, and the loop's text deltas.

The providers talk to the fake servers over loopback HTTP, which answer
``"stream": true`` with the real event types and framing; byte-level
splits and cut streams are scripted as raw bodies.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from runner_harness import RunRunner, make_input

from agent_runner.errors import ProviderError
from agent_runner.loop import run_agent
from agent_runner.protocol import AssistantEvent, Event, ModelSettings, TextDeltaEvent, decode_input
from agent_runner.providers.anthropic import AnthropicProvider, MessageStream
from agent_runner.providers.base import ProviderMessage, TextBlock, ThinkingBlock, TokenUsage, ToolUseBlock
from agent_runner.providers.openai_compat import OpenAICompatProvider
from agent_runner.providers.openai_response import ChunkStream
from agent_runner.sse import SseDecoder, SseError, SseEvent
from agent_runner.text_stream import DeltaCoalescer
from fakes import openai_api
from fakes.anthropic_api import FakeAnthropic, message, message_events, paced, serve_tcp, sse
from fakes.openai_api import FakeOpenAI, chat, chunk_events, raw, tool_call

__all__ = ["serve_tcp"]  # a fixture, used by name

HI = [ProviderMessage("user", [TextBlock("hi")])]


def anthropic(base_url: str) -> AnthropicProvider:
    return AnthropicProvider(
        ModelSettings(provider="anthropic", model="claude-fake", max_tokens=100, base_url=base_url)
    )


def openai(base_url: str) -> OpenAICompatProvider:
    return OpenAICompatProvider(
        ModelSettings(provider="openai", model="m", max_tokens=100, base_url=base_url),
        sleep=lambda _s: None,
        rng=random.Random(1),
    )


class Shown(list[tuple[int, str, float]]):
    """An ``on_text`` that records (block, text, when)."""

    def __call__(self, index: int, text: str) -> None:
        self.append((index, text, time.monotonic()))

    def text(self) -> str:
        return "".join(t for _, t, _ in self)


# -- the SSE decoder ---------------------------------------------------------


STREAM = (
    b': keep-alive\r\nevent: one\r\ndata: {"a": 1}\r\n\r\n'
    b"data: line1\ndata: line2\nid: 7\nretry: 10\n\n"
    b"event: two\rdata:no-space \xc3\xa9\r\r"
    b"event: empty\n\n"
)
EXPECTED = [SseEvent("one", '{"a": 1}'), SseEvent("message", "line1\nline2"), SseEvent("two", "no-space é")]


def test_the_decoder_reads_every_line_ending_comments_and_multi_line_data() -> None:
    assert SseDecoder().feed(STREAM) == EXPECTED


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7])
def test_the_decoder_gives_the_same_events_whatever_the_chunks(size: int) -> None:
    decoder = SseDecoder()
    events = [e for i in range(0, len(STREAM), size) for e in decoder.feed(STREAM[i : i + size])]
    assert events == EXPECTED


def test_every_split_point_including_between_cr_and_lf() -> None:
    for cut in range(len(STREAM) + 1):
        decoder = SseDecoder()
        assert decoder.feed(STREAM[:cut]) + decoder.feed(STREAM[cut:]) == EXPECTED, cut


def test_an_unfinished_event_is_not_dispatched() -> None:
    assert SseDecoder().feed(b"event: x\ndata: half") == []


def test_an_event_over_the_limit_is_refused_not_held() -> None:
    decoder = SseDecoder(max_event_bytes=1000)
    with pytest.raises(SseError):
        for _ in range(100):
            decoder.feed(b"data: " + b"x" * 50 + b"\n")  # many data lines, no dispatch
    with pytest.raises(SseError):
        SseDecoder(max_event_bytes=1000).feed(b"data: " + b"y" * 2000)  # one endless line


@pytest.mark.parametrize("big", [b"data: " + b"x" * 3000 + b"\r\n\r\n", b"data: a\rdata: " + b"x" * 3000 + b"\r\r"])
def test_an_event_over_the_limit_can_be_skipped_and_the_rest_read(big: bytes) -> None:
    # The gateway's meter passes a stream on whatever it holds: it drops what it cannot hold.
    cut = STREAM.index(b"\r\n\r\n") + 4
    stream = STREAM[:cut] + b"event: big\n" + big + STREAM[cut:]
    for split in range(0, len(stream) + 1, 7):
        decoder = SseDecoder(max_event_bytes=1000, skip_oversized=True)
        assert decoder.feed(stream[:split]) + decoder.feed(stream[split:]) == EXPECTED, split


# -- Anthropic -----------------------------------------------------------------


TOOL_TURN = message(
    [
        {"type": "thinking", "thinking": "The shell knows.", "signature": "sig=="},
        {"type": "text", "text": "Let me check the date for you."},
        {"type": "tool_use", "id": "toolu_9", "name": "bash", "input": {"command": "date -u", "n": [1, {"x": "ü"}]}},
    ],
    "tool_use",
    n=4,
)


def feed(stream: MessageStream, events: list[dict[str, Any]]) -> None:
    decoder = SseDecoder()
    for event in decoder.feed(sse(events)):
        stream.event(event.event, event.data)


def test_anthropic_events_make_the_whole_turn_and_show_text_as_it_comes() -> None:
    shown = Shown()
    stream = MessageStream(shown)
    feed(stream, message_events(TOOL_TURN[1]))
    response = stream.response()

    assert response.content == [
        ThinkingBlock("The shell knows.", signature="sig=="),
        TextBlock("Let me check the date for you."),
        ToolUseBlock("toolu_9", "bash", {"command": "date -u", "n": [1, {"x": "ü"}]}),
    ]
    assert response.stop_reason == "tool_use"
    assert response.usage == TokenUsage(input_tokens=40, output_tokens=4)
    assert [t for _, t, _ in shown] == ["Let", " me", " check", " the", " date", " for", " you."]
    assert {i for i, _, _ in shown} == {0}  # the first text block of the turn


def test_input_json_delta_pieces_split_anywhere_make_one_input() -> None:
    raw_input = json.dumps({"path": "a b.txt", "content": 'say "hi"\n'})
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"usage": {"input_tokens": 5, "output_tokens": 1}}},
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "t", "name": "write_file", "input": {}},
        },
        *(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": c}}
            for c in raw_input
        ),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
        {"type": "message_stop"},
    ]
    stream = MessageStream()
    feed(stream, events)
    assert stream.response().content == [ToolUseBlock("t", "write_file", json.loads(raw_input))]


@pytest.mark.parametrize(("kind", "retryable"), [("overloaded_error", True), ("invalid_request_error", False)])
def test_an_error_event_mid_stream_is_a_provider_error(kind: str, retryable: bool) -> None:
    events = message_events(message([{"type": "text", "text": "half an answer"}], "end_turn")[1])
    cut = [*events[:4], {"type": "error", "error": {"type": kind, "message": "Overloaded"}}]
    shown = Shown()
    with pytest.raises(ProviderError) as caught:
        feed(MessageStream(shown), cut)
    assert caught.value.retryable is retryable and kind in str(caught.value)
    assert shown.text() == "half"  # what was shown before the error


def test_a_stream_cut_before_message_stop_is_a_retryable_error() -> None:
    stream = MessageStream()
    feed(stream, message_events(message([{"type": "text", "text": "a b"}], "end_turn")[1])[:-2])
    with pytest.raises(ProviderError, match="before message_stop") as caught:
        stream.response()
    assert caught.value.retryable


def split_reply(body: bytes, size: int) -> tuple[int, Iterator[bytes], dict[str, str]]:
    return 200, iter([body[i : i + size] for i in range(0, len(body), size)]), {"content-type": "text/event-stream"}


@pytest.mark.parametrize("size", [1, 13])
def test_anthropic_provider_over_http_with_the_stream_in_odd_pieces(serve_tcp: Any, size: int) -> None:
    body = sse(message_events(TOOL_TURN[1]))
    fake = FakeAnthropic(split_reply(body, size))
    shown = Shown()
    response = anthropic(serve_tcp(fake)).complete("sys", HI, [], on_text=shown)

    assert fake.requests[0]["stream"] is True
    assert response.tool_uses() == [ToolUseBlock("toolu_9", "bash", {"command": "date -u", "n": [1, {"x": "ü"}]})]
    assert shown.text() == "Let me check the date for you."


def test_anthropic_provider_a_connection_cut_mid_stream_is_retryable(serve_tcp: Any) -> None:
    body = sse(message_events(message([{"type": "text", "text": "a b c"}], "end_turn")[1]))
    fake = FakeAnthropic((200, iter([body[: len(body) // 2]]), {"content-type": "text/event-stream"}))
    with pytest.raises(ProviderError) as caught:
        anthropic(serve_tcp(fake)).complete("sys", HI, [])
    assert caught.value.retryable


def test_anthropic_text_arrives_before_the_answer_ends(serve_tcp: Any) -> None:
    fake = FakeAnthropic(paced(message([{"type": "text", "text": "one two three four five"}], "end_turn"), 0.1))
    shown = Shown()
    response = anthropic(serve_tcp(fake)).complete("sys", HI, [], on_text=shown)
    done = time.monotonic()
    assert response.content == [TextBlock("one two three four five")]
    assert done - shown[0][2] >= 0.5  # the first word came well before the rest


# -- OpenAI-compatible -------------------------------------------------------


def stream_body(reply: Any, with_usage: bool = True, done: bool = True) -> bytes:
    chunks = chunk_events(reply[1], with_usage)
    data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return data + (b"data: [DONE]\n\n" if done else b"")


def test_openai_chunks_make_the_whole_turn_with_tool_call_fragments_and_usage() -> None:
    reply = chat(
        "Checking now.",
        tool_calls=[tool_call("c1", "bash", {"command": "ls -la"}), tool_call("c2", "read_file", {"path": "x.txt"})],
        n=5,
        reasoning_content="Two tools.",
    )
    shown = Shown()
    stream = ChunkStream(shown)
    for event in SseDecoder().feed(stream_body(reply)):
        stream.event(event.data)
    response = stream.response()

    assert stream.done
    assert response.content == [
        ThinkingBlock("Two tools."),
        TextBlock("Checking now."),
        ToolUseBlock("c1", "bash", {"command": "ls -la"}),
        ToolUseBlock("c2", "read_file", {"path": "x.txt"}),
    ]
    assert response.stop_reason == "tool_use"
    assert response.usage == TokenUsage(input_tokens=50, output_tokens=5)
    assert shown.text() == "Checking now." and len(shown) == 2


def test_openai_provider_streams_and_asks_for_the_usage(monkeypatch: Any) -> None:
    fake = FakeOpenAI(openai_api.paced(chat("alpha beta gamma", n=2), 0.1))
    shown = Shown()
    with fake.serve() as base:
        response = openai(base).complete("sys", HI, [], on_text=shown)
    done = time.monotonic()
    assert fake.requests[0]["stream"] is True and fake.requests[0]["stream_options"] == {"include_usage": True}
    assert response.content == [TextBlock("alpha beta gamma")] and response.usage.output_tokens == 2
    assert shown.text() == "alpha beta gamma" and done - shown[0][2] >= 0.3


def test_openai_error_event_mid_stream() -> None:
    body = stream_body(chat("partial text"), done=False).split(b"\n\n")[1] + b"\n\n"
    body += b'data: {"error": {"message": "model crashed", "type": "server_error"}}\n\n'
    fake = FakeOpenAI(raw(200, body, "text/event-stream"))
    shown = Shown()
    with fake.serve() as base, pytest.raises(ProviderError, match="model crashed") as caught:
        openai(base).complete("sys", HI, [], on_text=shown)
    assert caught.value.retryable and shown.text() == "partial"
    assert len(fake.calls) == 1  # text was shown: not retried here (it would show twice)


def test_openai_truncated_stream_is_retried_only_while_nothing_was_shown() -> None:
    # No text yet (only the role chunk), then the end: retried, and the retry's answer taken.
    first = stream_body(chat("x"), done=False).split(b"\n\n")[0] + b"\n\n"
    fake = FakeOpenAI(raw(200, first, "text/event-stream"), chat("second try"))
    with fake.serve() as base:
        assert openai(base).complete("sys", HI, []).content == [TextBlock("second try")]
    assert len(fake.calls) == 2

    # Text shown, then the end without a finish reason or [DONE]: a retryable error at once.
    cut = b"\n\n".join(stream_body(chat("some words here"), done=False).split(b"\n\n")[:3]) + b"\n\n"
    fake = FakeOpenAI(raw(200, cut, "text/event-stream"), chat("never asked"))
    with fake.serve() as base, pytest.raises(ProviderError, match="ended before") as caught:
        openai(base).complete("sys", HI, [], on_text=Shown())
    assert caught.value.retryable and len(fake.calls) == 1


# -- the loop's deltas ---------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_coalescer_writes_at_most_every_interval_or_per_kib() -> None:
    events: list[Event] = []
    clock = Clock()
    deltas = DeltaCoalescer(events.append, min_interval_s=0.05, max_bytes=1024, clock=clock)
    deltas.add("1.0", "first")  # after a quiet spell: at once
    for i in range(60):  # 90 ms of pieces 1.5 ms apart
        clock.now += 0.0015
        deltas.add("1.0", f" {i}")
    assert [e.text for e in events if isinstance(e, TextDeltaEvent)][0] == "first"
    assert len(events) == 2  # one more after 50 ms, the rest waiting
    deltas.add("1.0", "x" * 2000)  # over a KiB: at once
    deltas.add("1.1", "next block")  # a new block: block 1.0's text goes out first
    deltas.add("1.1", " more")
    deltas.flush()
    texts = [(e.block, e.text) for e in events if isinstance(e, TextDeltaEvent)]
    assert "".join(t for b, t in texts if b == "1.0") == "first" + "".join(f" {i}" for i in range(60)) + "x" * 2000
    assert "".join(t for b, t in texts if b == "1.1") == "next block more"
    assert len(texts) <= 6


def test_the_loop_emits_deltas_before_each_complete_turn(serve_tcp: Any, workspace: Path) -> None:
    fake = FakeAnthropic(
        message(
            [
                {"type": "text", "text": "Running it."},
                {"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "echo hi"}},
            ],
            "tool_use",
        ),
        message([{"type": "text", "text": "It said hi."}], "end_turn", n=2),
    )
    events: list[Event] = []
    inp = decode_input(json.dumps(make_input("go")))
    run_agent(inp, anthropic(serve_tcp(fake)), events.append, workspace=workspace)

    kinds = [e.type for e in events]
    first_turn = kinds[: kinds.index("assistant")]
    assert first_turn and set(first_turn) == {"text_delta"}  # the text shown before the turn is complete
    assert kinds[-3:] == ["text_delta", "assistant", "result"]
    for turn in (1, 2):
        deltas = [e for e in events if isinstance(e, TextDeltaEvent) and e.block == f"{turn}.0"]
        assert deltas, turn
    first = "".join(e.text for e in events if isinstance(e, TextDeltaEvent) and e.block == "1.0")
    assert first == "Running it." and events[kinds.index("assistant")] == AssistantEvent(text="Running it.")


def test_the_runner_process_writes_deltas_on_stdout(serve_tcp: Any, run_runner: RunRunner) -> None:
    words = " ".join(f"w{i}" for i in range(40))
    fake = FakeAnthropic(paced(message([{"type": "text", "text": words}], "end_turn"), 0.02))
    settings = json.loads(
        ModelSettings(provider="anthropic", model="claude-fake", max_tokens=100, base_url=serve_tcp(fake)).to_json()
    )
    res = run_runner(make_input("talk", model=settings))
    assert res.returncode == 0, res.stderr
    deltas = res.of_type("text_delta")
    assert "".join(d["text"] for d in deltas) == words
    # Coalesced: 40 words 20 ms apart make far fewer than 40 lines.
    assert 2 <= len(deltas) < 30
    assert res.of_type("assistant") == [{"type": "assistant", "text": words}]
