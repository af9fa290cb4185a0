"""The ``ask_user`` tool in the runner (agent_runner/tools/ask_user.py): the question goes out
as a ``question`` event with the call's id instead of a result and the run ends
(``asked_user``); bad questions are refused for the model to correct; one per run; the
offline model's ``/ask`` lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent_runner.protocol import Limits, QuestionEvent
from agent_runner.providers.offline import tool_requests_in
from agent_runner.tools import ToolContext, run_tool
from tests.container.runner_harness import RunRunner, make_input


def context(tmp_path: Path) -> tuple[ToolContext, list[Any]]:
    emitted: list[Any] = []
    return ToolContext(workspace=tmp_path, limits=Limits(), chat_jid="team@g.us", emit=emitted.append), emitted


def test_a_question_is_handed_back_to_the_loop_not_emitted_by_the_tool(tmp_path: Path) -> None:
    ctx, emitted = context(tmp_path)
    out = run_tool("ask_user", {"question": " Which colour? ", "options": ["red ", "blue"], "multiple": True}, ctx)
    assert not out.is_error and "the answer will come as the next message" in out.output
    assert out.question == QuestionEvent(
        tool_use_id="", question="Which colour?", options=["red", "blue"], multiple=True
    )
    assert emitted == []  # the loop emits it, with the call's id
    again = run_tool("ask_user", {"question": "And?", "options": ["a", "b"]}, ctx)
    assert again.is_error and "one question per run" in again.output and again.question is None


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ({"options": ["a", "b"]}, "missing required field `question`"),
        ({"question": "q", "options": ["a"]}, "length >= 2"),
        ({"question": "q", "options": [str(i) + "x" for i in range(11)]}, "length <= 10"),
        ({"question": "q", "options": ["a", "x" * 76]}, "length <= 75"),
        ({"question": "q", "options": ["Yes", "yes"]}, "must differ"),
        ({"question": "q", "options": ["a\nb", "c"]}, "one line"),
        ({"question": "q", "options": ["a", "b"], "when": "now"}, "unknown field `when`"),
        ({"question": " ", "options": ["a", "b"]}, "need words"),
    ],
)
def test_bad_questions_are_refused_for_the_model_to_correct(tmp_path: Path, args: dict[str, Any], said: str) -> None:
    ctx, emitted = context(tmp_path)
    out = run_tool("ask_user", args, ctx)
    assert out.is_error and said in out.output and out.question is None and emitted == []


def test_the_run_ends_with_the_question_and_no_result_for_its_call(run_runner: RunRunner) -> None:
    result = run_runner(make_input("/ask Which colour? | red | blue\n$ echo side"))
    assert result.returncode == 0, result.stderr
    (call,) = [e for e in result.of_type("tool_use") if e["name"] == "ask_user"]
    (question,) = result.of_type("question")
    assert question == {
        "type": "question",
        "tool_use_id": call["id"],
        "question": "Which colour?",
        "options": ["red", "blue"],
        "multiple": False,
        "allow_other": False,
    }
    # The other call of the turn ran and has its result; the question's call has none.
    assert [e["name"] for e in result.of_type("tool_result")] == ["bash"]
    (end,) = result.of_type("result")
    assert end["stop_reason"] == "asked_user" and end["num_turns"] == 1
    assert result.types[-1] == "result"


def test_the_offline_model_asks_with_ask_lines() -> None:
    assert tool_requests_in("/ask Pick one | a | b | c") == [
        ("ask_user", {"question": "Pick one", "options": ["a", "b", "c"]})
    ]
    assert tool_requests_in("/ask no options here") == []
