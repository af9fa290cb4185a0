"""Message types, the sender vocabulary and the typed stored message.

Five message types decide what happens to a message everywhere:

===============  ======  =============  ==========================
type             stored  sent to model  channel display
===============  ======  =============  ==========================
``user``         yes     yes            plain text
``assistant``    yes     yes            under the assistant's name
``system``       yes     yes            set apart
``tool_result``  yes     yes            🔧 and ✅/❌ with exit code
``host``         yes     **never**      🏠
===============  ======  =============  ==========================

Senders refine that: some internal records (``thinking``, ``tool_use``,
``result_meta``) are stored for the record but never shown to the model nor
sent to a channel, and ``system_notice`` is never stored at all (notices are
recomputed for every run).  One exception: a ``tool_use`` record comes back
to the model as the tool call it was, next to the result that answers it
(``orchestrator.model.views``).

The agent's tool results are stored with the sender ``tool_result`` (seed
004's vocabulary) and, being the conversation's tool results, reach the
model and the channels like any ``tool_result`` message.  Rows stored
before carry the sender ``command_output``: they stay as they are (history
is a record, and nothing reads the sender of a tool result: its type
decides), so both senders read the same.

:func:`decode_part` reads a message's type and sender once into what it is
(``orchestrator.model.parts``); ``StoredMessage.part`` holds the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from functools import cached_property
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.jsontypes import JsonObject

# Re-exported (``X as X``) so callers find envelopes next to the message models.
from orchestrator.model.envelopes import CODE_EDIT as CODE_EDIT
from orchestrator.model.envelopes import TEXT as TEXT
from orchestrator.model.envelopes import TODO as TODO
from orchestrator.model.envelopes import TOOL_CALL as TOOL_CALL
from orchestrator.model.envelopes import CodeEditPayload as CodeEditPayload
from orchestrator.model.envelopes import FileEdit as FileEdit
from orchestrator.model.envelopes import ParsedMessageMetadata as ParsedMessageMetadata
from orchestrator.model.envelopes import TodoItem as TodoItem
from orchestrator.model.envelopes import TodoPayload as TodoPayload
from orchestrator.model.envelopes import ToolCallPayload as ToolCallPayload
from orchestrator.model.envelopes import build_structured_envelope as build_structured_envelope
from orchestrator.model.envelopes import normalize_message_metadata as normalize_message_metadata
from orchestrator.model.envelopes import parse_message_metadata as parse_message_metadata
from orchestrator.model.envelopes import preview_for as preview_for
from orchestrator.model.parts import (
    ASSISTANT_TEXT,
    EGRESS_LOG,
    HOST_NOTE,
    MODEL_KINDS,
    RESULT_META,
    SYSTEM_TEXT,
    THINKING,
    USER_TEXT,
    Part,
    ToolResult,
    ToolUse,
)

MessageType = Literal["user", "assistant", "system", "tool_result", "host"]
MESSAGE_TYPES: frozenset[str] = frozenset(get_args(MessageType))

# Senders the harness itself uses; anything else is a channel user id.
SENDER_SYSTEM = "system"
SENDER_HOST = "host"
SENDER_BOT = "bot"
# Tool results as stored before the agent's own took the ``tool_result`` sender (still read).
SENDER_COMMAND_OUTPUT = "command_output"
# The model's extended thinking (Anthropic; ORCHESTRATOR_THINKING_BUDGET).
SENDER_THINKING = "thinking"
SENDER_TOOL_USE = "tool_use"
# The agent's tool results (orchestrator/run/outputs.py).
SENDER_TOOL_RESULT = "tool_result"
# The record each run ends with: model, stop reason, usage, duration, cost (orchestrator/run/result_meta.py).
SENDER_RESULT_META = "result_meta"
# The run's egress log: every decision of its egress proxy (orchestrator/run/chat_outputs.py).
SENDER_EGRESS_LOG = "egress_log"
SENDER_SYSTEM_NOTICE = "system_notice"

# Never written to the database.
NEVER_STORED_SENDERS: frozenset[str] = frozenset({SENDER_SYSTEM_NOTICE})
SENDER_DEPLOY = "deploy"
# A scheduled task's prompt (orchestrator/run/schedules.py): stored as a ``user``
# message, but no person's; a fleet at its run cap serves people first (store/slots.py).
SENDER_SCHEDULER = "scheduler"

# The types each harness sender may store.  A harness sender with another
# type is a bug or a forgery (a "bot" message typed ``user`` would put words
# in a person's mouth), so the store refuses it.  Any other sender is a
# channel user id (or an integration such as the scheduler).
HARNESS_SENDER_TYPES: dict[str, frozenset[str]] = {
    SENDER_SYSTEM: frozenset({"system"}),
    SENDER_HOST: frozenset({"host"}),
    SENDER_BOT: frozenset({"assistant"}),
    SENDER_DEPLOY: frozenset({"system", "user"}),
    SENDER_COMMAND_OUTPUT: frozenset({"tool_result"}),
    SENDER_THINKING: frozenset({"assistant"}),
    SENDER_TOOL_USE: frozenset({"assistant"}),
    SENDER_TOOL_RESULT: frozenset({"tool_result"}),
    SENDER_RESULT_META: frozenset({"assistant", "system"}),
    SENDER_EGRESS_LOG: frozenset({"system"}),
}


def sender_type_problem(sender: str, message_type: str) -> str | None:
    """Why ``sender`` may not store a ``message_type`` message (None: it may)."""
    allowed = HARNESS_SENDER_TYPES.get(sender)
    if allowed is not None and message_type not in allowed:
        return f"sender {sender!r} stores {' or '.join(sorted(allowed))} messages, not {message_type!r}"
    return None


_RECORDS: dict[str, Part] = {SENDER_THINKING: THINKING, SENDER_RESULT_META: RESULT_META, SENDER_EGRESS_LOG: EGRESS_LOG}
_BY_TYPE: dict[str, Part] = {"user": USER_TEXT, "assistant": ASSISTANT_TEXT, "system": SYSTEM_TEXT, "host": HOST_NOTE}


def decode_part(message_type: MessageType, sender: str, metadata: JsonObject | None) -> Part:
    """What a message is (``orchestrator.model.parts``): a record by its sender (the store
    holds each harness sender to its types), anything else by its type."""
    if sender == SENDER_TOOL_USE:
        return ToolUse.of(metadata or {})
    if (record := _RECORDS.get(sender)) is not None:
        return record
    if message_type == "tool_result":
        return ToolResult.of(metadata or {})
    return _BY_TYPE[message_type]


class NewMessage(BaseModel):
    """A message about to be stored (the store assigns ``seq``).

    Types are checked loosely here on purpose: the store's own validation
    gives the clearer error messages people see.
    """

    model_config = ConfigDict(extra="forbid")

    id: str
    chat_jid: str
    sender: str
    sender_name: str = ""
    content: str = ""
    timestamp: str
    is_from_me: bool = False
    message_type: str = "user"
    metadata: Any = None


class StoredMessage(BaseModel):
    """A row of the ``messages`` table, as every layer above the store sees it."""

    model_config = ConfigDict(frozen=True)

    seq: int
    id: str
    chat_jid: str
    sender: str
    sender_name: str
    content: str
    timestamp: str
    is_from_me: bool
    message_type: MessageType = "user"
    metadata: JsonObject | None = Field(default=None)
    # Regenerate and truncate supersede messages: kept for audit, in no view.
    superseded_at: datetime | None = None
    edited_at: datetime | None = None

    @cached_property
    def part(self) -> Part:
        """What this message is, decoded once (fields never change: the model is frozen)."""
        return decode_part(self.message_type, self.sender, self.metadata)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> StoredMessage:
        copied = super().model_copy(update=update, deep=deep)
        copied.__dict__.pop("part", None)  # a copy with other fields decodes its own
        return copied

    @property
    def visible_to_model(self) -> bool:
        return self.part.kind in MODEL_KINDS
