"""The ``grep`` tool: search workspace files for a Python regular expression."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from ..providers.base import ToolSpec
from .base import NonBlank, ToolArgs, ToolContext, ToolOutcome, bad_input, failed
from .paths import resolve_in_workspace, workspace_root

NAME = "grep"
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn"})
MAX_LINE_CHARS = 500
BINARY_SNIFF_BYTES = 8192

SPEC = ToolSpec(
    name=NAME,
    description=(
        "Search file contents in the workspace with a Python regular expression (re.search "
        "on each line). Returns matching lines as `file:line:text`, file paths relative to "
        "the workspace, in path order. Binary files and .git directories are skipped; the "
        "output is capped in size."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Python regular expression, e.g. `def \\w+\\(`."},
            "path": {
                "type": "string",
                "description": "File or directory to search, relative to the workspace. Default: the workspace.",
            },
            "glob": {
                "type": "string",
                "description": (
                    "Only search files whose name matches this glob, e.g. `*.py`; a glob with `/` "
                    "is matched against the end of the workspace-relative path, e.g. `src/*.py`."
                ),
            },
        },
        "required": ["pattern"],
        "additionalProperties": False,
    },
)


def _files(base: Path, root: Path) -> Iterator[Path]:
    """Regular files under ``base`` (or ``base`` itself), in sorted order, inside ``root``."""
    if base.is_file():
        yield base
        return
    for current, dirs, files in os.walk(base):  # does not descend into symlinked directories
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            path = Path(current) / name
            try:
                if path.is_file() and path.resolve().is_relative_to(root):
                    yield path
            except (OSError, RuntimeError):
                continue


def _wanted(rel: str, name_glob: str | None) -> bool:
    # Matched from the right, one component per part: "*.py" tests the file
    # name, "src/*.py" the last two components; "*" never crosses a "/".
    return name_glob is None or PurePosixPath(rel).match(name_glob)


class GrepArgs(ToolArgs):
    # White space alone is a pattern (it finds spaces); only the empty one is refused below.
    pattern: str
    path: NonBlank | None = None
    glob: NonBlank | None = None


def grep_files(args: GrepArgs, ctx: ToolContext) -> ToolOutcome:  # noqa: C901 - a bounded walk: each bound checked where it is spent
    pattern, raw_path, name_glob = args.pattern, args.path, args.glob
    if pattern == "":
        return bad_input(NAME, "'pattern' must not be empty")
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        return bad_input(NAME, f"invalid regular expression {pattern!r}: {exc}")
    root = workspace_root(ctx.workspace)
    if isinstance(root, ToolOutcome):
        return root
    base = resolve_in_workspace(ctx.workspace, raw_path or ".", NAME)
    if isinstance(base, ToolOutcome):
        return base
    if not base.exists():
        return failed(NAME, f"{raw_path}: no such file or directory")

    cap = ctx.limits.output_cap_bytes
    # Same budget as a shell command: a huge tree or a slow pattern cannot stall the run.
    deadline = time.monotonic() + ctx.limits.bash_timeout_s
    lines: list[str] = []
    used = 0
    note = ""
    for path in _files(base, root):
        rel = path.relative_to(root).as_posix()
        if not _wanted(rel, name_glob):
            continue
        if time.monotonic() > deadline:
            note = f"\n[stopped after {ctx.limits.bash_timeout_s:g}s; narrow the path or glob]"
            break
        try:
            with open(path, "rb") as fh:
                if b"\x00" in fh.read(BINARY_SNIFF_BYTES):
                    continue
            with open(path, encoding="utf-8", errors="replace", newline="\n") as fh:
                for number, line in enumerate(fh, start=1):
                    text = line.removesuffix("\n").removesuffix("\r")
                    if not regex.search(text):
                        continue
                    if len(text) > MAX_LINE_CHARS:
                        text = text[:MAX_LINE_CHARS] + "…"
                    entry = f"{rel}:{number}:{text}"
                    size = len(entry.encode("utf-8")) + 1
                    if used + size > cap:
                        note = f"\n[output capped at {cap} bytes after {len(lines)} lines; narrow the search]"
                        break
                    lines.append(entry)
                    used += size
        except OSError:
            continue  # unreadable file: skip it, as grep -s does
        if note:
            break
    if not lines:
        return ToolOutcome(f"no matches for {pattern}" + note, 0)
    return ToolOutcome("\n".join(lines) + note, 0)
