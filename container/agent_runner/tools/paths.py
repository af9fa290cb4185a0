"""The one place where a tool's ``path`` input becomes a file system path.

Relative paths are taken against the workspace; absolute paths are accepted
only when they lie inside it.  The path is resolved first (``..`` collapsed,
symlinks followed, also for parts that do not exist yet) and only then
checked, so neither ``../x`` nor a symlink pointing out of the workspace can
reach anything outside it.

:func:`file_in_workspace` is the stricter rule for a file that leaves the
workspace (``send_file``): the path is only normalized as text, and every
part of it is looked at with ``lstat``, so no link is followed at all.
"""

from __future__ import annotations

import os
import posixpath
import stat
from pathlib import Path, PurePosixPath

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


def file_in_workspace(workspace: Path, raw: str, tool: str) -> tuple[str, os.stat_result] | ToolOutcome:
    """``raw`` as a normalized POSIX path relative to the workspace, and its ``lstat``.

    Nothing is resolved: ``.`` and ``..`` are collapsed as text (what is left
    must not climb out), an absolute path must name a place under the
    workspace, and each part of the path, from the workspace down, is read
    with ``lstat``: a symbolic link anywhere is refused, never followed.  The
    answer describes the file as it was when looked at; it may change after.
    """
    root = workspace_root(workspace)
    if isinstance(root, ToolOutcome):
        return root
    if "\x00" in raw:
        return bad_input(tool, "path must not contain NUL characters")
    outside = failed(tool, f"{raw} is outside the workspace {root}; only paths inside it are allowed")
    normal = PurePosixPath(posixpath.normpath(raw))
    if normal.is_absolute():
        # The workspace by its resolved name or by the name it was given.
        for base in (PurePosixPath(root), PurePosixPath(os.path.abspath(workspace))):
            if normal.is_relative_to(base):
                normal = normal.relative_to(base)
                break
        else:
            return outside
    if normal.parts[:1] == ("..",):
        return outside
    if normal == PurePosixPath("."):
        return failed(tool, f"{raw} is the workspace itself; name a file in it")
    rel = normal.as_posix()
    here = root
    for i, part in enumerate(normal.parts):
        here = here / part
        shown = "/".join(normal.parts[: i + 1])
        try:
            info = os.lstat(here)
        except FileNotFoundError:
            return failed(tool, f"{rel} does not exist in the workspace")
        except OSError as exc:
            return failed(tool, f"cannot look at {shown}: {exc.strerror or exc}")
        if stat.S_ISLNK(info.st_mode):
            return failed(tool, f"{shown} is a symbolic link; {tool} never follows links: name the file itself")
        if i < len(normal.parts) - 1 and not stat.S_ISDIR(info.st_mode):
            return failed(tool, f"{shown} is not a directory")
    return rel, info
