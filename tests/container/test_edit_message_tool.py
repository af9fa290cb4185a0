"""The ``edit_message`` tool in the runner (agent_runner/tools/edit_message.py): it asks the
host with an ``edit`` event, refusing early what it can see is wrong; the offline model's
``/edit-last`` lines (``/edit`` stays the file edit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent_runner.protocol import EditEvent, Limits
from agent_runner.providers.offline import tool_requests_in
from agent_runner.tools import ToolContext, run_tool


def test_edit_message_asks_the_host(tmp_path: Path) -> None:
    emitted: list[Any] = []
    ctx = ToolContext(workspace=tmp_path, limits=Limits(), chat_jid="team@g.us", emit=emitted.append)
    out = run_tool("edit_message", {"text": "done: 42", "nth_last": 2}, ctx)
    assert not out.is_error and "Asked the host" in out.output
    assert emitted == [EditEvent(text="done: 42", nth_last=2)]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ({}, "missing required field `text`"),
        ({"text": " "}, "'text' must not be empty"),
        ({"text": "x" * 20_001}, "length <= 20000 - at `$.text`"),
        ({"text": "x", "nth_last": 0}, "Expected `int` >= 1 - at `$.nth_last`"),
        ({"text": "x", "nth_last": 51}, "Expected `int` <= 50 - at `$.nth_last`"),
    ],
)
def test_what_the_runner_can_see_is_wrong_is_refused(tmp_path: Path, args: dict[str, Any], said: str) -> None:
    emitted: list[Any] = []
    ctx = ToolContext(workspace=tmp_path, limits=Limits(), chat_jid="team@g.us", emit=emitted.append)
    out = run_tool("edit_message", args, ctx)
    assert out.is_error and said in out.output and emitted == []


def test_the_offline_model_edits_with_edit_last_lines() -> None:
    assert tool_requests_in("/edit-last the result is 42") == [("edit_message", {"text": "the result is 42"})]
    block = "/edit notes.md\nold\n/with\nnew\n/end"
    assert tool_requests_in(block) == [("edit_file", {"path": "notes.md", "old_string": "old", "new_string": "new"})]
