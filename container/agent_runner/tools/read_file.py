"""The ``read_file`` tool: a text file's lines numbered like ``cat -n``, bounded in size."""

from __future__ import annotations

from pathlib import Path

from ..providers.base import ToolSpec
from .base import Count, NonBlank, ToolArgs, ToolContext, ToolOutcome, bad_input, cut_utf8, failed
from .paths import resolve_in_workspace

NAME = "read_file"
DEFAULT_LIMIT = 2000
BINARY_SNIFF_BYTES = 8192

SPEC = ToolSpec(
    name=NAME,
    description=(
        "Read a text file in the workspace. Returns its lines numbered like `cat -n` "
        "(line number, tab, text). Use offset and limit to read a long file in parts; "
        "the output is capped in size, and a note says where to continue."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the workspace or absolute inside it."},
            "offset": {"type": "integer", "minimum": 1, "description": "First line to show (1-based). Default 1."},
            "limit": {
                "type": "integer",
                "minimum": 1,
                "description": f"Maximum number of lines to show. Default {DEFAULT_LIMIT}.",
            },
        },
        "required": ["path"],
        "additionalProperties": False,
    },
)


class ReadFileArgs(ToolArgs):
    path: NonBlank
    offset: Count = 1
    limit: Count = DEFAULT_LIMIT


def read_file(args: ReadFileArgs, ctx: ToolContext) -> ToolOutcome:
    raw, offset, limit = args.path, args.offset, args.limit
    path = resolve_in_workspace(ctx.workspace, raw, NAME)
    if isinstance(path, ToolOutcome):
        return path
    if not path.exists():
        return failed(NAME, f"{raw}: no such file")
    if not path.is_file():
        return failed(NAME, f"{raw}: not a regular file")
    try:
        return _read_lines(path, raw, offset, limit, ctx.limits.output_cap_bytes)
    except OSError as exc:
        return failed(NAME, f"{raw}: {exc.strerror or exc}")


def _read_lines(path: Path, raw: str, offset: int, limit: int, cap: int) -> ToolOutcome:
    with open(path, "rb") as fh:
        head = fh.read(BINARY_SNIFF_BYTES)
    if b"\x00" in head:
        return failed(NAME, f"{raw}: binary file ({path.stat().st_size} bytes); use bash to inspect it")

    parts: list[str] = []
    used = 0
    note = ""
    line_count = 0
    # newline="\n": lines end at \n only, like cat; a \r before it is dropped below.
    with open(path, encoding="utf-8", errors="replace", newline="\n") as fh:
        for number, line in enumerate(fh, start=1):
            line_count = number
            if number < offset:
                continue
            if len(parts) == limit:
                note = f"[more lines follow; continue with offset={number}]"
                break
            text = line.removesuffix("\n").removesuffix("\r")
            entry = f"{number:6}\t{text}\n"
            size = len(entry.encode("utf-8"))
            if used + size > cap:
                if not parts:  # one line longer than the whole cap: show its start
                    parts.append(cut_utf8(entry, cap) + "\n")
                    note = f"[line {number} truncated at {cap} bytes; continue with offset={number + 1}]"
                else:
                    note = f"[output capped at {cap} bytes; continue with offset={number}]"
                break
            parts.append(entry)
            used += size
    if line_count == 0:
        return ToolOutcome("[empty file]", 0)
    if not parts:
        return bad_input(NAME, f"{raw} has {line_count} lines; offset {offset} is past the end")
    return ToolOutcome("".join(parts) + note, 0)
