"""The file tools (read/write/edit/glob/grep/todo), their envelopes and the offline directives."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import pytest
from runner_harness import RunRunner, make_input

from agent_runner import envelopes
from agent_runner.loop import envelope_for
from agent_runner.protocol import (
    KnownEnvelope,
    Limits,
    OtherEnvelope,
    ProtocolError,
    ToolCallEnvelope,
    ToolResultEvent,
    envelope_from_dict,
    envelope_to_dict,
    parse_event,
)
from agent_runner.providers.base import ToolSpec, ToolUseBlock
from agent_runner.providers.offline import OfflineProvider, tool_requests_in
from agent_runner.tools import REGISTRY, ToolContext, ToolOutcome, run_tool


@pytest.fixture
def ctx(workspace: Path) -> ToolContext:
    return ToolContext(workspace=workspace, limits=Limits())


def small_ctx(workspace: Path, cap: int = 256) -> ToolContext:
    return ToolContext(workspace=workspace, limits=Limits(output_cap_bytes=cap))


def ok(outcome: ToolOutcome) -> str:
    assert not outcome.is_error and outcome.exit_code == 0, outcome.output
    return outcome.output


def wire(envelope: KnownEnvelope | None) -> dict[str, Any]:
    """The envelope as the runner puts it on the wire."""
    assert envelope is not None
    return envelope_to_dict(envelope)


# --- registry -------------------------------------------------------------------


def test_registry_lists_every_tool_with_an_object_schema() -> None:
    assert list(REGISTRY) == [
        "bash",
        "read_file",
        "write_file",
        "edit_file",
        "glob",
        "grep",
        "todo_write",
        "send_message",
        "send_file",
        "schedule_task",
        "list_tasks",
        "update_task",
        "pause_task",
        "resume_task",
        "cancel_task",
        "ask_user",
        "edit_message",
        "add_reaction",
    ]
    for name, tool in REGISTRY.items():
        assert tool.spec.name == name and tool.spec.description
        assert tool.spec.input_schema["type"] == "object"
        assert set(tool.spec.input_schema["required"]) <= set(tool.spec.input_schema["properties"])


def test_each_schema_the_model_sees_names_its_structs_fields() -> None:
    # The schemas are written for the model; the Structs decide. They name the same
    # arguments, and what the schema requires the Struct requires.
    for name, tool in REGISTRY.items():
        fields = msgspec.inspect.type_info(tool.args).fields
        schema = tool.spec.input_schema
        assert set(schema["properties"]) == {f.name for f in fields}, name
        assert set(schema["required"]) == {f.name for f in fields if f.required}, name


@pytest.mark.parametrize("tool", ["read_file", "glob", "grep", "send_file"])
def test_null_stands_for_an_argument_left_out(workspace: Path, ctx: ToolContext, tool: str) -> None:
    (workspace / "f.txt").write_text("only\n")
    args = {"read_file": {"path": "f.txt", "offset": None, "limit": None}, "glob": {"pattern": "*", "path": None}}
    args |= {"grep": {"pattern": "only", "path": None, "glob": None}, "send_file": {"path": "f.txt", "caption": None}}
    out = run_tool(tool, args[tool], replace(ctx, emit=lambda event: None))
    assert not out.is_error, out.output
    missing = run_tool(tool, {**args[tool], next(iter(args[tool])): None}, ctx)
    assert (missing.is_error, missing.exit_code) == (True, 2) and "missing required field" in missing.output


def test_unknown_keys_are_ignored_unless_a_struct_forbids_them(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "f.txt").write_text("only\n")
    assert not run_tool("read_file", {"path": "f.txt", "why": "to look"}, ctx).is_error
    asked = run_tool("ask_user", {"question": "q?", "options": ["a", "b"], "why": "x"}, ctx)
    assert asked.is_error and asked.output == "ask_user: Object contains unknown field `why`"


# --- workspace confinement ----------------------------------------------------------


def test_dotdot_traversal_is_refused(workspace: Path, ctx: ToolContext) -> None:
    out = run_tool("write_file", {"path": "../escape.txt", "content": "x"}, ctx)

    assert out.is_error and out.exit_code == 1
    assert out.output == (
        f"write_file: ../escape.txt is outside the workspace {workspace}; only paths inside it are allowed"
    )
    assert not (workspace.parent / "escape.txt").exists()


def test_dotdot_that_stays_inside_is_allowed(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "a").mkdir()
    assert ok(run_tool("write_file", {"path": "a/../b.txt", "content": "hi"}, ctx)) == "Wrote 2 bytes to b.txt"
    assert (workspace / "b.txt").read_text() == "hi"


def test_absolute_path_outside_is_refused(ctx: ToolContext) -> None:
    out = run_tool("read_file", {"path": "/etc/passwd"}, ctx)

    assert out.is_error and out.exit_code == 1
    assert out.output.startswith("read_file: /etc/passwd is outside the workspace ")


def test_absolute_path_inside_is_allowed(workspace: Path, ctx: ToolContext) -> None:
    target = workspace / "abs.txt"
    assert ok(run_tool("write_file", {"path": str(target), "content": "one\n"}, ctx)) == "Wrote 4 bytes to abs.txt"
    assert ok(run_tool("read_file", {"path": str(target)}, ctx)) == "     1\tone\n"


@pytest.fixture
def outside(tmp_path: Path, workspace: Path) -> Path:
    """A directory beside the workspace with a secret, linked from inside it."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.txt").write_text("top secret\n")
    (workspace / "link").symlink_to(out)
    (workspace / "secret-link.txt").symlink_to(out / "secret.txt")
    return out


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("read_file", {"path": "link/secret.txt"}),
        ("read_file", {"path": "secret-link.txt"}),
        ("write_file", {"path": "link/new.txt", "content": "x"}),
        ("write_file", {"path": "secret-link.txt", "content": "x"}),
        ("edit_file", {"path": "secret-link.txt", "old_string": "top", "new_string": "no"}),
        ("grep", {"pattern": "secret", "path": "link"}),
        ("glob", {"pattern": "*", "path": "link"}),
    ],
)
def test_symlink_escape_is_refused(outside: Path, ctx: ToolContext, tool: str, args: dict[str, Any]) -> None:
    out = run_tool(tool, args, ctx)

    assert out.is_error and out.exit_code == 1
    assert f"{args['path']} is outside the workspace" in out.output
    assert (outside / "secret.txt").read_text() == "top secret\n"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_search_tools_skip_symlinks_leading_outside(outside: Path, workspace: Path, ctx: ToolContext) -> None:
    (workspace / "mine.txt").write_text("secret of my own\n")

    assert ok(run_tool("glob", {"pattern": "**/*.txt"}, ctx)) == "mine.txt"
    assert ok(run_tool("glob", {"pattern": "link/*"}, ctx)) == "no files match link/*"
    assert ok(run_tool("grep", {"pattern": "secret"}, ctx)) == "mine.txt:1:secret of my own"


