"""Server-sent events, decoded as the bytes arrive: what both providers stream.

The framing of the WHATWG spec (https://html.spec.whatwg.org/#event-stream-interpretation):
lines end with CRLF, LF or CR; ``event:`` names the event, ``data:`` lines
(joined with LF) are its payload, ``id:``/``retry:`` and ``:`` comments are
read and dropped, a blank line dispatches the event.  An event that has no
``data`` is not dispatched; an unfinished event at the end of the stream is
dropped (the spec's rule: the provider then sees no ``message_stop`` /
``[DONE]`` and reports a cut stream).

Chunks split anywhere (inside a line, between CR and LF, inside a UTF-8
sequence): the decoder keeps the bytes after the last line end and looks at
each byte once.  The stream comes from the gateway, which relays the model
API's bytes; a line or an event larger than ``max_event_bytes`` is refused
(:class:`SseError`) rather than held in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_EVENT_BYTES = 16 * 1024 * 1024


class SseError(ValueError):
    """The stream is not a usable event stream (an event over the size limit)."""


@dataclass(frozen=True)
class SseEvent:
    event: str  # "message" when the stream names none (the spec's default)
    data: str


class SseDecoder:
    """Bytes in (:meth:`feed`), complete events out, in order."""

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.max_event_bytes = max_event_bytes
        self._buf = bytearray()
        self._scanned = 0  # no line end in _buf[:_scanned]
        self._event = ""
        self._data: list[bytes] = []
        self._size = 0
        self._after_cr = False  # the last line ended with CR: a LF first in the next chunk belongs to it

    def feed(self, chunk: bytes) -> list[SseEvent]:
        out: list[SseEvent] = []
        if self._after_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._after_cr = False
        buf = self._buf
        buf += chunk
        start = 0
        pos = self._scanned
        end = len(buf)
        while pos < end:
            byte = buf[pos]
            if byte != 0x0A and byte != 0x0D:
                pos += 1
                continue
            self._line(bytes(buf[start:pos]), out)
            if byte == 0x0D:
                if pos + 1 < end:
                    if buf[pos + 1] == 0x0A:
                        pos += 1
                else:
                    self._after_cr = True
            pos += 1
            start = pos
        del buf[:start]
        self._scanned = len(buf)
        if len(buf) + self._size > self.max_event_bytes:
            raise SseError(f"an event of the stream is larger than {self.max_event_bytes} bytes")
        return out

    def _line(self, line: bytes, out: list[SseEvent]) -> None:
        if not line:
            if self._data:
                data = b"\n".join(self._data).decode("utf-8", "replace")
                out.append(SseEvent(self._event or "message", data))
            self._event, self._data, self._size = "", [], 0
            return
        if line[:1] == b":":
            return  # a comment (keep-alive)
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._size += len(value) + 1
            if self._size > self.max_event_bytes:
                raise SseError(f"an event of the stream is larger than {self.max_event_bytes} bytes")
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        # id, retry and unknown fields: nothing this client needs
