"""The one place where a tool's ``path`` input becomes a file system path.

Relative paths are taken against the workspace; absolute paths are accepted
only when they lie inside it.  The path is resolved first (``..`` collapsed,
symlinks followed, also for parts that do not exist yet) and only then
checked, so neither ``../x`` nor a symlink pointing out of the workspace can
reach anything outside it.
"""

from __future__ import annotations

from pathlib import Path

from .base import ToolOutcome, bad_input, failed


def workspace_root(workspace: Path) -> Path | ToolOutcome:
    """The resolved workspace directory, or an error when it is missing."""
    try:
        root = workspace.resolve()
    except (OSError, RuntimeError) as exc:
        return failed("workspace", f"cannot resolve {workspace}: {exc}")
    if not root.is_dir():
        return failed("workspace", f"{workspace} is not a directory")
    return root


def resolve_in_workspace(workspace: Path, raw: str, tool: str) -> Path | ToolOutcome:
    """The resolved path of ``raw``, or an error outcome if it leaves the workspace."""
    root = workspace_root(workspace)
    if isinstance(root, ToolOutcome):
        return root
    if "\x00" in raw:
        return bad_input(tool, "path must not contain NUL characters")
    candidate = Path(raw)
    if not candidate.is_absolute():
        candidate = root / candidate
    try:
        resolved = candidate.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python < 3.13)
        return failed(tool, f"cannot resolve {raw}: {exc}")
    if not resolved.is_relative_to(root):
        return failed(tool, f"{raw} is outside the workspace {root}; only paths inside it are allowed")
    return resolved


def relative_to_workspace(workspace: Path, path: Path) -> str:
    """``path`` (resolved, inside the workspace) as a POSIX path relative to it."""
    return path.relative_to(workspace.resolve()).as_posix()