def test_symlink_inside_the_workspace_is_followed(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "real.txt").write_text("real\n")
    (workspace / "alias.txt").symlink_to(workspace / "real.txt")

    assert ok(run_tool("read_file", {"path": "alias.txt"}, ctx)) == "     1\treal\n"


# --- read_file -------------------------------------------------------------------------


def test_read_file_numbers_lines_like_cat_n(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "f.txt").write_bytes(b"one\r\ntwo\n\nfour")

    assert ok(run_tool("read_file", {"path": "f.txt"}, ctx)) == "     1\tone\n     2\ttwo\n     3\t\n     4\tfour\n"


def test_read_file_offset_and_limit(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "f.txt").write_text("".join(f"l{i}\n" for i in range(1, 6)))

    out = ok(run_tool("read_file", {"path": "f.txt", "offset": 2, "limit": 2}, ctx))
    assert out == "     2\tl2\n     3\tl3\n[more lines follow; continue with offset=4]"
    assert ok(run_tool("read_file", {"path": "f.txt", "offset": 5}, ctx)) == "     5\tl5\n"


def test_read_file_output_is_capped(workspace: Path) -> None:
    (workspace / "f.txt").write_text("x" * 20 + "\n" + ("y" * 20 + "\n") * 99)

    out = ok(run_tool("read_file", {"path": "f.txt"}, small_ctx(workspace, 256)))
    # each line takes 6 + 1 + 20 + 1 = 28 bytes: 9 fit in 256
    assert out.count("\n") == 9
    assert out.endswith("     9\t" + "y" * 20 + "\n[output capped at 256 bytes; continue with offset=10]")


def test_read_file_one_huge_line_is_cut(workspace: Path) -> None:
    (workspace / "f.txt").write_text("z" * 1000 + "\nnext\n")

    out = ok(run_tool("read_file", {"path": "f.txt"}, small_ctx(workspace, 256)))
    assert out == "     1\t" + "z" * 249 + "\n[line 1 truncated at 256 bytes; continue with offset=2]"


