"""Log lines: text for people, one JSON object per line for log pipelines.

``ORCHESTRATOR_LOG_FORMAT=json`` (default ``text``) makes every process (the
CLI, the API through uvicorn's ``--log-config``, Celery workers and beat)
write JSON lines with ``time``, ``level``, ``logger``, ``message`` and the
context of the work a line is about: ``chat_jid`` and ``run_id`` (set by the
pipeline with :func:`log_context` around a step and a run), ``host`` (this
process's host id) and ``trace_id`` (the current span's trace, with tracing on:
orchestrator/core/tracing.py; a run's lines carry the trace of the message it
answers, ingest's the message's own; empty while tracing is off).  Text lines carry the same context
after the message, only when it is set, so a person's terminal stays short.

Context lives in a ``ContextVar``: a thread started during a run (a lease
heartbeat, the stop-watch) does not inherit it; its lines name their group in
the message, as before.

No line carries a secret of the settings: :class:`ContextFilter` replaces them
(``orchestrator/core/secrets.py``) in the message and the traceback, whoever
logged it (httpx logs the Telegram bot token in its request URLs).

No line can be forged or drive the terminal showing it: a text line's message and
context have every control character shown as an escape, newlines and carriage
returns included (``\\n``; ``orchestrator/core/terminal.py``), its traceback keeps
its lines with the rest escaped; JSON lines are ASCII (the encoder escapes the rest).
"""

from __future__ import annotations

import contextlib
import json
import logging
import logging.config
import os
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from orchestrator.core import secrets, tracing
from orchestrator.core.jsontypes import JsonObject
from orchestrator.core.settings import Settings
from orchestrator.core.terminal import for_log, for_terminal

FORMATS = ("text", "json")
# The context every line carries (empty when unknown).
CONTEXT_FIELDS = ("chat_jid", "run_id", "trace_id")
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s%(context)s"
_JSON_FIELDS = ("asctime", "levelname", "name", "message", "chat_jid", "run_id", "host", "trace_id")
_RENAMED = {"asctime": "time", "levelname": "level", "name": "logger"}

_context: ContextVar[dict[str, str]] = ContextVar("orchestrator_log_context", default={})  # noqa: B039 - never mutated


@contextlib.contextmanager
def log_context(**fields: str | None) -> Iterator[None]:
    """Lines logged inside (in this thread or task) carry ``fields`` (see
    :data:`CONTEXT_FIELDS`); the outer context comes back on exit."""
    token = _context.set({**_context.get(), **{k: v for k, v in fields.items() if v}})
    try:
        yield
    finally:
        _context.reset(token)


class ContextFilter(logging.Filter):
    """Puts the current context on each record (``chat_jid``, ``run_id``, ``trace_id``,
    ``host``), and a short ``context`` suffix for text lines."""

    def __init__(self, host: str = "") -> None:
        super().__init__()
        self.host = host

    def filter(self, record: logging.LogRecord) -> bool:
        current = _context.get()
        trace_id = tracing.trace_id()  # "" while tracing is off (nothing imported)
        if trace_id and "trace_id" not in current:
            current = {**current, "trace_id": trace_id}
        for name in CONTEXT_FIELDS:
            setattr(record, name, current.get(name, ""))
        record.host = self.host
        record.context = "".join(f" [{k}={current[k]}]" for k in CONTEXT_FIELDS if current.get(k))
        if secrets.hidden():
            _redact(record)
        return True


def _redact(record: logging.LogRecord) -> None:
    """Take the hidden secrets out of ``record``'s message, traceback and stack, in place (the
    record is the handler's: every formatter after this filter sees the cleaned text)."""
    if not isinstance(record.msg, dict):
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # arguments that do not fit: logging reports that itself
            message = None
        if message is not None:
            cleaned = secrets.redact(message)
            if cleaned is not message:
                record.msg, record.args = cleaned, None
    if record.exc_info and record.exc_info[0] is not None:
        text = record.exc_text or logging.Formatter().formatException(record.exc_info)
        cleaned = secrets.redact(text)
        if cleaned is not text:
            # Formatters print exc_text when there is no exc_info (the standard one and python-json-logger).
            record.exc_info, record.exc_text = None, cleaned
    if record.stack_info:
        record.stack_info = secrets.redact(record.stack_info)


def json_formatter() -> logging.Formatter:
    """The JSON lines' formatter (python-json-logger), also named by uvicorn's config."""
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter(list(_JSON_FIELDS), rename_fields=_RENAMED, json_ensure_ascii=True)


class _TextFormatter(logging.Formatter):
    """One line per record: the message and context escaped (:func:`for_log`), whoever logged
    them; a traceback or stack keeps its own lines (:func:`for_terminal`)."""

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_text:  # formatted before (by another formatter, or _redact): printed as it is
            record.exc_text = for_terminal(record.exc_text)
        return super().format(record)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        shown = logging.makeLogRecord(record.__dict__)
        shown.message = for_log(record.message)
        shown.context = for_log(getattr(record, "context", ""))
        return super().formatMessage(shown)

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's name
        return for_terminal(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802 - logging's name
        return for_terminal(super().formatStack(stack_info))


def text_formatter() -> logging.Formatter:
    return _TextFormatter(_TEXT_FORMAT)


def configure(settings: Settings, level: str | int | None = None) -> None:
    """Send every log line of this process to stderr in ``settings.telemetry.log_format``,
    at ``level`` (default ``settings.telemetry.log_level``), replacing earlier handlers, with the
    settings' secrets taken out of every line."""
    secrets.hide(settings.secrets())
    logging.config.dictConfig(dict_config(settings, level))


def dict_config(settings: Settings, level: str | int | None = None) -> JsonObject:
    """The ``logging.config.dictConfig`` of :func:`configure`; uvicorn reads it from a
    file (``--log-config``) for its own loggers too."""
    chosen = level if level is not None else settings.telemetry.log_level
    formatter = (
        "orchestrator.core.logs.json_formatter"
        if settings.telemetry.log_format == "json"
        else "orchestrator.core.logs.text_formatter"
    )
    handler: dict[str, Any] = {
        "class": "logging.StreamHandler",
        "stream": "ext://sys.stderr",
        "formatter": "line",
        "filters": ["context"],
    }
    quiet = {"level": "WARNING"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "context": {"()": "orchestrator.core.logs.ContextFilter", "host": settings.fleet.effective_host_id}
        },
        "formatters": {"line": {"()": formatter}},
        "handlers": {"stderr": handler},
        "root": {"handlers": ["stderr"], "level": logging.getLevelName(chosen) if isinstance(chosen, int) else chosen},
        "loggers": {
            "alembic": quiet,
            # uvicorn's own loggers write through the root handler, in the same format.
            "uvicorn": {"handlers": [], "propagate": True},
            "uvicorn.error": {"handlers": [], "propagate": True},
            "uvicorn.access": {"handlers": [], "propagate": True},
        },
    }


def write_dict_config(settings: Settings) -> Path:
    """:func:`dict_config` as a JSON file under the data dir, for uvicorn's ``--log-config``."""
    path = settings.data_dir / "logging.json"
    tmp = path.with_name(f"logging.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dict_config(settings), indent=2), encoding="utf-8")
    tmp.replace(path)
    return path
