"""Notices about the workspace, computed by the runner inside the sandbox
(never by the host: see orchestrator/run/notices.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from agent_runner.workspace_notices import LARGE_FILE_BYTES, large_files, uncommitted_changes, workspace_notices


def test_uncommitted_changes(tmp_path: Path) -> None:
    assert uncommitted_changes(tmp_path) == []  # not a repository
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert uncommitted_changes(tmp_path) == []  # clean
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("x")
    assert uncommitted_changes(tmp_path) == ["Note: the workspace has 2 uncommitted change(s): a.py, b.py."]


def test_the_repositorys_fsmonitor_hook_is_not_run(tmp_path: Path) -> None:
    # Harmless in the sandbox (it would run as the agent), but it is never needed.
    marker = tmp_path.parent / f"{tmp_path.name}-hook-ran"
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    with open(tmp_path / ".git" / "config", "a") as fh:
        fh.write(f"[core]\n\tfsmonitor = touch {marker}\n")
    (tmp_path / "f").write_text("x")
    assert uncommitted_changes(tmp_path) == ["Note: the workspace has 1 uncommitted change(s): f."]
    assert not marker.exists()


def test_large_files(tmp_path: Path) -> None:
    (tmp_path / "small.txt").write_text("x")
    assert large_files(tmp_path) == []
    (tmp_path / "data").mkdir()
    with open(tmp_path / "data" / "dump.sql", "wb") as fh:
        fh.truncate(LARGE_FILE_BYTES + 1)  # sparse: no real disk use
    (tmp_path / "link").symlink_to("/")  # never followed
    assert large_files(tmp_path) == [
        "Note: very large files in the workspace (read them in parts, not whole): data/dump.sql (50 MiB)."
    ]


def test_many_listed_and_both_kinds(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for i in range(7):
        with open(tmp_path / f"big{i}.bin", "wb") as fh:
            fh.truncate(LARGE_FILE_BYTES + i * 1024 * 1024)
    notices = workspace_notices(tmp_path)
    assert notices[0] == (
        "Note: the workspace has 7 uncommitted change(s): big0.bin, big1.bin, big2.bin, big3.bin, big4.bin and 2 more."
    )
    assert notices[1].startswith(
        "Note: very large files in the workspace (read them in parts, not whole): big6.bin (56 MiB), big5.bin (55 MiB)"
    )
    assert notices[1].endswith(" and 2 more.")