def test_read_file_empty_file(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "empty").write_text("")
    assert ok(run_tool("read_file", {"path": "empty"}, ctx)) == "[empty file]"


@pytest.mark.parametrize(
    ("args", "exit_code", "message"),
    [
        ({}, 2, "read_file: Object missing required field `path`"),
        ({"path": 3}, 2, "read_file: Expected `str`, got `int` - at `$.path`"),
        ({"path": "f.txt", "offset": 0}, 2, "read_file: Expected `int` >= 1 - at `$.offset`"),
        ({"path": "f.txt", "limit": True}, 2, "read_file: Expected `int`, got `bool` - at `$.limit`"),
        ({"path": "f.txt", "limit": 1.5}, 2, "read_file: Expected `int`, got `float` - at `$.limit`"),
        ({"path": " "}, 2, "read_file: 'path' must not be empty"),
        ({"path": "f.txt", "offset": 3}, 2, "read_file: f.txt has 1 lines; offset 3 is past the end"),
        ({"path": "nope.txt"}, 1, "read_file: nope.txt: no such file"),
        ({"path": "sub"}, 1, "read_file: sub: not a regular file"),
        ({"path": "bin.dat"}, 1, "read_file: bin.dat: binary file (4 bytes); use bash to inspect it"),
    ],
)
def test_read_file_errors(
    workspace: Path, ctx: ToolContext, args: dict[str, Any], exit_code: int, message: str
) -> None:
    (workspace / "f.txt").write_text("only\n")
    (workspace / "sub").mkdir()
    (workspace / "bin.dat").write_bytes(b"a\x00bc")

    out = run_tool("read_file", args, ctx)
    assert (out.is_error, out.exit_code, out.output) == (True, exit_code, message)


# --- write_file ----------------------------------------------------------------------


def test_write_file_creates_parents_and_a_code_edit_envelope(workspace: Path, ctx: ToolContext) -> None:
    out = run_tool("write_file", {"path": "src/pkg/mod.py", "content": "x = 'é'\n"}, ctx)

    assert ok(out) == "Wrote 9 bytes to src/pkg/mod.py"
    assert (workspace / "src/pkg/mod.py").read_text(encoding="utf-8") == "x = 'é'\n"
    assert wire(out.envelope) == {
        "message_type": "CODE_EDIT",
        "version": 1,
        "payload": {
            "edits": [
                {"file_path": "src/pkg/mod.py", "old_content": None, "new_content": "x = 'é'\n", "language": "python"}
            ]
        },
    }


def test_write_file_overwrite_keeps_the_old_content(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "notes.md").write_text("old\n")
    out = run_tool("write_file", {"path": "notes.md", "content": ""}, ctx)

    assert ok(out) == "Wrote 0 bytes to notes.md"
    assert (workspace / "notes.md").read_text() == ""
    assert wire(out.envelope)["payload"]["edits"] == [
        {"file_path": "notes.md", "old_content": "old\n", "new_content": "", "language": "markdown"}
    ]


def test_write_file_envelope_caps_large_contents(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "big.txt").write_text("a" * 70_000)
    out = run_tool("write_file", {"path": "big.txt", "content": "b" * 66_000}, ctx)

    assert ok(out) == "Wrote 66000 bytes to big.txt"
    assert (workspace / "big.txt").read_text() == "b" * 66_000  # the file itself is complete
    (edit,) = wire(out.envelope)["payload"]["edits"]
    assert edit["old_content"] == "a" * 65536 + "\n[truncated: showing the first 65536 of 70000 bytes]"
    assert edit["new_content"] == "b" * 65536 + "\n[truncated: showing the first 65536 of 66000 bytes]"
    assert edit["language"] is None


@pytest.mark.parametrize(
    ("args", "exit_code", "message"),
    [
        ({"path": "f.txt"}, 2, "write_file: Object missing required field `content`"),
        ({"path": "", "content": "x"}, 2, "write_file: 'path' must not be empty"),
        ({"path": "f.txt", "content": ["x"]}, 2, "write_file: Expected `str`, got `array` - at `$.content`"),
        ({"path": "sub", "content": "x"}, 1, "write_file: sub: exists and is not a regular file"),
        ({"path": "file/child.txt", "content": "x"}, 1, "write_file: file/child.txt: file is not a directory"),
    ],
)
def test_write_file_errors(
    workspace: Path, ctx: ToolContext, args: dict[str, Any], exit_code: int, message: str
) -> None:
    (workspace / "sub").mkdir()
    (workspace / "file").write_text("i am a file")

    out = run_tool("write_file", args, ctx)
    assert (out.is_error, out.exit_code, out.output) == (True, exit_code, message)
    assert out.envelope is None
    assert not (workspace / "f.txt").exists()


