"""The ``add_reaction`` tool in the runner (agent_runner/tools/add_reaction.py): it asks the
host with a ``react`` event carrying the table's form of the emoji, refuses an emoji outside
the table (naming the table) and says when Telegram cannot show one; the offline model's
``/react`` lines; and the table in docs/messages.md is the code's."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from agent_runner.protocol import REACTIONS, Limits, ReactEvent, reaction_of
from agent_runner.providers.offline import tool_requests_in
from agent_runner.tools import ToolContext, run_tool

DOCS = Path(__file__).resolve().parents[2] / "docs" / "messages.md"


def _react(tmp_path: Path, args: dict[str, Any]) -> tuple[Any, list[Any]]:
    emitted: list[Any] = []
    ctx = ToolContext(workspace=tmp_path, limits=Limits(), chat_jid="team@g.us", emit=emitted.append)
    return run_tool("add_reaction", args, ctx), emitted


def test_add_reaction_asks_the_host_with_the_tables_emoji(tmp_path: Path) -> None:
    out, emitted = _react(tmp_path, {"emoji": "👍", "nth_last": 2})
    assert not out.is_error and "Asked the host to react with 👍" in out.output and "Telegram" not in out.output
    assert emitted == [ReactEvent(emoji="👍", nth_last=2)]
    # Without its variation selector, the heart is still the table's heart (sent as the table has it).
    out, emitted = _react(tmp_path, {"emoji": "❤"})
    assert emitted == [ReactEvent(emoji="❤️", nth_last=1)]


def test_an_emoji_telegram_cannot_show_is_said_in_the_result(tmp_path: Path) -> None:
    out, emitted = _react(tmp_path, {"emoji": "✅"})
    assert not out.is_error and "Telegram cannot show this emoji" in out.output
    assert emitted == [ReactEvent(emoji="✅")]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ({}, "missing required field `emoji`"),
        ({"emoji": " "}, "'emoji' must not be empty"),
        ({"emoji": "🦖"}, "'🦖' is not one of the reactions every channel takes: 👍 👎"),
        ({"emoji": "👍👍"}, "is not one of the reactions"),
        ({"emoji": ":thumbsup:"}, "is not one of the reactions"),
        ({"emoji": "👍", "nth_last": 0}, "Expected `int` >= 1 - at `$.nth_last`"),
        ({"emoji": "👍", "nth_last": 51}, "Expected `int` <= 50 - at `$.nth_last`"),
    ],
)
def test_what_the_runner_can_see_is_wrong_is_refused(tmp_path: Path, args: dict[str, Any], said: str) -> None:
    out, emitted = _react(tmp_path, args)
    assert out.is_error and said in out.output and emitted == []


def test_the_offline_model_reacts_with_react_lines() -> None:
    assert tool_requests_in("/react 👍") == [("add_reaction", {"emoji": "👍"})]
    assert tool_requests_in("/reactions 👍") == []  # a directive is its whole word


def test_the_documented_table_is_the_codes() -> None:
    rows = re.findall(r"^\| (\S+) \| `:([^`]+):` \| (\S+) \|$", DOCS.read_text(encoding="utf-8"), re.M)
    assert [(e, s, None if t == "—" else t) for e, s, t in rows] == [tuple(r) for r in REACTIONS]
    # Every Telegram form is the table's emoji without its variation selector (what Telegram lists).
    assert all(r.telegram in (None, r.emoji.replace("\ufe0f", "")) for r in REACTIONS)
    assert all(reaction_of(r.emoji) == r for r in REACTIONS)
