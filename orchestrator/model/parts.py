"""What a stored message is: one part of a kind-discriminated union.

A row's type and sender, read together, say what it is; they are read once
(``orchestrator.model.messages.decode_part``, ``StoredMessage.part``) and the code
above asks the part (``isinstance``, ``match`` or its ``kind``) instead of
comparing the two strings again:

==================  =============================================  ==========  ========
kind                stored as (type, sender)                       model sees  channels
==================  =============================================  ==========  ========
``user_text``       ``user``: a person, the scheduler, ``deploy``  yes         yes
``assistant_text``  ``assistant``: ``bot`` (or an import's)        yes         yes
``system_text``     ``system``: all but the records below          yes         yes
``tool_result``     ``tool_result`` (``command_output`` of old)    yes         yes
``host_note``       ``host``                                       never       yes
``thinking``        ``assistant``: ``thinking``                    never       never
``tool_use``        ``assistant``: ``tool_use``                    its pair    never
``result_meta``     ``assistant`` or ``system``: ``result_meta``   never       never
``egress_log``      ``system``: ``egress_log``                     never       never
==================  =============================================  ==========  ========

A tool call and a tool result carry what their metadata says about the pair
(which run, which call), decoded as hostile: a value of the wrong type is
none at all.  The rows stay as they are: no column, no wire format changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, TypeAlias, get_args

from agent_runner.protocol import SdkToolUse
from orchestrator.core.jsontypes import JsonObject

# The kinds whose content is all there is to them (:class:`Plain`).
PlainKind = Literal["user_text", "assistant_text", "system_text", "host_note", "thinking", "result_meta", "egress_log"]
PartKind = Literal[PlainKind, "tool_use", "tool_result"]
PART_KINDS: frozenset[PartKind] = frozenset(get_args(PartKind))
# Stored for the record: never in the model's view as they are, never on a channel.
RECORD_KINDS: frozenset[PartKind] = frozenset({"thinking", "tool_use", "result_meta", "egress_log"})
# What the model's view holds as it is (a tool call joins it only with its result: views.py).
MODEL_KINDS: frozenset[PartKind] = PART_KINDS - RECORD_KINDS - {"host_note"}

# Which run produced an output (regenerate finds the run to redo by it; a call pairs
# with its result within a run).
RUN_ID_KEY = "run_id"

# What a provider accepts as a tool call's id and name (Anthropic's patterns;
# OpenAI's are looser).  The rows come from a container, which is not
# trusted: a call with an id or name the API would refuse would fail every
# later run of the chat, so such a call is no call (its result reads as text).
_TOOL_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _text(meta: JsonObject, key: str) -> str | None:
    value = meta.get(key)
    return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class Plain:
    """A message that is its words (or, for a record, its metadata as the record's reader
    takes it): nothing to decode beyond its kind."""

    kind: PlainKind


@dataclass(frozen=True, slots=True)
class ToolUse:
    """A tool call the agent made, kept for the record; it joins the model's view with its result."""

    # None: not a call a provider would take back (a bad id or name, no input object).
    call: SdkToolUse | None
    run_id: str | None
    kind: Literal["tool_use"] = "tool_use"

    @classmethod
    def of(cls, meta: JsonObject) -> ToolUse:
        call_id, name, args = _text(meta, "tool_use_id"), _text(meta, "tool"), meta.get("input")
        call = None
        if call_id and _TOOL_ID.fullmatch(call_id) and name and _TOOL_NAME.fullmatch(name) and isinstance(args, dict):
            call = SdkToolUse(id=call_id, name=name, input=args)
        return cls(call=call, run_id=_text(meta, RUN_ID_KEY))


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool call gave: its output, and the call it answers when it names one."""

    tool_use_id: str | None
    run_id: str | None
    # None: not said, or not a number.
    exit_code: int | None
    kind: Literal["tool_result"] = "tool_result"

    @classmethod
    def of(cls, meta: JsonObject) -> ToolResult:
        code = meta.get("exit_code")
        return cls(
            tool_use_id=_text(meta, "tool_use_id"),
            run_id=_text(meta, RUN_ID_KEY),
            exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        )


Part: TypeAlias = Plain | ToolUse | ToolResult

# One of each plain part serves every message.
USER_TEXT = Plain("user_text")
ASSISTANT_TEXT = Plain("assistant_text")
SYSTEM_TEXT = Plain("system_text")
HOST_NOTE = Plain("host_note")
THINKING = Plain("thinking")
RESULT_META = Plain("result_meta")
EGRESS_LOG = Plain("egress_log")