# --- edit_file -------------------------------------------------------------------------


def test_edit_file_replaces_a_unique_string(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "app.ts").write_text("let a = 1;\nlet b = 2;\n")
    out = run_tool("edit_file", {"path": "app.ts", "old_string": "b = 2", "new_string": "b = 3"}, ctx)

    assert ok(out) == "Edited app.ts: replaced 1 occurrence"
    assert (workspace / "app.ts").read_text() == "let a = 1;\nlet b = 3;\n"
    assert out.envelope == envelopes.code_edit("app.ts", "let a = 1;\nlet b = 2;\n", "let a = 1;\nlet b = 3;\n")
    assert wire(out.envelope)["payload"]["edits"][0]["language"] == "typescript"


def test_edit_file_refuses_an_ambiguous_string(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "f.txt").write_text("x\nx\nx\n")
    out = run_tool("edit_file", {"path": "f.txt", "old_string": "x", "new_string": "y"}, ctx)

    assert out.is_error and out.exit_code == 1
    assert out.output == (
        "edit_file: old_string occurs 3 times in f.txt; add surrounding text to make it unique, "
        "or set replace_all to replace every occurrence"
    )
    assert (workspace / "f.txt").read_text() == "x\nx\nx\n"


def test_edit_file_replace_all(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "f.txt").write_text("x\nx\nx\n")
    out = run_tool("edit_file", {"path": "f.txt", "old_string": "x", "new_string": "yy", "replace_all": True}, ctx)

    assert ok(out) == "Edited f.txt: replaced 3 occurrences"
    assert (workspace / "f.txt").read_text() == "yy\nyy\nyy\n"


def test_edit_file_keeps_crlf_line_endings(workspace: Path, ctx: ToolContext) -> None:
    (workspace / "f.txt").write_bytes(b"a\r\nb\r\n")
    ok(run_tool("edit_file", {"path": "f.txt", "old_string": "b", "new_string": "c"}, ctx))
    assert (workspace / "f.txt").read_bytes() == b"a\r\nc\r\n"


@pytest.mark.parametrize(
    ("args", "exit_code", "message"),
    [
        ({"path": "f.txt", "old_string": "zzz", "new_string": "y"}, 1, "edit_file: old_string not found in f.txt"),
        (
            {"path": "nope.txt", "old_string": "a", "new_string": "b"},
            1,
            "edit_file: nope.txt: no such file; use write_file to create it",
        ),
        (
            {"path": "latin1.txt", "old_string": "a", "new_string": "b"},
            1,
            "edit_file: latin1.txt: not a UTF-8 text file",
        ),
        (
            {"path": "f.txt", "old_string": "", "new_string": "y"},
            2,
            "edit_file: 'old_string' must not be empty; use write_file to create or replace a file",
        ),
        (
            {"path": "f.txt", "old_string": "x", "new_string": "x"},
            2,
            "edit_file: 'old_string' and 'new_string' are the same; nothing to change",
        ),
        (
            {"path": "f.txt", "old_string": "x", "new_string": "y", "replace_all": "yes"},
            2,
            "edit_file: Expected `bool`, got `str` - at `$.replace_all`",
        ),
        ({"path": "f.txt", "old_string": "x"}, 2, "edit_file: Object missing required field `new_string`"),
    ],
)
def test_edit_file_errors(
    workspace: Path, ctx: ToolContext, args: dict[str, Any], exit_code: int, message: str
) -> None:
    (workspace / "f.txt").write_text("x\nx\n")
    (workspace / "latin1.txt").write_bytes("caf\xe9 a".encode("latin-1"))

    out = run_tool("edit_file", args, ctx)
    assert (out.is_error, out.exit_code, out.output) == (True, exit_code, message)
    assert out.envelope is None
    assert (workspace / "f.txt").read_text() == "x\nx\n"


# --- glob ------------------------------------------------------------------------------------


