"""Turn the container's events into stored messages.

=================  ==============  ================  ==============================
event              message_type    sender            metadata
=================  ==============  ================  ==============================
assistant          assistant       bot               -
tool_result        tool_result     tool_result       envelope + exit_code, tool_use_id, tool
tool_use           assistant       tool_use          tool_use_id, tool, input
thinking           assistant       thinking          -
send_file          assistant       bot               FILE envelope (the stored file)
=================  ==============  ================  ==============================

``thinking`` is stored for the record, never shown to the model again;
``tool_use`` comes back to later runs as the call it was, paired with its
result by ``tool_use_id`` (``orchestrator.model.views``).  Tool results were
stored with the sender ``command_output`` before; those rows stay as they
are and read the same (their type, ``tool_result``, decides how they are
shown and what the model sees).  The run's ``result_meta`` record is made
by ``orchestrator.run.result_meta``.  Message ids are derived
from the run id and the event's position, so storing an event twice (a
retried step) keeps one copy.

A tool result's output is whatever the container says it is: the host
stores at most ``max_tool_result_bytes`` of it (cut with a visible marker,
the original size kept in the metadata as ``output_bytes``), and drops an
envelope larger than that (``envelope_dropped`` says why).  Its envelope passes
ingest's checks (``run/ingest.py``) before it is stored: an APPROVAL envelope is
the host's own (a question with buttons that answer it) and is refused here, and a
FILE envelope may name only files its chat stored, described as the store has them
(:func:`checked_output`, in the storing transaction); a refused envelope is dropped,
its reason kept as ``invalid_envelope``, so no channel draws it and no link to a
file it names is signed.
"""

from __future__ import annotations

import json

import msgspec
from pydantic import BaseModel

from agent_runner.protocol import AssistantEvent, Event, ThinkingEvent, ToolResultEvent, ToolUseEvent
from orchestrator.core import secrets
from orchestrator.core.errors import InvalidMessageMetadata
from orchestrator.core.jsontypes import JsonObject
from orchestrator.model.envelopes import ENVELOPE_KEYS, build_structured_envelope, files_of, refuse_host_envelope
from orchestrator.model.messages import (
    SENDER_BOT,
    SENDER_HOST,
    SENDER_THINKING,
    SENDER_TOOL_RESULT,
    SENDER_TOOL_USE,
    MessageType,
    decode_part,
)
from orchestrator.model.parts import Part
from orchestrator.store.db import Connection
from orchestrator.store.file_refs import checked_files


class OutputMessage(BaseModel):
    id: str
    sender: str
    sender_name: str
    content: str
    message_type: MessageType
    metadata: JsonObject | None = None

    @property
    def part(self) -> Part:
        """What this output is (``orchestrator.model.parts``); decoded on each read, since
        an output is copied with other metadata on its way to the store."""
        return decode_part(self.message_type, self.sender, self.metadata)


def event_to_message(
    event: Event, *, run_id: str, index: int, assistant_name: str, max_tool_result_bytes: int | None = None
) -> OutputMessage | None:
    """The message to store for ``event``; ``max_tool_result_bytes`` (None: no cap)
    bounds a tool result's stored output and envelope."""
    mid = f"{run_id}-{index:04d}"
    if isinstance(event, AssistantEvent):
        if not event.text.strip():
            return None
        return OutputMessage(
            id=mid,
            sender=SENDER_BOT,
            sender_name=assistant_name,
            content=event.text,
            message_type="assistant",
        )
    if isinstance(event, ToolResultEvent):
        output, original = cap_output(event.output, max_tool_result_bytes)
        metadata = _tool_result_metadata(event, max_tool_result_bytes)
        if original is not None:
            metadata = {**metadata, "output_bytes": original, "output_truncated": True}
        return OutputMessage(
            id=mid,
            sender=SENDER_TOOL_RESULT,
            sender_name=event.name,
            content=output,
            message_type="tool_result",
            metadata=metadata,
        )
    if isinstance(event, ToolUseEvent):
        shown = event.input.get("command") if event.name == "bash" else None
        text = f"{event.name}: {shown}" if isinstance(shown, str) else f"{event.name} {json.dumps(event.input)}"
        return OutputMessage(
            id=mid,
            sender=SENDER_TOOL_USE,
            sender_name=event.name,
            content=text,
            message_type="assistant",
            metadata={"tool_use_id": event.id, "tool": event.name, "input": event.input},
        )
    if isinstance(event, ThinkingEvent):
        return OutputMessage(
            id=mid,
            sender=SENDER_THINKING,
            sender_name=assistant_name,
            content=event.text,
            message_type="assistant",
        )
    return None


