"""Structured message envelopes: normalization, validation errors, parsing, building, previews;
the schema shared with the agent runner (its envelopes round-trip through the host unchanged)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from agent_runner import envelopes as runner_envelopes
from agent_runner import protocol
from agent_runner.protocol import (
    KnownEnvelope,
    OtherEnvelope,
    ToolResultEvent,
    dump_event,
    envelope_to_dict,
    parse_event,
)
from orchestrator.core.errors import InvalidMessage, InvalidMessageMetadata, OrchestratorError
from orchestrator.model import messages
from orchestrator.model.envelopes import (
    CodeEditPayload,
    FileEdit,
    ParsedMessageMetadata,
    TodoItem,
    TodoPayload,
    ToolCallPayload,
    build_structured_envelope,
    normalize_message_metadata,
    parse_message_metadata,
    preview_for,
)
from orchestrator.run.outputs import event_to_message


def edit(path: str = "src/main.py", old: str | None = "a", new: str | None = "b") -> dict[str, Any]:
    return {"file_path": path, "old_content": old, "new_content": new}


def envelope(message_type: str, payload: Any, **extras: Any) -> dict[str, Any]:
    return {"message_type": message_type, "payload": payload, **extras}


def todos(*statuses: str) -> dict[str, Any]:
    return {"todos": [{"id": str(i), "content": f"task {i}", "status": s} for i, s in enumerate(statuses)]}


def assert_invalid(meta: Any, field: str, problem: str) -> None:
    with pytest.raises(InvalidMessageMetadata) as info:
        normalize_message_metadata(meta)
    assert info.value.field == field
    assert str(info.value) == f"{field}: {problem}"


# --- the error type ---------------------------------------------------------


def test_error_is_an_invalid_message_and_a_value_error() -> None:
    err = InvalidMessageMetadata("metadata.version", "must be an integer >= 1")
    assert isinstance(err, InvalidMessage)
    assert isinstance(err, OrchestratorError)
    assert isinstance(err, ValueError)
    assert (err.field, err.problem, str(err)) == (
        "metadata.version",
        "must be an integer >= 1",
        "metadata.version: must be an integer >= 1",
    )


def test_public_api_is_reexported_from_messages() -> None:
    assert messages.normalize_message_metadata is normalize_message_metadata
    assert messages.parse_message_metadata is parse_message_metadata
    assert messages.build_structured_envelope is build_structured_envelope
    assert messages.preview_for is preview_for
    assert messages.ParsedMessageMetadata is ParsedMessageMetadata


# --- the outer shape ----------------------------------------------------------


def test_null_metadata_stays_null() -> None:
    assert normalize_message_metadata(None) is None


@pytest.mark.parametrize("meta", [[], ["TEXT"], "TEXT", 3, 1.5, True])
def test_non_object_metadata_is_rejected(meta: Any) -> None:
    assert_invalid(meta, "metadata", "must be a JSON object or null")


@pytest.mark.parametrize("meta", [{}, {"source": "whatsapp", "quoted": {"id": "m1"}}, {"payload": 5, "version": 0}])
def test_legacy_metadata_without_message_type_passes_unchanged(meta: dict[str, Any]) -> None:
    out = normalize_message_metadata(meta)
    assert out == meta
    assert out is not meta


@pytest.mark.parametrize("message_type", [None, "", "   ", 7, ["TODO"]])
def test_message_type_must_be_a_non_empty_string(message_type: Any) -> None:
    assert_invalid({"message_type": message_type}, "metadata.message_type", "must be a non-empty string")


def test_message_type_is_kept_as_given_and_matched_case_sensitively() -> None:
    # Lower case is not CODE_EDIT, so a payload CODE_EDIT would reject passes through.
    out = normalize_message_metadata(envelope("code_edit", {"edits": []}))
    assert out == {"message_type": "code_edit", "version": 1, "payload": {"edits": []}}


def test_version_defaults_to_one() -> None:
    assert normalize_message_metadata({"message_type": "TEXT"}) == {"message_type": "TEXT", "version": 1, "payload": {}}


def test_version_above_one_is_kept() -> None:
    assert normalize_message_metadata({"message_type": "TEXT", "version": 3})["version"] == 3


@pytest.mark.parametrize("version", [0, -1, True, False, 1.0, "1", None])
def test_version_must_be_an_integer_at_least_one(version: Any) -> None:
    assert_invalid({"message_type": "TEXT", "version": version}, "metadata.version", "must be an integer >= 1")


def test_extras_stay_top_level_after_the_envelope_keys() -> None:
    meta = {"trace": {"id": "t1"}, "payload": {}, "source": "cli", "message_type": "TEXT", "version": 2}
    out = normalize_message_metadata(meta)
    assert out == {"message_type": "TEXT", "version": 2, "payload": {}, "trace": {"id": "t1"}, "source": "cli"}
    assert list(out) == ["message_type", "version", "payload", "trace", "source"]


def test_normalizing_is_idempotent() -> None:
    once = normalize_message_metadata(envelope("CODE_EDIT", {"edits": [{"file_path": "a.py"}]}, source="x"))
    assert normalize_message_metadata(once) == once


# --- TEXT ---------------------------------------------------------------------


@pytest.mark.parametrize("meta", [{"message_type": "TEXT"}, envelope("TEXT", {})])
def test_text_payload_absent_or_empty_becomes_empty_object(meta: dict[str, Any]) -> None:
    assert normalize_message_metadata(meta)["payload"] == {}


@pytest.mark.parametrize("payload", [{"text": "hi"}, None, [], "hi"])
def test_text_payload_must_be_empty(payload: Any) -> None:
    assert_invalid(envelope("TEXT", payload), "metadata.payload", "must be empty for TEXT messages")


# --- unknown types --------------------------------------------------------------


@pytest.mark.parametrize("payload", [{"anything": [1, 2]}, [1, "two"], "raw", 42, None])
def test_unknown_type_payload_passes_through_unvalidated(payload: Any) -> None:
    out = normalize_message_metadata(envelope("IMAGE", payload, alt="cat"))
    assert out == {"message_type": "IMAGE", "version": 1, "payload": payload, "alt": "cat"}


def test_unknown_type_without_payload_gets_empty_object() -> None:
    assert normalize_message_metadata({"message_type": "IMAGE"})["payload"] == {}


def test_unknown_type_still_checks_version() -> None:
    assert_invalid({"message_type": "IMAGE", "version": 0}, "metadata.version", "must be an integer >= 1")


# --- CODE_EDIT -------------------------------------------------------------------


def test_code_edit_is_normalized_with_defaults_filled_in() -> None:
    out = normalize_message_metadata(envelope("CODE_EDIT", {"edits": [{"file_path": "a.py", "new_content": "x"}]}))
    assert out["payload"] == {
        "edits": [{"file_path": "a.py", "old_content": None, "new_content": "x", "language": None}]
    }


@pytest.mark.parametrize(
    ("payload", "field", "problem"),
    [
        ({"edits": []}, "metadata.payload.edits", "must not be empty"),
        ({}, "metadata.payload.edits", "is required"),
        ({"edits": [edit(), {"old_content": "a"}]}, "metadata.payload.edits[1].file_path", "is required"),
        ({"edits": [{"file_path": ""}]}, "metadata.payload.edits[0].file_path", "must not be empty"),
        ({"edits": [{"file_path": 3}]}, "metadata.payload.edits[0].file_path", "must be a string"),
        ({"edits": [{**edit(), "diff": "+x"}]}, "metadata.payload.edits[0].diff", "unknown field"),
        ({"edits": [edit()], "summary": "x"}, "metadata.payload.summary", "unknown field"),
        ({"edits": "a.py"}, "metadata.payload.edits", "must be a list"),
        ({"edits": ["a.py"]}, "metadata.payload.edits[0]", "must be a JSON object"),
        (["a.py"], "metadata.payload", "must be a JSON object"),
        (None, "metadata.payload", "must be a JSON object"),
    ],
)
def test_code_edit_errors_name_the_field(payload: Any, field: str, problem: str) -> None:
    assert_invalid(envelope("CODE_EDIT", payload), field, problem)


# --- TODO ------------------------------------------------------------------------


def test_todo_is_kept_in_order() -> None:
    payload = todos("completed", "in_progress", "pending")
    assert normalize_message_metadata(envelope("TODO", payload))["payload"] == payload


@pytest.mark.parametrize(
    ("payload", "field", "problem"),
    [
        ({"todos": []}, "metadata.payload.todos", "must not be empty"),
        (
            {"todos": [*todos("pending")["todos"], {"id": "1", "content": "x", "status": "done"}]},
            "metadata.payload.todos[1].status",
            "must be one of pending, in_progress, completed",
        ),
        ({"todos": [{"id": "1", "content": "x"}]}, "metadata.payload.todos[0].status", "is required"),
        (
            {"todos": [{"id": 1, "content": "x", "status": "pending"}]},
            "metadata.payload.todos[0].id",
            "must be a string",
        ),
        (
            {"todos": [{"id": "1", "content": "x", "status": "pending", "priority": "high"}]},
            "metadata.payload.todos[0].priority",
            "unknown field",
        ),
    ],
)
def test_todo_errors_name_the_field(payload: Any, field: str, problem: str) -> None:
    assert_invalid(envelope("TODO", payload), field, problem)


# --- TOOL_CALL -------------------------------------------------------------------


def test_tool_call_is_normalized_with_defaults_filled_in() -> None:
    out = normalize_message_metadata(envelope("TOOL_CALL", {"tool_name": "bash"}))
    assert out["payload"] == {"tool_name": "bash", "input": {}, "output": None, "error": None}


def test_tool_call_output_may_be_any_json_value() -> None:
    payload = {"tool_name": "grep", "input": {"q": "x"}, "output": [1, {"a": None}], "error": None}
    assert normalize_message_metadata(envelope("TOOL_CALL", payload))["payload"] == payload


@pytest.mark.parametrize(
    ("payload", "field", "problem"),
    [
        ({}, "metadata.payload.tool_name", "is required"),
        ({"tool_name": ""}, "metadata.payload.tool_name", "must not be empty"),
        ({"tool_name": "bash", "input": "ls"}, "metadata.payload.input", "must be a JSON object"),
        ({"tool_name": "bash", "error": 1}, "metadata.payload.error", "must be a string"),
        ({"tool_name": "bash", "exit_code": 1}, "metadata.payload.exit_code", "unknown field"),
    ],
)
def test_tool_call_errors_name_the_field(payload: Any, field: str, problem: str) -> None:
    assert_invalid(envelope("TOOL_CALL", payload), field, problem)


# --- parse -----------------------------------------------------------------------


def test_parse_null_is_legacy_text() -> None:
    assert parse_message_metadata(None) == ParsedMessageMetadata("TEXT", 1, None, {}, is_legacy=True)


def test_parse_legacy_dict_keeps_its_keys_as_extras() -> None:
    assert parse_message_metadata({"source": "cli"}) == ParsedMessageMetadata(
        "TEXT", 1, None, {"source": "cli"}, is_legacy=True
    )


def test_parse_text_envelope_has_no_payload() -> None:
    assert parse_message_metadata({"message_type": "TEXT", "version": 2, "k": 1}) == ParsedMessageMetadata(
        "TEXT", 2, None, {"k": 1}, is_legacy=False
    )


@pytest.mark.parametrize(
    ("message_type", "payload", "expected"),
    [
        ("CODE_EDIT", {"edits": [{"file_path": "a.py"}]}, CodeEditPayload(edits=[FileEdit(file_path="a.py")])),
        ("TODO", todos("pending"), TodoPayload(todos=[TodoItem(id="0", content="task 0", status="pending")])),
        ("TOOL_CALL", {"tool_name": "bash"}, ToolCallPayload(tool_name="bash")),
    ],
)
def test_parse_known_types_gives_typed_payloads(message_type: str, payload: Any, expected: Any) -> None:
    parsed = parse_message_metadata(envelope(message_type, payload, source="cli"))
    assert parsed == ParsedMessageMetadata(message_type, 1, expected, {"source": "cli"}, is_legacy=False)
    assert type(parsed.payload) is type(expected)


def test_parse_unknown_type_keeps_raw_payload() -> None:
    assert parse_message_metadata(envelope("IMAGE", [1, 2])).payload == [1, 2]


def test_parse_validates_like_normalize() -> None:
    with pytest.raises(InvalidMessageMetadata) as info:
        parse_message_metadata(envelope("TODO", {"todos": []}))
    assert info.value.field == "metadata.payload.todos"


def test_parsed_metadata_is_frozen() -> None:
    parsed = parse_message_metadata(None)
    with pytest.raises(AttributeError):
        parsed.version = 2  # type: ignore[misc]


# --- build -----------------------------------------------------------------------


def test_build_makes_a_normalized_envelope() -> None:
    out = build_structured_envelope("TOOL_CALL", {"tool_name": "bash"}, extras={"run_id": "r1"}, version=2)
    assert out == {
        "message_type": "TOOL_CALL",
        "version": 2,
        "payload": {"tool_name": "bash", "input": {}, "output": None, "error": None},
        "run_id": "r1",
    }
    assert list(out) == ["message_type", "version", "payload", "run_id"]


@pytest.mark.parametrize("key", ["message_type", "version", "payload"])
def test_build_rejects_envelope_keys_in_extras(key: str) -> None:
    with pytest.raises(InvalidMessageMetadata) as info:
        build_structured_envelope("TEXT", {}, extras={key: "x"})
    assert info.value.field == f"extras.{key}"
    assert str(info.value) == f"extras.{key}: is reserved for the envelope itself"


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("CODE_EDIT", {"edits": []}), "metadata.payload.edits"),
        (("", {}), "metadata.message_type"),
        (("TEXT", {"x": 1}), "metadata.payload"),
    ],
)
def test_build_validates(args: tuple[str, Any], field: str) -> None:
    with pytest.raises(InvalidMessageMetadata) as info:
        build_structured_envelope(*args)
    assert info.value.field == field


def test_build_validates_version() -> None:
    with pytest.raises(InvalidMessageMetadata) as info:
        build_structured_envelope("TEXT", {}, version=0)
    assert info.value.field == "metadata.version"


# --- previews --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("edits", "expected"),
    [
        ([edit("src/main.py")], "Edited src/main.py"),
        ([edit("new.py", old=None)], "Created new.py"),
        ([edit("old.py", new=None)], "Deleted old.py"),
        ([edit("x.py", old=None, new=None)], "Edited x.py"),
        ([edit("a.py", old=None), edit("a.py")], "Edited a.py"),
        ([edit("a.py", old=None), edit("a.py", old=None)], "Created a.py"),
        ([edit("a"), edit("b", old=None), edit("c", new=None)], "Edited 3 files: a, b, c"),
        ([edit(p) for p in "abcde"], "Edited 5 files: a, b, c, +2 more"),
    ],
)
def test_preview_code_edit(edits: list[dict[str, Any]], expected: str) -> None:
    assert preview_for(build_structured_envelope("CODE_EDIT", {"edits": edits})) == expected


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        (("completed", "pending", "pending"), "Todos 1/3 done"),
        (("completed", "in_progress", "in_progress"), "Todos 1/3 done · now: task 1"),
        (("completed", "completed"), "Todos 2/2 done"),
    ],
)
def test_preview_todo(statuses: tuple[str, ...], expected: str) -> None:
    assert preview_for(envelope("TODO", todos(*statuses))) == expected


def test_preview_todo_clips_long_current_item() -> None:
    payload = {"todos": [{"id": "1", "content": "x" * 100, "status": "in_progress"}]}
    assert preview_for(envelope("TODO", payload)) == "Todos 0/1 done · now: " + "x" * 59 + "…"


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"tool_name": "bash"}, "Called bash"),
        ({"tool_name": "bash", "error": "exit 1"}, "Called bash (error: exit 1)"),
        ({"tool_name": "bash", "error": "Traceback:\n  line 3"}, "Called bash (error: Traceback:)"),
        ({"tool_name": "bash", "error": ""}, "Called bash"),
    ],
)
def test_preview_tool_call(payload: dict[str, Any], expected: str) -> None:
    assert preview_for(envelope("TOOL_CALL", payload)) == expected


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        (envelope("IMAGE", {"url": "x"}), "[IMAGE message]"),
        ({"message_type": "TEXT"}, ""),
        ({"source": "cli"}, ""),
        (None, ""),
    ],
)
def test_preview_other_types(meta: Any, expected: str) -> None:
    assert preview_for(meta) == expected


# --- one schema, shared with the agent runner ----------------------------------------
# The envelope types are the protocol's Structs: what the runner's code builds
# goes through the wire and the host's validation unchanged, byte for byte.


def _runner_envelopes() -> list[KnownEnvelope]:
    return [
        runner_envelopes.code_edit("src/app.py", None, "x = 1\n"),
        runner_envelopes.code_edit("notes.md", "old\n", "new\n"),
        runner_envelopes.todo(
            [
                {"id": "1", "content": "plan", "status": "completed"},
                {"id": "2", "content": "ship", "status": "in_progress"},
            ]
        ),
        runner_envelopes.tool_call("bash", {"command": "ls", "env": {"A": ["1", 2]}}, "out\n", is_error=False),
        runner_envelopes.tool_call("edit_file", {"path": "a.py"}, "edit_file: no such file", is_error=True),
    ]


def _tool_result(envelope: dict[str, Any] | None) -> ToolResultEvent:
    """A tool result as the host reads it: serialized by the runner, parsed from the line."""
    event = ToolResultEvent(tool_use_id="t1", name="some_tool", output="ok", exit_code=0, envelope=envelope)
    parsed = parse_event(dump_event(event))
    assert isinstance(parsed, ToolResultEvent)
    return parsed


def test_the_host_validates_with_the_protocol_structs() -> None:
    assert (CodeEditPayload, FileEdit, TodoItem, TodoPayload, ToolCallPayload) == (
        protocol.CodeEditPayload,
        protocol.FileEdit,
        protocol.TodoItem,
        protocol.TodoPayload,
        protocol.ToolCallPayload,
    )
    assert (messages.CODE_EDIT, messages.TODO, messages.TOOL_CALL, messages.TEXT) == (
        protocol.CODE_EDIT,
        protocol.TODO,
        protocol.TOOL_CALL,
        protocol.TEXT,
    )


@pytest.mark.parametrize("built", _runner_envelopes(), ids=lambda e: e.message_type)
def test_a_runner_envelope_round_trips_through_the_host_unchanged(built: KnownEnvelope) -> None:
    wire = envelope_to_dict(built)
    assert list(wire) == ["message_type", "version", "payload"]
    # normalized on the host: the same object, the same JSON bytes as the runner's Struct
    normalized = normalize_message_metadata(json.loads(json.dumps(wire)))
    assert normalized == wire
    assert msgspec.json.encode(normalized) == msgspec.json.encode(built)
    # parsed on the host: the runner's own payload Struct
    parsed = parse_message_metadata(wire)
    assert (parsed.message_type, parsed.version, parsed.payload) == (built.message_type, built.version, built.payload)
    assert type(parsed.payload) is type(built.payload)
    # stored from a tool result event: the envelope as sent, the result's facts as extras
    out = event_to_message(_tool_result(wire), run_id="r", index=1, assistant_name="A")
    assert out is not None
    assert out.metadata == {**wire, "exit_code": 0, "tool_use_id": "t1", "tool": "some_tool"}


def test_a_stored_row_from_before_the_shared_structs_reads_back_byte_for_byte() -> None:
    # A CODE_EDIT as the host stored it with its pydantic payload models.
    row = (
        '{"message_type":"CODE_EDIT","version":1,"payload":{"edits":[{"file_path":"a.py","old_content":null,'
        '"new_content":"x","language":"python"}]},"exit_code":0,"tool_use_id":"t1","tool":"write_file"}'
    )
    assert msgspec.json.encode(normalize_message_metadata(json.loads(row))).decode() == row


def test_an_unknown_envelope_type_from_a_newer_runner_passes_through() -> None:
    wire = {"message_type": "DIAGRAM", "version": 3, "payload": {"svg": "<svg/>", "nodes": [1, {"a": None}]}}
    assert isinstance(protocol.envelope_from_dict(wire), OtherEnvelope)
    assert normalize_message_metadata(wire) == wire
    out = event_to_message(_tool_result(wire), run_id="r", index=1, assistant_name="A")
    assert out is not None and out.metadata is not None
    assert out.metadata == {**wire, "exit_code": 0, "tool_use_id": "t1", "tool": "some_tool"}
    assert "invalid_envelope" not in out.metadata


@pytest.mark.parametrize(
    ("built", "field", "problem"),
    [
        # Structs are not validated when built in code: the host still checks what it receives.
        (runner_envelopes.code_edit("", None, "x"), "metadata.payload.edits[0].file_path", "must not be empty"),
        (runner_envelopes.todo([]), "metadata.payload.todos", "must not be empty"),
        (
            runner_envelopes.todo([{"id": "1", "content": "x", "status": "done"}]),
            "metadata.payload.todos[0].status",
            "must be one of pending, in_progress, completed",
        ),
    ],
)
def test_a_malformed_runner_envelope_is_refused_naming_the_field(
    built: KnownEnvelope, field: str, problem: str
) -> None:
    wire = envelope_to_dict(built)
    assert_invalid(wire, field, problem)
    # from a tool result: the envelope is dropped with the reason, the result is kept
    out = event_to_message(_tool_result(wire), run_id="r", index=1, assistant_name="A")
    assert out is not None and out.content == "ok"
    assert out.metadata == {
        "exit_code": 0,
        "tool_use_id": "t1",
        "tool": "some_tool",
        "invalid_envelope": f"{field}: {problem}",
    }


@pytest.mark.parametrize(
    ("wire", "field", "problem"),
    [
        (
            {"message_type": "CODE_EDIT", "version": 1, "payload": {"edits": [{"path": "a.py"}]}},
            "metadata.payload.edits[0].path",
            "unknown field",
        ),
        (
            {"message_type": "TOOL_CALL", "version": 1, "payload": {"input": {}}},
            "metadata.payload.tool_name",
            "is required",
        ),
        ({"message_type": "TODO", "version": 1, "payload": "todos"}, "metadata.payload", "must be a JSON object"),
        (
            {"message_type": "TOOL_CALL", "version": 0, "payload": {"tool_name": "x"}},
            "metadata.version",
            "must be an integer >= 1",
        ),
    ],
)
def test_a_malformed_envelope_on_the_wire_costs_only_the_envelope(
    wire: dict[str, Any], field: str, problem: str
) -> None:
    out = event_to_message(_tool_result(wire), run_id="r", index=1, assistant_name="A")
    assert out is not None and out.metadata is not None
    assert out.metadata["invalid_envelope"] == f"{field}: {problem}"
    assert "message_type" not in out.metadata