@pytest.fixture
def tree(workspace: Path) -> Path:
    for rel in ["b.py", "a.py", "sub/c.py", "sub/d.txt", "sub/deeper/e.py", ".git/config.py"]:
        path = workspace / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {rel}\nimport os\n")
    return workspace


def test_glob_lists_sorted_workspace_relative_files(tree: Path, ctx: ToolContext) -> None:
    assert ok(run_tool("glob", {"pattern": "*.py"}, ctx)) == "a.py\nb.py"
    assert ok(run_tool("glob", {"pattern": "**/*.py", "path": "sub"}, ctx)) == "sub/c.py\nsub/deeper/e.py"
    assert ok(run_tool("glob", {"pattern": "sub/*"}, ctx)) == "sub/c.py\nsub/d.txt"  # files only
    assert ok(run_tool("glob", {"pattern": "*.rs"}, ctx)) == "no files match *.rs"


def test_glob_caps_the_listing(workspace: Path, ctx: ToolContext) -> None:
    for i in range(503):
        (workspace / f"f{i:03}.txt").write_text("")
    out = ok(run_tool("glob", {"pattern": "*.txt"}, ToolContext(workspace, Limits(output_cap_bytes=100_000))))

    lines = out.splitlines()
    assert lines[:2] == ["f000.txt", "f001.txt"] and lines[499] == "f499.txt"
    assert lines[500:] == ["[showing the first 500 of 503 matches; narrow the pattern]"]


@pytest.mark.parametrize(
    ("args", "exit_code", "message"),
    [
        (
            {"pattern": "../*"},
            2,
            "glob: pattern must be relative and must not contain '..'; use 'path' to pick the directory",
        ),
        (
            {"pattern": "/etc/*"},
            2,
            "glob: pattern must be relative and must not contain '..'; use 'path' to pick the directory",
        ),
        ({}, 2, "glob: Object missing required field `pattern`"),
        ({"pattern": "*", "path": " "}, 2, "glob: 'path' must not be empty"),
        ({"pattern": "*", "path": "a.py"}, 1, "glob: a.py: not a directory"),
    ],
)
def test_glob_errors(tree: Path, ctx: ToolContext, args: dict[str, Any], exit_code: int, message: str) -> None:
    out = run_tool("glob", args, ctx)
    assert (out.is_error, out.exit_code, out.output) == (True, exit_code, message)


# --- grep ------------------------------------------------------------------------------------


def test_grep_reports_file_line_text(tree: Path, ctx: ToolContext) -> None:
    (tree / "notes.md").write_text("nothing\nimport me too\n")
    (tree / "blob.bin").write_bytes(b"import\x00os\n")

    out = ok(run_tool("grep", {"pattern": r"^import \w+$"}, ctx))
    # .git and binary files are skipped; files in path order, dirs walked sorted
    assert (
        out
        == "a.py:2:import os\nb.py:2:import os\nsub/c.py:2:import os\nsub/d.txt:2:import os\nsub/deeper/e.py:2:import os"
    )
    assert ok(run_tool("grep", {"pattern": "import", "glob": "*.md"}, ctx)) == "notes.md:2:import me too"
    assert ok(run_tool("grep", {"pattern": "#", "path": "sub", "glob": "sub/*.py"}, ctx)) == "sub/c.py:1:# sub/c.py"
    assert ok(run_tool("grep", {"pattern": "os", "path": "sub/d.txt"}, ctx)) == "sub/d.txt:2:import os"
    assert ok(run_tool("grep", {"pattern": "zzz"}, ctx)) == "no matches for zzz"


def test_grep_output_is_capped(workspace: Path) -> None:
    (workspace / "f.txt").write_text("hit\n" * 200)

    out = ok(run_tool("grep", {"pattern": "hit"}, small_ctx(workspace, 256)))
    # each line is "f.txt:N:hit" + newline: lines 1-9 take 12 bytes, 10-99 take 13
    assert out.splitlines()[-1] == "[output capped at 256 bytes after 20 lines; narrow the search]"
    assert out.splitlines()[:-1] == [f"f.txt:{n}:hit" for n in range(1, 21)]


