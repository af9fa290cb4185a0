"""The ``glob`` tool: list workspace files matching a pattern such as ``**/*.py``."""

from __future__ import annotations

from pathlib import PurePosixPath

from ..providers.base import ToolSpec
from .base import NonBlank, ToolArgs, ToolContext, ToolOutcome, bad_input, cut_utf8, failed
from .paths import resolve_in_workspace, workspace_root

NAME = "glob"
MAX_ENTRIES = 500

SPEC = ToolSpec(
    name=NAME,
    description=(
        "Find files in the workspace by name pattern, e.g. `**/*.py` (any depth) or "
        "`src/*.ts`. Returns matching regular files, one per line, as paths relative to "
        f"the workspace, sorted; at most {MAX_ENTRIES} are listed."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "pattern": {
                "type": "string",
                "description": "Glob pattern relative to `path`; `**` matches any number of directories.",
            },
            "path": {
                "type": "string",
                "description": "Directory to search from, relative to the workspace. Default: the workspace.",
            },
        },
        "required": ["pattern"],
        "additionalProperties": False,
    },
)


class GlobArgs(ToolArgs):
    pattern: NonBlank
    path: NonBlank | None = None


def glob_files(args: GlobArgs, ctx: ToolContext) -> ToolOutcome:
    pattern, raw_dir = args.pattern, args.path
    parts = PurePosixPath(pattern).parts
    if pattern.startswith("/") or ".." in parts:
        return bad_input(NAME, "pattern must be relative and must not contain '..'; use 'path' to pick the directory")
    root = workspace_root(ctx.workspace)
    if isinstance(root, ToolOutcome):
        return root
    base = resolve_in_workspace(ctx.workspace, raw_dir or ".", NAME)
    if isinstance(base, ToolOutcome):
        return base
    if not base.is_dir():
        return failed(NAME, f"{raw_dir}: not a directory")

    matches: list[str] = []
    try:
        for found in base.glob(pattern):
            try:
                # A symlink may point out of the workspace: such a match is not a workspace file.
                if not found.is_file() or not found.resolve().is_relative_to(root):
                    continue
            except (OSError, RuntimeError):
                continue
            matches.append(found.relative_to(root).as_posix())
    except ValueError as exc:  # e.g. an unacceptable pattern
        return bad_input(NAME, f"invalid pattern {pattern!r}: {exc}")
    except OSError as exc:
        return failed(NAME, f"{exc.strerror or exc}")

    if not matches:
        return ToolOutcome(f"no files match {pattern}", 0)
    matches.sort()
    shown = matches[:MAX_ENTRIES]
    text = "\n".join(shown)
    note = f"\n[showing the first {MAX_ENTRIES} of {len(matches)} matches; narrow the pattern]"
    if len(matches) <= MAX_ENTRIES:
        note = ""
    cap = ctx.limits.output_cap_bytes
    if len(text.encode("utf-8")) > cap:
        text = cut_utf8(text, cap).rsplit("\n", 1)[0]
        note = f"\n[output capped at {cap} bytes; {len(matches)} matches in all; narrow the pattern]"
    return ToolOutcome(text + note, 0)
