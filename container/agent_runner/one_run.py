"""One run: validate the input, run the agent, emit events; exit codes.

Used by the one-shot entry point (``python3 -m agent_runner``, stdin to
stdout) and by the warm mode (``serve.py``, one connection per run), so both
run exactly the same code.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TextIO

import msgspec

from .egress import egress_env
from .errors import InputError, ProviderError, RunnerError
from .fence import HostWatch
from .loop import Emit
from .protocol import (
    PROTOCOL_VERSION,
    ContainerInput,
    ErrorEvent,
    Event,
    ProtocolError,
    ResultEvent,
    decode_input,
    dump_event,
)
from .provider_registry import PROVIDERS

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

log = logging.getLogger("agent_runner")


def make_emitter(out: TextIO) -> Emit:
    """Write each event as one line and flush, so the host sees it immediately."""

    def emit(event: Event) -> None:
        out.write(dump_event(event) + "\n")
        out.flush()

    return emit


def parse_input(raw: bytes) -> ContainerInput:
    """Validate stdin; raises :class:`InputError` with a readable message."""
    try:
        inp = decode_input(raw)
    except ProtocolError as exc:
        # msgspec names the first problem and where: "Expected `int` >= 1 - at `$.limits.max_turns`".
        raise InputError(f"invalid ContainerInput: {exc}") from None
    if inp.protocol_version != PROTOCOL_VERSION:
        raise InputError(
            f"protocol_version {inp.protocol_version} is not supported (this runner speaks {PROTOCOL_VERSION})"
        )
    return inp


def _marking_the_end(emit: Emit, watch: HostWatch) -> Emit:
    """``emit`` that tells the watch once the run's final event is out."""

    def marking(event: Event) -> None:
        emit(event)
        if isinstance(event, (ResultEvent, ErrorEvent)):
            watch.finished()

    return marking


def run(raw: bytes, emit: Emit, workspace: Path, *, host_fd: int | None = None) -> int:
    """Everything but process I/O, so it can be called in-process too.

    ``host_fd``: a descriptor (a dup, owned from here on) of the stream the run came on,
    watched while the run goes on when its input asks for it (``host_fence_s``)."""
    watch: HostWatch | None = None
    try:
        inp = parse_input(raw)
        if host_fd is not None and inp.host_fence_s is not msgspec.UNSET:
            watch = HostWatch(host_fd, inp.host_fence_s).start()
            host_fd = None
            emit = _marking_the_end(emit, watch)
        # Debug, not info: a line on stderr wakes Docker's log pipeline (the container's shim
        # and the engine) on the reply's path, ~0.25 ms of a warm reply (docs/performance.md);
        # the host records each run whole.  AGENT_LOG_LEVEL=DEBUG shows it.
        log.debug("run %s: %d messages, provider %s", inp.run_id, len(inp.messages), inp.model.provider)
        with egress_env(inp):
            PROVIDERS[inp.model.provider].run(inp, emit, workspace)
        return EXIT_OK
    except InputError as exc:
        log.error("%s", exc)
        emit(ErrorEvent(message=str(exc), retryable=False))
        return EXIT_BAD_INPUT
    except ProviderError as exc:
        log.error("provider failed (retryable=%s): %s", exc.retryable, exc)
        emit(ErrorEvent(message=str(exc), retryable=exc.retryable))
        return EXIT_FAILED
    except RunnerError as exc:
        log.error("%s", exc)
        emit(ErrorEvent(message=str(exc), retryable=False))
        return EXIT_FAILED
    except Exception as exc:  # a bug: keep the traceback in the logs
        log.exception("runner crashed")
        emit(ErrorEvent(message=f"internal error: {type(exc).__name__}: {exc}", retryable=False))
        return EXIT_FAILED
    finally:
        if watch is not None:
            watch.close()
        elif host_fd is not None:
            os.close(host_fd)