@pytest.mark.parametrize(
    ("args", "exit_code", "message"),
    [
        ({"pattern": "("}, 2, "grep: invalid regular expression '(': missing ), unterminated subpattern at position 0"),
        ({"pattern": ""}, 2, "grep: 'pattern' must not be empty"),
        ({"pattern": "x", "path": "nope"}, 1, "grep: nope: no such file or directory"),
        ({"pattern": "x", "glob": 5}, 2, "grep: Expected `str | null`, got `int` - at `$.glob`"),
    ],
)
def test_grep_errors(workspace: Path, ctx: ToolContext, args: dict[str, Any], exit_code: int, message: str) -> None:
    out = run_tool("grep", args, ctx)
    assert (out.is_error, out.exit_code, out.output) == (True, exit_code, message)


# --- todo_write --------------------------------------------------------------------------


def test_todo_write_keeps_the_list_for_the_run(ctx: ToolContext) -> None:
    todos = [
        {"id": "1", "content": "read the code", "status": "completed"},
        {"id": "2", "content": "write tests", "status": "in_progress"},
        {"id": "3", "content": "ship", "status": "pending"},
    ]
    out = run_tool("todo_write", {"todos": todos}, ctx)

    assert ok(out) == (
        "Todo list updated: 1 completed, 1 in progress, 1 pending\n[x] read the code\n[~] write tests\n[ ] ship"
    )
    assert ctx.state.todos == todos
    assert wire(out.envelope) == {"message_type": "TODO", "version": 1, "payload": {"todos": todos}}

    # each call replaces the whole list
    ok(run_tool("todo_write", {"todos": [{"id": "9", "content": "other", "status": "pending"}]}, ctx))
    assert ctx.state.todos == [{"id": "9", "content": "other", "status": "pending"}]


def test_todo_write_empty_list_clears_and_falls_back_to_tool_call(ctx: ToolContext) -> None:
    ctx.state.todos = [{"id": "1", "content": "x", "status": "pending"}]
    call = ToolUseBlock("t1", "todo_write", {"todos": []})
    out = run_tool(call.name, call.input, ctx)

    assert ok(out) == "Cleared the todo list"
    assert ctx.state.todos == []
    assert wire(envelope_for(call, out)) == {
        "message_type": "TOOL_CALL",
        "version": 1,
        "payload": {
            "tool_name": "todo_write",
            "input": {"todos": []},
            "output": "Cleared the todo list",
            "error": None,
        },
    }


@pytest.mark.parametrize(
    ("todos", "message"),
    [
        ("do it", "todo_write: Expected `array`, got `str` - at `$.todos`"),
        (
            [{"id": "1", "content": "a", "status": "done"}],
            "todo_write: Invalid enum value 'done' - at `$.todos[0].status`; "
            "expected one of pending, in_progress, completed",
        ),
        (
            [{"id": "1", "content": "a", "status": "pending"}, {"id": "1", "content": "b", "status": "pending"}],
            "todo_write: todos[1].id '1' is used twice",
        ),
        (
            [{"id": 1, "content": "a", "status": "pending"}],
            "todo_write: Expected `str`, got `int` - at `$.todos[0].id`",
        ),
        (
            [{"id": "1", "content": " ", "status": "pending"}],
            "todo_write: 'content' must not be empty - at `$.todos[0]`",
        ),
        ([{"id": "1", "content": "a"}], "todo_write: Object missing required field `status` - at `$.todos[0]`"),
        (["a"], "todo_write: Expected `object`, got `str` - at `$.todos[0]`"),
    ],
)
def test_todo_write_errors_leave_the_list_alone(ctx: ToolContext, todos: Any, message: str) -> None:
    before = [{"id": "1", "content": "keep", "status": "pending"}]
    ctx.state.todos = list(before)
    out = run_tool("todo_write", {"todos": todos}, ctx)

    assert (out.is_error, out.exit_code, out.output) == (True, 2, message)
    assert ctx.state.todos == before


# --- envelopes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "language"),
    [
        ("a/b.py", "python"),
        ("x.JS", "javascript"),
        ("x.tsx", "typescript"),
        ("README.md", "markdown"),
        ("c.json", "json"),
        ("c.yml", "yaml"),
        ("run.sh", "shell"),
        ("Dockerfile", "dockerfile"),
        ("notes.txt", None),
        ("noext", None),
    ],
)
def test_language_is_guessed_from_the_file_name(path: str, language: str | None) -> None:
    assert envelopes.guess_language(path) == language


def test_failed_edit_falls_back_to_a_tool_call_envelope(workspace: Path, ctx: ToolContext) -> None:
    call = ToolUseBlock("t1", "write_file", {"path": "../x", "content": "data"})
    out = run_tool(call.name, call.input, ctx)

    assert wire(envelope_for(call, out)) == {
        "message_type": "TOOL_CALL",
        "version": 1,
        "payload": {
            "tool_name": "write_file",
            "input": {"path": "../x", "content": "data"},
            "output": "",
            "error": f"write_file: ../x is outside the workspace {workspace}; only paths inside it are allowed",
        },
    }


