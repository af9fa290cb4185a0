"""What a run spends through its gateway: each answer's usage as it passes (:class:`Meter`,
:class:`SseUsage`), and the run's tally (:class:`Account`).

Token counts are read from either usage shape (Anthropic's ``input_tokens`` and cache
counts, OpenAI's ``prompt_tokens``/``completion_tokens``), from a plain answer or from an
event stream as it is relayed, with the runner's own decoder (``agent_runner/sse.py``:
one reading of the framing on both sides of the sandbox).  An answer whose final count
never came (a server that does not report it, a stream cut short) is charged an estimate
of what arrived, never nothing.

The tally starts at ``spent`` (what earlier attempts of the run used), so the token
budget holds per run, not per attempt; one request goes upstream at a time
(``model_gateway.py``), so the budget check before a request sees what every earlier one
cost.
"""

from __future__ import annotations

import json
import threading

from agent_runner.protocol import Usage
from agent_runner.sse import SseDecoder

from .refusal import Refusal

# An event larger than this is passed on but not read for usage (usage events are small;
# this bounds what one stream may buffer).
_MAX_SSE_EVENT = 1 << 20

_INPUT_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")  # Anthropic
_OUTPUT_KEYS = ("output_tokens", "completion_tokens")


def _estimate(n_bytes: int) -> int:
    # Roughly 4 bytes a token: only used when an answer carried no usage, and
    # on the high side for JSON and SSE framing, which is what a budget wants.
    return (n_bytes + 3) // 4


class Meter:
    """The usage of one answer: the latest count of each field seen (streamed counts are cumulative)."""

    def __init__(self) -> None:
        self.fields: dict[str, int] = {}
        self.final = False  # an output count that is the answer's last word was seen
        self.response_bytes = 0

    def see(self, usage: object, *, final: bool) -> None:
        if not isinstance(usage, dict):
            return
        for key in (*_INPUT_KEYS, *_OUTPUT_KEYS, "prompt_tokens"):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                self.fields[key] = value
        if final and any(k in self.fields for k in _OUTPUT_KEYS):
            self.final = True

    def read_answer(self, content: bytes) -> None:
        """A whole (not streamed) answer's usage."""
        self.response_bytes = len(content)
        try:
            answer = json.loads(content)
        except ValueError:
            return
        if isinstance(answer, dict):
            self.see(answer.get("usage"), final=True)

    def cache_tokens(self) -> tuple[int, int]:
        """The prompt tokens read from and written to Anthropic's cache (part of the input count)."""
        return self.fields.get("cache_read_input_tokens", 0), self.fields.get("cache_creation_input_tokens", 0)

    def tokens(self, request_bytes: int) -> tuple[int, int]:
        f = self.fields
        if "prompt_tokens" in f:  # OpenAI: cached prompt tokens are part of prompt_tokens
            tokens_in = f["prompt_tokens"]
        elif any(k in f for k in _INPUT_KEYS):  # Anthropic: cache reads and writes are not
            tokens_in = sum(f.get(k, 0) for k in _INPUT_KEYS)
        else:
            tokens_in = _estimate(request_bytes)
        tokens_out = f.get("completion_tokens", f.get("output_tokens", 0))
        if not self.final:
            # No final count (a server that does not report it, a stream cut
            # short): charge what arrived rather than nothing.
            tokens_out = max(tokens_out, _estimate(self.response_bytes))
        return tokens_in, tokens_out


class SseUsage:
    """Reads usage from an event stream as it passes through, an event at a time, in bounded memory."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self._decoder = SseDecoder(_MAX_SSE_EVENT, skip_oversized=True)

    def feed(self, chunk: bytes) -> None:
        self.meter.response_bytes += len(chunk)
        for event in self._decoder.feed(chunk):
            # A quoted "usage" cannot occur inside a JSON string (its quotes would
            # be escaped): only events that carry usage are parsed.
            if '"usage"' in event.data:
                self._read(event.data)

    def _read(self, data: str) -> None:
        try:
            event = json.loads(data)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if event.get("type") == "message_start" and isinstance(event.get("message"), dict):
            # Anthropic: input and cache counts, and a first output count.
            self.meter.see(event["message"].get("usage"), final=False)
        # Anthropic's message_delta (the final output count) or OpenAI's last
        # chunk (stream_options.include_usage).
        self.meter.see(event.get("usage"), final=True)


class Account:
    """A run's tally through its gateway: its tokens (from ``spent`` on), requests and refusals.

    Read and written from every connection's thread, under one lock.
    """

    def __init__(self, spent: Usage | None = None) -> None:
        spent = spent or Usage()
        self._lock = threading.Lock()
        self.input_tokens = spent.input_tokens
        self.output_tokens = spent.output_tokens
        self.cache_read_input_tokens = spent.cache_read_input_tokens
        self.cache_creation_input_tokens = spent.cache_creation_input_tokens
        self.requests = 0  # sent upstream
        self.refused = 0  # answered by the gateway itself
        # Requests refused because the run's token budget was spent or would be:
        # the pipeline tells the chat which limit stopped the run.
        self.budget_refusals = 0
        self.server_tool_requests = 0

    @property
    def usage(self) -> Usage:
        """The run's tokens so far (``spent`` included)."""
        with self._lock:
            return Usage(
                input_tokens=self.input_tokens,
                output_tokens=self.output_tokens,
                cache_read_input_tokens=self.cache_read_input_tokens,
                cache_creation_input_tokens=self.cache_creation_input_tokens,
            )

    def spent(self) -> int:
        """Input + output tokens so far."""
        with self._lock:
            return self.input_tokens + self.output_tokens

    def charge(self, meter: Meter, request_bytes: int) -> None:
        """Add one answer's usage (an estimate where it carried none)."""
        tokens_in, tokens_out = meter.tokens(request_bytes)
        cache_read, cache_creation = meter.cache_tokens()
        with self._lock:
            self.input_tokens += tokens_in
            self.output_tokens += tokens_out
            self.cache_read_input_tokens += cache_read
            self.cache_creation_input_tokens += cache_creation

    def count_request(self) -> None:
        with self._lock:
            self.requests += 1

    def count_refusal(self) -> None:
        with self._lock:
            self.refused += 1

    def budget_refusal(self, message: str) -> Refusal:
        """The refusal of a request the token budget does not allow, counted."""
        # 403, not 429: a provider must not retry this.
        with self._lock:
            self.budget_refusals += 1
        return Refusal(403, "budget_exceeded", message)

    def take_server_tool_request(self, most: int) -> bool:
        """Count one more request with a server tool, if fewer than ``most`` were made."""
        with self._lock:
            if self.server_tool_requests >= most:
                return False
            self.server_tool_requests += 1
            return True
