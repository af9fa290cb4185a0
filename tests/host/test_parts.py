"""What a stored message is (orchestrator/model/parts.py): every type and sender the store
takes decodes to one kind, and the kinds say who sees a message; a tool call and a tool
result carry their pairing facts, decoded as hostile."""

from __future__ import annotations

from typing import Any

import pytest

from agent_runner.protocol import SdkToolUse
from orchestrator.model.messages import HARNESS_SENDER_TYPES, MESSAGE_TYPES, StoredMessage, decode_part
from orchestrator.model.parts import PART_KINDS, PartKind, ToolResult, ToolUse
from orchestrator.model.render import displayed

# Every harness sender with every type the store lets it store, and a person with every type.
EXPECTED: dict[tuple[str, str], PartKind] = {
    ("system", "system"): "system_text",
    ("host", "host"): "host_note",
    ("bot", "assistant"): "assistant_text",
    ("deploy", "system"): "system_text",
    ("deploy", "user"): "user_text",
    ("command_output", "tool_result"): "tool_result",
    ("thinking", "assistant"): "thinking",
    ("tool_use", "assistant"): "tool_use",
    ("tool_result", "tool_result"): "tool_result",
    ("result_meta", "assistant"): "result_meta",
    ("result_meta", "system"): "result_meta",
    ("egress_log", "system"): "egress_log",
    ("ann", "user"): "user_text",
    ("ann", "assistant"): "assistant_text",
    ("ann", "system"): "system_text",
    ("ann", "tool_result"): "tool_result",
    ("ann", "host"): "host_note",
}


def message(sender: str, message_type: str, metadata: dict[str, Any] | None = None) -> StoredMessage:
    return StoredMessage.model_validate(
        {
            "seq": 1,
            "id": "m1",
            "chat_jid": "c@local",
            "sender": sender,
            "sender_name": sender,
            "content": "words",
            "timestamp": "2026-11-26T10:00:00+00:00",
            "is_from_me": False,
            "message_type": message_type,
            "metadata": metadata,
        }
    )


def test_the_table_covers_every_sender_and_type_the_store_takes() -> None:
    allowed = {(sender, t) for sender, types in HARNESS_SENDER_TYPES.items() for t in types}
    assert allowed | {("ann", t) for t in MESSAGE_TYPES} == set(EXPECTED)
    assert set(EXPECTED.values()) == PART_KINDS


@pytest.mark.parametrize(("sender", "message_type"), sorted(EXPECTED))
def test_each_message_decodes_to_its_kind_which_says_who_sees_it(sender: str, message_type: str) -> None:
    m = message(sender, message_type)
    kind = EXPECTED[(sender, message_type)]
    assert m.part.kind == kind
    record = kind in ("thinking", "tool_use", "result_meta", "egress_log")
    assert m.visible_to_model is (not record and kind != "host_note")
    assert displayed(m) is not record


def test_a_tool_call_and_its_result_carry_their_pairing() -> None:
    meta = {"tool_use_id": "toolu_1", "tool": "bash", "input": {"command": "ls"}, "run_id": "r1"}
    assert message("tool_use", "assistant", meta).part == ToolUse(
        call=SdkToolUse(id="toolu_1", name="bash", input={"command": "ls"}), run_id="r1"
    )
    answer = message("tool_result", "tool_result", {"tool_use_id": "toolu_1", "run_id": "r1", "exit_code": 2})
    assert answer.part == ToolResult(tool_use_id="toolu_1", run_id="r1", exit_code=2)


@pytest.mark.parametrize(
    "meta",
    [
        None,
        {"tool_use_id": "bad id!", "tool": "bash", "input": {}},
        {"tool_use_id": "toolu_1", "tool": "no spaces", "input": {}},
        {"tool_use_id": "toolu_1", "tool": "bash", "input": "ls"},
        {"tool_use_id": ["toolu_1"], "tool": "bash", "input": {}, "run_id": {"r": 1}},
    ],
)
def test_a_call_a_provider_would_refuse_is_no_call(meta: dict[str, Any] | None) -> None:
    part = message("tool_use", "assistant", meta).part
    assert isinstance(part, ToolUse) and part.call is None and part.run_id is None


def test_a_results_facts_of_the_wrong_type_are_none() -> None:
    forged = {"tool_use_id": 7, "run_id": ["r1"], "exit_code": True}
    assert message("ann", "tool_result", forged).part == ToolResult(tool_use_id=None, run_id=None, exit_code=None)
    assert decode_part("tool_result", "ann", {"exit_code": "0"}) == ToolResult(None, None, None)


def test_a_copy_with_other_fields_decodes_its_own_part() -> None:
    m = message("bot", "assistant")
    assert m.part.kind == "assistant_text"
    assert m.model_copy(update={"message_type": "host", "sender": "host"}).part.kind == "host_note"
