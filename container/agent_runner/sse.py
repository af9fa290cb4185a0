"""Server-sent events, decoded as the bytes arrive: what both providers stream, and what the
host's model gateway reads a stream's usage from as it relays it.

The framing of the WHATWG spec (https://html.spec.whatwg.org/#event-stream-interpretation):
lines end with CRLF, LF or CR; ``event:`` names the event, ``data:`` lines
(joined with LF) are its payload, ``id:``/``retry:`` and ``:`` comments are
read and dropped, a blank line dispatches the event.  An event that has no
``data`` is not dispatched; an unfinished event at the end of the stream is
dropped (the spec's rule: the provider then sees no ``message_stop`` /
``[DONE]`` and reports a cut stream).

Chunks split anywhere (inside a line, between CR and LF, inside a UTF-8
sequence): the decoder keeps the bytes after the last line end, and splits a
chunk's complete lines in C (a few passes over each byte, whatever the chunks),
then reads them in one loop.  The stream comes from the gateway, which relays the model
API's bytes; a line or an event larger than ``max_event_bytes`` is refused
(:class:`SseError`) rather than held in memory, or, with ``skip_oversized``
(the gateway's meter, which passes the stream on whatever it holds), dropped
and the events after it read.

One decoder for both sides of the sandbox: the host imports this module
(``orchestrator/sandbox/gateway/metering.py``), so it imports nothing but the
standard library, and pyproject.toml's import contract lets the host read it
and the protocol, nothing else of the runner.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_EVENT_BYTES = 16 * 1024 * 1024
# A line ends with CRLF, LF or CR (a CR last in a chunk may have its LF in the next one).
_LINE_END = re.compile(rb"\r\n?|\n")


class SseError(ValueError):
    """The stream is not a usable event stream (an event over the size limit)."""


@dataclass(frozen=True)
class SseEvent:
    event: str  # "message" when the stream names none (the spec's default)
    data: str


class SseDecoder:
    """Bytes in (:meth:`feed`), complete events out, in order."""

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES, *, skip_oversized: bool = False) -> None:
        self.max_event_bytes = max_event_bytes
        self.skip_oversized = skip_oversized
        self._buf = bytearray()  # an unfinished line: no line end in it
        self._event = ""
        self._data: list[bytes] = []
        self._size = 0
        self._after_cr = False  # the last line ended with CR: a LF first in the next chunk belongs to it
        self._skipping = False  # (skip_oversized) the rest of an oversized line is dropped as it arrives
        self._oversized = False  # (skip_oversized) the current event went over: it is not dispatched

    def feed(self, chunk: bytes) -> list[SseEvent]:
        out: list[SseEvent] = []
        if self._after_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._after_cr = False
        if self._skipping:
            end = _LINE_END.search(chunk)
            if end is None:
                return out
            self._skipping = False
            self._after_cr = end[0] == b"\r" and end.end() == len(chunk)
            chunk = chunk[end.end() :]
        buf = self._buf
        # The complete lines are those up to the chunk's last line end (_buf holds none).
        last_cr = chunk.rfind(b"\r")
        complete = max(chunk.rfind(b"\n"), last_cr) + 1
        if complete:
            text = chunk[:complete] if complete < len(chunk) else chunk
            if buf:
                text = bytes(buf) + text
                buf.clear()
            # LF alone ends the lines of most streams: a plain split, many times faster.
            lines = text.split(b"\n") if last_cr < 0 else _LINE_END.split(text)
            lines.pop()  # the nothing after the last line end
            self._lines(lines, out)
            if last_cr == len(chunk) - 1:
                self._after_cr = True
        buf += chunk[complete:]
        if len(buf) + self._size > self.max_event_bytes:
            self._over()
            buf.clear()
            self._skipping = True
        return out

    def _over(self) -> None:
        if not self.skip_oversized:
            raise SseError(f"an event of the stream is larger than {self.max_event_bytes} bytes")
        self._oversized = True
        self._data, self._size = [], 0

    def _lines(self, lines: list[bytes], out: list[SseEvent]) -> None:
        # One loop over the lines with the event's state in locals: most chunks are a whole
        # event or a few, and a call a line was most of what decoding cost.
        event, data, size, oversized = self._event, self._data, self._size, self._oversized
        limit = self.max_event_bytes
        for line in lines:
            if not line:
                if data and not oversized:
                    out.append(SseEvent(event or "message", b"\n".join(data).decode("utf-8", "replace")))
                event, data, size, oversized = "", [], 0, False
                continue
            if line[:1] == b":":
                continue  # a comment (keep-alive)
            name, sep, value = line.partition(b":")
            if sep and value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                if oversized:
                    continue
                data.append(value)
                size += len(value) + 1
                if size > limit:
                    self._event, self._data, self._size = event, data, size
                    self._over()
                    data, size, oversized = self._data, self._size, self._oversized
            elif name == b"event":
                event = value.decode("utf-8", "replace")
            # id, retry and unknown fields: nothing this client needs
        self._event, self._data, self._size, self._oversized = event, data, size, oversized