def test_an_error_outcome_never_keeps_its_own_envelope() -> None:
    call = ToolUseBlock("t1", "edit_file", {"path": "a.py"})
    outcome = ToolOutcome("edit_file: broke halfway", 1, True, envelope=envelopes.code_edit("a.py", None, "x"))

    env = envelope_for(call, outcome)
    assert isinstance(env, ToolCallEnvelope) and env.message_type == "TOOL_CALL"
    assert env.payload.error == "edit_file: broke halfway"


def test_tool_call_envelope_caps_long_text() -> None:
    env = envelopes.tool_call("bash", {"command": "c" * 70_000}, "o" * 70_000, is_error=False)

    note = "\n[truncated: showing the first 65536 of 70000 bytes]"
    assert env.payload.input == {"command": "c" * 65536 + note}
    assert env.payload.output == "o" * 65536 + note
    assert env.payload.error is None


def test_envelopes_are_the_protocol_structs_and_decode_by_type() -> None:
    built = [
        envelopes.code_edit("a.py", "x", "y"),
        envelopes.todo([{"id": "1", "content": "x", "status": "pending"}]),
        envelopes.tool_call("bash", {"command": "ls"}, "out", is_error=False),
    ]
    for envelope in built:
        assert envelope_from_dict(json.loads(json.dumps(wire(envelope)))) == envelope
    # the wire form: the type first, then version and payload
    assert json.dumps(wire(built[2])) == (
        '{"message_type": "TOOL_CALL", "version": 1, "payload": '
        '{"tool_name": "bash", "input": {"command": "ls"}, "output": "out", "error": null}}'
    )
    # a type this side does not know: kept, its payload unchecked
    assert envelope_from_dict({"message_type": "DIAGRAM", "payload": [1]}) == OtherEnvelope(
        message_type="DIAGRAM", version=1, payload=[1]
    )
    with pytest.raises(ProtocolError, match=r"unknown field `diff` - at `\$\.payload\.edits\[0\]`"):
        envelope_from_dict({"message_type": "CODE_EDIT", "payload": {"edits": [{"file_path": "a", "diff": ""}]}})


def test_tool_result_event_envelope_is_optional() -> None:
    old = parse_event('{"type":"tool_result","tool_use_id":"t","name":"bash","output":"","exit_code":0}')
    assert isinstance(old, ToolResultEvent) and old.envelope is None

    with pytest.raises(ProtocolError):  # unknown fields are still refused
        parse_event('{"type":"tool_result","tool_use_id":"t","name":"bash","output":"","exit_code":0,"extra":1}')


# --- offline directives -----------------------------------------------------------------------


def test_directives_become_tool_requests_in_message_order() -> None:
    text = "\n".join(
        [
            "please:",
            "$ ls",
            "/write a.txt",
            "$ not a command",
            "  indented",
            "/end",
            "/edit a.txt",
            "$ not a command",
            "/with",
            "changed",
            "two",
            "/end",
            "/todo",
            "[ ] first",
            "[~] second",
            "noise",
            "[x] third",
            "/end",
            "/read a.txt",
            "/edit b.txt",
            "no with here",
            "/end",
            "/write tail.txt",
            "runs to the end",
        ]
    )
    assert tool_requests_in(text) == [
        ("bash", {"command": "ls"}),
        ("write_file", {"path": "a.txt", "content": "$ not a command\n  indented\n"}),
        ("edit_file", {"path": "a.txt", "old_string": "$ not a command", "new_string": "changed\ntwo"}),
        (
            "todo_write",
            {
                "todos": [
                    {"id": "1", "content": "first", "status": "pending"},
                    {"id": "2", "content": "second", "status": "in_progress"},
                    {"id": "3", "content": "third", "status": "completed"},
                ]
            },
        ),
        ("read_file", {"path": "a.txt"}),
        ("write_file", {"path": "tail.txt", "content": "runs to the end\n"}),
    ]