def sent_file_message(*, run_id: str, index: int, assistant_name: str, caption: str) -> OutputMessage:
    """The assistant message a ``send_file`` becomes: its caption as the words; the FILE
    envelope naming the stored file is added once the file is stored."""
    return OutputMessage(
        id=f"{run_id}-{index:04d}",
        sender=SENDER_BOT,
        sender_name=assistant_name,
        content=caption,
        message_type="assistant",
    )


def cap_output(text: str, cap: int | None) -> tuple[str, int | None]:
    """``text`` cut to ``cap`` bytes of UTF-8 with a visible marker, and its
    original size in bytes when it was cut (else None)."""
    if cap is None or len(text) <= cap // 4:  # cannot be over: at most 4 bytes a character
        return text, None
    encoded = text.encode("utf-8")
    if len(encoded) <= cap:
        return text, None
    kept = encoded[:cap].decode("utf-8", "ignore")
    return f"{kept}\n[output truncated by the host: showing the first {cap} of {len(encoded)} bytes]", len(encoded)


def stored_size(out: OutputMessage) -> int:
    """Bytes ``out`` takes in the store: its text and its metadata as JSON."""
    meta = len(msgspec.json.encode(out.metadata)) if out.metadata else 0
    return len(out.content.encode("utf-8")) + meta


def _tool_result_metadata(event: ToolResultEvent, cap: int | None = None) -> JsonObject:
    """The runner's envelope (CODE_EDIT, TODO, TOOL_CALL) with the result's facts as extras.

    The envelope arrives as a plain JSON object (the protocol keeps it loose on
    the wire) and is validated here against the same protocol Structs the
    runner built it with; a type this host does not know is kept as it came.
    The container is not trusted: an envelope that does not validate, or is
    larger than ``cap`` bytes as JSON, is dropped (the reason kept) rather
    than failing the run or the store.
    """
    extras = {"exit_code": event.exit_code, "tool_use_id": event.tool_use_id, "tool": event.name}
    env = event.envelope
    if not env:
        return extras
    if cap is not None:
        size = len(msgspec.json.encode(env))
        if size > cap:
            return {**extras, "envelope_dropped": f"{size} bytes, over the host's {cap}-byte limit"}
    try:
        refuse_host_envelope(env)  # a question only the host asks, with buttons that answer it
        # A missing type is refused there like any other that is not a non-empty string.
        return build_structured_envelope(
            env.get("message_type", ""), env.get("payload", {}), extras=extras, version=env.get("version", 1)
        )
    except InvalidMessageMetadata as exc:
        return {**extras, "invalid_envelope": str(exc)}


def checked_output(conn: Connection, chat_jid: str, out: OutputMessage) -> OutputMessage:
    """In the storing transaction: ``out`` as it may be stored in ``chat_jid``.  A tool result's
    FILE envelope (the container's word) is held to ingest's rule: it names files of
    ``chat_jid`` only, each described by the store's row, not by the envelope; else the
    envelope is dropped and why is kept as ``invalid_envelope``.  Anything else (the host's
    own outputs: send_file's stored file, a question) is ``out`` itself."""
    if out.sender != SENDER_TOOL_RESULT or files_of(out.metadata) is None:
        return out
    try:
        checked = checked_files(conn, chat_jid, out.metadata)
    except InvalidMessageMetadata as exc:
        extras = {k: v for k, v in (out.metadata or {}).items() if k not in ENVELOPE_KEYS}
        checked = {**extras, "invalid_envelope": str(exc)}
    return out.model_copy(update={"metadata": checked})


def host_message(*, run_id: str, text: str) -> OutputMessage:
    """An operational notice for people; never sent to the model.  The settings' secrets are taken
    out of ``text`` (it quotes errors, from anywhere)."""
    return OutputMessage(
        id=f"{run_id}-host", sender=SENDER_HOST, sender_name="host", content=secrets.redact(text), message_type="host"
    )
