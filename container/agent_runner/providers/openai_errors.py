"""A Chat Completions server's words in our errors and log lines: quoted short, on one line.

:func:`snippet` quotes a body (or an event, or a tool call's arguments) the provider
cannot use; :func:`error_detail` finds the server's own message in an error body (an
HTTP error's, or an ``{"error": ...}`` event's mid-stream), in whichever shape it comes.
"""

from __future__ import annotations

import json

SNIPPET_CHARS = 300


def snippet(raw: bytes | str) -> str:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = " ".join(text.split())
    if not text:
        return "(empty body)"
    return text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1] + "…"


def error_detail(raw: bytes) -> str:
    """The server's error message: OpenAI's ``{"error": {"message"}}``, Ollama's, vLLM's, or the body."""
    try:
        body = json.loads(raw)
    except ValueError:
        return snippet(raw)
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(message := error.get("message"), str):
            return message
        if isinstance(error, str):
            return error
        if isinstance(message := body.get("message"), str):
            return message
    return snippet(raw)
