"""Tool calls on Chat Completions, both ways: our calls' input as the API's JSON string,
and the API's calls (whole, or in fragments as a stream sends them) as our tool uses.

A tool call whose ``arguments`` are not a JSON object (small local models do
this) does not end the run: the call's input becomes ``{"_raw": <the
arguments>}``, the tool then refuses it as an error result, and that result
is sent back prefixed with a note that the arguments were not valid JSON, so
the model can call again correctly (``openai_request.py``).  A call without an
id (some servers omit it) gets one: we need it to answer.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from ..errors import ProviderError
from ..protocol import JsonObject
from .base import ToolUseBlock
from .openai_errors import snippet

log = logging.getLogger(__name__)

# Input of a tool call whose arguments were not a JSON object.
RAW_ARGUMENTS_KEY = "_raw"
INVALID_ARGUMENTS_NOTE = "[the arguments of this call were not a valid JSON object: {raw}]"


def raw_arguments(call: ToolUseBlock) -> str | None:
    """The arguments as the model sent them, when they were not a JSON object (else None)."""
    raw = call.input.get(RAW_ARGUMENTS_KEY)
    return raw if set(call.input) == {RAW_ARGUMENTS_KEY} and isinstance(raw, str) else None


def tool_input(name: str, arguments: Any) -> JsonObject:
    if isinstance(arguments, dict):  # a few servers send an object, not a string
        return arguments
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    log.warning("tool call %s: arguments are not a JSON object: %s", name, snippet(raw))
    return {RAW_ARGUMENTS_KEY: raw}


def tool_use(call: Any, index: int) -> ToolUseBlock:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ProviderError(f"tool call without a function name: {snippet(json.dumps(call))}", retryable=False)
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        call_id = f"call_{index}_{uuid.uuid4().hex[:12]}"  # some servers omit it; we need one to answer
    name = function["name"]
    return ToolUseBlock(id=call_id, name=name, input=tool_input(name, function.get("arguments")))


class CallParts:
    """One tool call while its fragments arrive: the id and name come once, the arguments in pieces."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.arguments: list[str] = []

    def add(self, fragment: JsonObject) -> None:
        if isinstance(fragment.get("id"), str) and fragment["id"]:
            self.id = fragment["id"]
        function = fragment.get("function")
        if isinstance(function, dict):
            if isinstance(function.get("name"), str) and function["name"]:
                self.name = function["name"]
            if isinstance(function.get("arguments"), str):
                self.arguments.append(function["arguments"])
            elif isinstance(function.get("arguments"), dict):  # a few servers send an object whole
                self.arguments.append(json.dumps(function["arguments"]))

    def wire(self) -> JsonObject:
        function: JsonObject = {"arguments": "".join(self.arguments)}
        if self.name is not None:
            function["name"] = self.name
        return {"id": self.id, "type": "function", "function": function}
