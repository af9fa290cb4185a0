"""A refusal: an answer the gateway gives itself (an HTTP error), without going upstream.

Raised by the request's framing (``server.py``), the rules (``rules.py`` and the readers
it calls) and the run's tally (``metering.py``); the gateway answers it as a JSON error
in the shape of the model APIs' own (``{"type": "error", "error": {...}}``), so the
runner's SDKs show its message.
"""

from __future__ import annotations


class Refusal(Exception):
    """An answer the gateway gives itself: its HTTP status, the error's type and message."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message
