"""Secret values kept out of what the program writes about itself.

The settings' secrets (``Settings.secrets()``: the API token, both webhook
secrets, the model keys, the Telegram bot token, the Slack bot and app tokens and
signing secret, database and broker URL
passwords) are never put into a log line, an error or an answer on purpose;
this is the net under that rule, for text made by code that does not know
them: a library logging a URL with the bot token in its path, an exception
whose message quotes a connection string, an upstream's error that echoes a
key.  Each process's entry point registers its settings' values with
:func:`hide` (``orchestrator/core/process.py``; the logging set-up,
``orchestrator/core/logs.py``, does too); :func:`redact` replaces them in log
lines (``orchestrator/core/logs.py``), run errors (``orchestrator/store/runs.py``),
🏠 messages (``orchestrator/run/outputs.py``) and delivery errors
(``orchestrator/run/outbound.py``).

A process-wide registry, because log records are cleaned far from any settings
object, and the store and run code that cleans errors is handed no root to ask;
values are only ever added.  Building a composition root registers nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

MASK = "[redacted]"
# Shorter values are no secrets worth the name, and replacing them would cut
# ordinary words out of every line.
MIN_LENGTH = 4

_lock = threading.Lock()
_hidden: tuple[str, ...] = ()


def hide(values: Iterable[str]) -> None:
    """Add ``values`` to what :func:`redact` removes (empty and short ones are ignored)."""
    global _hidden
    with _lock:
        # Longest first: a secret that contains another is replaced whole.
        _hidden = tuple(sorted({*_hidden, *(v for v in values if len(v) >= MIN_LENGTH)}, key=len, reverse=True))


def redact(text: str) -> str:
    """``text`` with every hidden value replaced by :data:`MASK` (the same object if none occurs)."""
    for value in _hidden:
        if value in text:
            text = text.replace(value, MASK)
    return text


def hidden() -> bool:
    """Whether any value is hidden (log lines skip the work otherwise)."""
    return bool(_hidden)
