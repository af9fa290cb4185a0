"""Reading a run's output in bounded memory and linear time.

Everything a container writes is hostile: the agent runs as the runner's
user, and though the runner keeps itself out of its reach
(``agent_runner/undumpable.py``), under gVisor the agent can still write to the
runner's own stdout and stderr (``/proc/1/fd/1``, ``/proc/1/fd/2``), and a
runner taken over could send anything: one endless line, a flood of short
ones, or gigabytes of log.  Joining chunks with ``buf += data`` and splitting
with ``buf.split(b"\\n", 1)`` copies the whole buffer per chunk and per
line (quadratic in a long line), and keeping stderr whole lets one write
take the worker's memory.  So the host reads output only through:

* :class:`LineReader`: chunks in, complete lines out; one ``bytearray``
  scanned by index from where the last scan stopped (each byte is looked at
  once), and a line longer than the maximum is never accumulated: the
  reader raises :class:`OutputLimitExceeded` and the run ends;
* :class:`TailBuffer`: the last ``cap`` bytes of a stream (the runner's
  log), whatever its length;
* :class:`OutputBudget`: the per-run caps on output lines and stored bytes,
  checked before anything is stored.

A broken limit is an :class:`OutputLimitExceeded`: the pipeline kills the
container and ends the run failed, not retryable (the agent would do it
again), with a host message naming the limit and its setting.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

# Re-exported (``X as X``) for run/attempt.py, which imports it from here until it is switched.
from orchestrator.core.errors import OutputLimitExceeded

DEFAULT_MAX_LINE_BYTES = 1024 * 1024
DEFAULT_TAIL_BYTES = 64 * 1024


def line_too_long(limit: int) -> OutputLimitExceeded:
    return OutputLimitExceeded(f"an output line is longer than {limit} bytes", limit, "max_event_line_bytes")


class LineReader:
    """Split a byte stream into lines; feed it chunks as they arrive.

    Holds at most one partial line of at most ``max_line`` bytes (plus the
    chunk being split).  The bytes after the last newline stay in the
    buffer and are not scanned again: ``_scanned`` says how far the search
    for a newline got.
    """

    def __init__(self, max_line: int = DEFAULT_MAX_LINE_BYTES) -> None:
        if max_line < 1:
            raise ValueError("max_line must be at least 1")
        self.max_line = max_line
        self._buf = bytearray()
        self._scanned = 0  # no newline in _buf[:_scanned]
        self.scanned = 0  # bytes searched for a newline, in all (tests check: each byte once)
        self.peak_buffered = 0  # the most bytes ever held (tests check the bound)

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        """The lines ``data`` completes (without their newline).

        Raises :class:`OutputLimitExceeded` as soon as a line is known to be
        longer than ``max_line``; the reader is then empty and must not be
        fed again (the run is over).
        """
        buf = self._buf
        buf += data
        self.peak_buffered = max(self.peak_buffered, len(buf))
        self.scanned += len(buf) - self._scanned
        lines: list[bytes] = []
        start = 0
        pos = buf.find(b"\n", self._scanned)
        while pos != -1:
            if pos - start > self.max_line:
                self._fail()
            lines.append(bytes(buf[start:pos]))
            start = pos + 1
            pos = buf.find(b"\n", start)
        if start:
            # What is left follows a newline of this chunk, so it is part of
            # this chunk: moving it (if bytearray moves at all) stays linear.
            del buf[:start]
        if len(buf) > self.max_line:
            self._fail()
        self._scanned = len(buf)
        return lines

    def rest(self) -> bytes:
        """What follows the last newline (the stream ended without one)."""
        rest = bytes(self._buf)
        self._buf.clear()
        self._scanned = 0
        return rest

    def _fail(self) -> None:
        self._buf.clear()
        self._scanned = 0
        raise line_too_long(self.max_line)


def read_lines(chunks: Iterable[bytes], max_line: int = DEFAULT_MAX_LINE_BYTES) -> Iterator[bytes]:
    """Every line of the stream ``chunks``, the unterminated last one too if not blank."""
    reader = LineReader(max_line)
    for chunk in chunks:
        yield from reader.feed(chunk)
    rest = reader.rest()
    if rest.strip():
        yield rest


class TailBuffer:
    """The last ``cap`` bytes written to it; fewer than ``2 * cap`` held between writes.

    Trimming happens only when the buffer has doubled, so every byte is
    copied a bounded number of times (linear in what is written).
    """

    def __init__(self, cap: int = DEFAULT_TAIL_BYTES) -> None:
        if cap < 1:
            raise ValueError("cap must be at least 1")
        self.cap = cap
        self.total = 0  # bytes ever written
        self._buf = bytearray()
        self.peak_buffered = 0

    def write(self, data: bytes) -> None:
        self.total += len(data)
        if len(data) >= self.cap:
            # A big chunk replaces everything: keep only its own end.
            self._buf[:] = data[-self.cap :]
        else:
            self._buf += data
            if len(self._buf) >= 2 * self.cap:
                del self._buf[: len(self._buf) - self.cap]
        self.peak_buffered = max(self.peak_buffered, len(self._buf))

    @property
    def dropped(self) -> int:
        """How many bytes from the start were not kept."""
        return self.total - min(self.total, self.cap)

    def getvalue(self) -> bytes:
        return bytes(self._buf[-self.cap :])

    def text(self) -> str:
        """The tail as text; a cut multi-byte character at its start is replaced."""
        return self.getvalue().decode("utf-8", "replace")


class OutputBudget:
    """A run's caps on output lines and on bytes stored; raises before a cap is passed."""

    def __init__(self, max_lines: int, max_stored_bytes: int) -> None:
        self.max_lines = max_lines
        self.max_stored_bytes = max_stored_bytes
        self.lines = 0
        self.stored_bytes = 0

    def line(self) -> None:
        """Count one output line (an event, or a line that is not one)."""
        self.lines += 1
        if self.lines > self.max_lines:
            raise OutputLimitExceeded(f"more than {self.max_lines} output lines", self.max_lines, "max_run_events")

    def store(self, size: int) -> None:
        """Count ``size`` bytes about to be stored; raises (storing nothing) if they would pass the cap."""
        if self.stored_bytes + size > self.max_stored_bytes:
            raise OutputLimitExceeded(
                f"more than {self.max_stored_bytes} bytes of output to store",
                self.max_stored_bytes,
                "max_run_stored_bytes",
            )
        self.stored_bytes += size
