"""The ``write_file`` tool: create or overwrite a file in the workspace."""

from __future__ import annotations

from pathlib import Path

from .. import envelopes
from ..providers.base import ToolSpec
from .base import NonBlank, ToolArgs, ToolContext, ToolOutcome, bad_input, failed
from .paths import relative_to_workspace, resolve_in_workspace

NAME = "write_file"

SPEC = ToolSpec(
    name=NAME,
    description=(
        "Write a file in the workspace, replacing it if it exists. Missing parent "
        "directories are created. The content is written exactly as given (UTF-8). "
        "To change part of an existing file, prefer edit_file."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the workspace or absolute inside it."},
            "content": {"type": "string", "description": "The file's complete new content."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    },
)


def previous_text(path: Path) -> tuple[str, int]:
    """The file's current text for an envelope (at most a capped prefix) and its size."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(envelopes.CONTENT_CAP_BYTES + 4)  # + a partial UTF-8 character
    return head.decode("utf-8", errors="replace"), size


def _file_in_the_way(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` when it is not a directory."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


class WriteFileArgs(ToolArgs):
    path: NonBlank
    content: str


def write_file(args: WriteFileArgs, ctx: ToolContext) -> ToolOutcome:
    raw, content = args.path, args.content
    path = resolve_in_workspace(ctx.workspace, raw, NAME)
    if isinstance(path, ToolOutcome):
        return path
    if path.exists() and not path.is_file():
        return failed(NAME, f"{raw}: exists and is not a regular file")
    blocker = _file_in_the_way(path)
    if blocker is not None:
        return failed(NAME, f"{raw}: {relative_to_workspace(ctx.workspace, blocker)} is not a directory")
    rel = relative_to_workspace(ctx.workspace, path)
    try:
        data = content.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate escaped in the JSON
        return bad_input(NAME, f"content is not valid Unicode text: {exc.reason}")
    try:
        old, old_size = previous_text(path) if path.exists() else (None, None)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError as exc:
        return failed(NAME, f"{raw}: {exc.strerror or exc}")
    return ToolOutcome(
        f"Wrote {len(data)} bytes to {rel}",
        0,
        envelope=envelopes.code_edit(rel, old, content, old_total_bytes=old_size),
    )
