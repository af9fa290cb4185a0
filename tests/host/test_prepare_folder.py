"""Handing a group's folder to the container's user before a cold run."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.sandbox.containers import CONTAINER_UID, prepare_folder


def _tree(root: Path) -> list[Path]:
    for i in range(3):
        sub = root / f"d{i}" / "deeper"
        sub.mkdir(parents=True)
        (sub / "f.txt").write_text("x")
        (root / f"d{i}" / "g.txt").write_text("y")
    return [root, *root.rglob("*")]


def test_as_root_everything_is_handed_over_and_symlinks_are_not_followed(tmp_path: Path) -> None:
    if os.getuid() != 0:
        # Another host user: the container runs as that user, nothing is chowned.
        paths = _tree(tmp_path / "ws")
        assert prepare_folder(tmp_path / "ws") == f"{os.getuid()}:{os.getgid()}"
        assert all(os.lstat(p).st_uid == os.getuid() for p in paths)
        return
    outside = tmp_path / "outside.txt"
    outside.write_text("host file")
    root = tmp_path / "ws"
    root.mkdir()
    paths = _tree(root)
    os.lchown(paths[3], CONTAINER_UID, CONTAINER_UID)  # one the agent already owns
    (root / "link").symlink_to(outside)

    assert prepare_folder(root) == f"{CONTAINER_UID}:{CONTAINER_UID}"

    for path in [*paths, root / "link"]:
        st = os.lstat(path)
        assert (st.st_uid, st.st_gid) == (CONTAINER_UID, CONTAINER_UID), path
    assert os.stat(outside).st_uid == 0  # the link's target stays the host's

    # A second pass changes nothing it does not need to: the inodes are not written again.
    before = {p: os.lstat(p).st_ctime_ns for p in paths}
    prepare_folder(root)
    assert {p: os.lstat(p).st_ctime_ns for p in paths} == before