def test_offline_model_drops_requests_for_tools_not_offered() -> None:
    from agent_runner.providers.base import ProviderMessage, TextBlock

    bash_only = [ToolSpec("bash", "", {"type": "object"})]
    response = OfflineProvider("Andy").complete(
        "", [ProviderMessage("user", [TextBlock("/read a.txt\n$ echo hi")])], bash_only
    )
    assert [(c.name, c.input) for c in response.tool_uses()] == [("bash", {"command": "echo hi"})]


def test_runner_runs_directives_and_emits_envelopes(run_runner: RunRunner, workspace: Path) -> None:
    message = "\n".join(
        [
            "/write src/app.py",
            "x = 1",
            "/end",
            "/edit src/app.py",
            "x = 1",
            "/with",
            "x = 2",
            "/end",
            "/todo",
            "[x] write",
            "[ ] test",
            "/end",
            "/read src/app.py",
            "$ echo out; exit 3",
            "/edit missing.py",
            "a",
            "/with",
            "b",
            "/end",
        ]
    )
    res = run_runner(make_input(message))

    assert res.returncode == 0, res.stderr
    assert res.types == ["tool_use"] * 6 + ["tool_result"] * 6 + ["assistant", "result"]
    for event in res.events:
        parse_event(json.dumps(event))
    assert (workspace / "src/app.py").read_text() == "x = 2\n"
    write, edit, todo, read, bash, failed = res.of_type("tool_result")

    assert write["output"] == "Wrote 6 bytes to src/app.py"
    assert write["envelope"] == {
        "message_type": "CODE_EDIT",
        "version": 1,
        "payload": {
            "edits": [{"file_path": "src/app.py", "old_content": None, "new_content": "x = 1\n", "language": "python"}]
        },
    }
    assert edit["envelope"]["message_type"] == "CODE_EDIT"
    assert edit["envelope"]["payload"]["edits"] == [
        {"file_path": "src/app.py", "old_content": "x = 1\n", "new_content": "x = 2\n", "language": "python"}
    ]
    assert todo["envelope"] == {
        "message_type": "TODO",
        "version": 1,
        "payload": {
            "todos": [
                {"id": "1", "content": "write", "status": "completed"},
                {"id": "2", "content": "test", "status": "pending"},
            ]
        },
    }
    assert read["envelope"] == {
        "message_type": "TOOL_CALL",
        "version": 1,
        "payload": {
            "tool_name": "read_file",
            "input": {"path": "src/app.py"},
            "output": "     1\tx = 2\n",
            "error": None,
        },
    }
    assert (bash["exit_code"], bash["is_error"], bash["output"]) == (3, False, "out\n")
    assert bash["envelope"] == {
        "message_type": "TOOL_CALL",
        "version": 1,
        "payload": {"tool_name": "bash", "input": {"command": "echo out; exit 3"}, "output": "out\n", "error": None},
    }
    assert (failed["exit_code"], failed["is_error"]) == (1, True)
    assert failed["envelope"] == {
        "message_type": "TOOL_CALL",
        "version": 1,
        "payload": {
            "tool_name": "edit_file",
            "input": {"path": "missing.py", "old_string": "a", "new_string": "b"},
            "output": "",
            "error": "edit_file: missing.py: no such file; use write_file to create it",
        },
    }

    report = res.of_type("assistant")[0]["text"]
    assert report.split("\n\n")[0] == "Ran `write_file src/app.py` (exit 0):\n```\nWrote 6 bytes to src/app.py\n```"
    assert "Ran `edit_file src/app.py` (exit 0):" in report
    assert "Ran `todo_write` (exit 0):" in report
    assert "Ran `read_file src/app.py` (exit 0):" in report
    assert "Ran `echo out; exit 3` (exit 3):" in report
    assert "Ran `edit_file missing.py` (exit 1, error):" in report


def test_unknown_tool_gets_a_tool_call_envelope(tmp_path: Path) -> None:
    call = ToolUseBlock("t1", "teleport", {"to": "mars"})
    out = run_tool(call.name, call.input, ToolContext(tmp_path, Limits()))

    env = envelope_for(call, out)
    assert isinstance(env, ToolCallEnvelope) and env.message_type == "TOOL_CALL"
    assert env.payload.tool_name == "teleport" and env.payload.input == {"to": "mars"}
    assert env.payload.output == ""
    assert env.payload.error == (
        "unknown tool 'teleport'; available: add_reaction, ask_user, bash, cancel_task, edit_file, edit_message, glob, grep, list_tasks, pause_task, "
        "read_file, resume_task, schedule_task, send_file, send_message, todo_write, update_task, write_file"
    )
