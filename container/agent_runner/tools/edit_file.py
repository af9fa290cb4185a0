"""The ``edit_file`` tool: replace an exact piece of text in a workspace file."""

from __future__ import annotations

from .. import envelopes
from ..providers.base import ToolSpec
from .base import NonBlank, ToolArgs, ToolContext, ToolOutcome, bad_input, failed
from .paths import relative_to_workspace, resolve_in_workspace

NAME = "edit_file"
# The whole file is read and rewritten; larger files are edited with bash.
MAX_FILE_BYTES = 10 * 1024 * 1024

SPEC = ToolSpec(
    name=NAME,
    description=(
        "Replace text in an existing UTF-8 file in the workspace. old_string must match "
        "the file's text exactly (whitespace and indentation included) and occur exactly "
        "once, unless replace_all is true, which replaces every occurrence. Include enough "
        "surrounding lines in old_string to make it unique."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the workspace or absolute inside it."},
            "old_string": {"type": "string", "description": "The exact text to replace (not empty)."},
            "new_string": {"type": "string", "description": "The text to put in its place."},
            "replace_all": {
                "type": "boolean",
                "default": False,
                "description": "Replace every occurrence instead of requiring exactly one.",
            },
        },
        "required": ["path", "old_string", "new_string"],
        "additionalProperties": False,
    },
)


class EditFileArgs(ToolArgs):
    path: NonBlank
    # May be empty for the type: the refusal below says what to use instead.
    old_string: str
    new_string: str
    replace_all: bool = False


def edit_file(args: EditFileArgs, ctx: ToolContext) -> ToolOutcome:
    raw, old_string, new_string, replace_all = args.path, args.old_string, args.new_string, args.replace_all
    if not old_string:
        return bad_input(NAME, "'old_string' must not be empty; use write_file to create or replace a file")
    if old_string == new_string:
        return bad_input(NAME, "'old_string' and 'new_string' are the same; nothing to change")

    path = resolve_in_workspace(ctx.workspace, raw, NAME)
    if isinstance(path, ToolOutcome):
        return path
    if not path.exists():
        return failed(NAME, f"{raw}: no such file; use write_file to create it")
    if not path.is_file():
        return failed(NAME, f"{raw}: not a regular file")
    rel = relative_to_workspace(ctx.workspace, path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            return failed(NAME, f"{raw}: {size} bytes is too large to edit (limit {MAX_FILE_BYTES}); use bash")
        old_text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return failed(NAME, f"{raw}: not a UTF-8 text file")
    except OSError as exc:
        return failed(NAME, f"{raw}: {exc.strerror or exc}")

    count = old_text.count(old_string)
    if count == 0:
        return failed(NAME, f"old_string not found in {rel}")
    if count > 1 and not replace_all:
        return failed(
            NAME,
            f"old_string occurs {count} times in {rel}; add surrounding text to make it unique, "
            "or set replace_all to replace every occurrence",
        )
    new_text = old_text.replace(old_string, new_string)
    try:
        path.write_bytes(new_text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return bad_input(NAME, f"new_string is not valid Unicode text: {exc.reason}")
    except OSError as exc:
        return failed(NAME, f"{raw}: {exc.strerror or exc}")
    noun = "occurrence" if count == 1 else "occurrences"
    return ToolOutcome(
        f"Edited {rel}: replaced {count} {noun}",
        0,
        envelope=envelopes.code_edit(rel, old_text, new_text),
    )
