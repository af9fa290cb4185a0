"""Folders an agent can write, touched by the host: never through a symlink,
never a FIFO, bounded reads, even while something swaps entries under us."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from orchestrator.core.errors import HostileEntry
from orchestrator.sandbox.hostile_fs import chown_tree, connect_unix, make_dirs, read_regular, remove_entry


def test_read_regular_reads_a_plain_file_bounded(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f.txt").write_bytes(b"0123456789")
    data, st = read_regular(tmp_path, "a/f.txt", 4)
    assert data == b"01234" and st.st_size == 10  # limit + 1: the caller sees it was cut
    assert read_regular(tmp_path, "a/f.txt", 100)[0] == b"0123456789"


@pytest.mark.parametrize("relative", ["", "/etc/passwd", "..", "a/../../x", ".", "a/" * 70 + "f"])
def test_paths_that_leave_or_name_nothing_are_refused(tmp_path: Path, relative: str) -> None:
    with pytest.raises(HostileEntry):
        read_regular(tmp_path, relative, 10)


def test_symlinks_fifos_and_devices_are_refused(tmp_path: Path) -> None:
    secret = tmp_path.parent / f"{tmp_path.name}-secret"
    secret.write_text("TOPSECRET")
    (tmp_path / "link").symlink_to(secret)
    (tmp_path / "dirlink").symlink_to(tmp_path.parent)
    (tmp_path / "null").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo")
    for relative, why in [
        ("link", "a symlink (never followed)"),
        (f"dirlink/{secret.name}", "a path component is not a folder (or is a symlink)"),
        ("null", "a symlink (never followed)"),
        ("fifo", "is not a regular file (FIFO, socket or device)"),
    ]:
        with pytest.raises(HostileEntry) as exc:
            read_regular(tmp_path, relative, 100)
        assert exc.value.reason == why, relative


def test_a_file_swapped_for_a_symlink_during_reads_never_leaks(tmp_path: Path) -> None:
    """The race a background process in a warm container can run against the
    context reader: the file and a symlink to a secret swap places as fast as
    they can; no read ever returns the secret."""
    secret = tmp_path.parent / f"{tmp_path.name}-secret"
    secret.write_text("TOPSECRET")
    (tmp_path / "plain").write_text("harmless")
    new, f = tmp_path / "new", tmp_path / "f"
    stop = threading.Event()

    def swap() -> None:  # each os.replace is atomic: "f" is always one or the other
        while not stop.is_set():
            os.symlink(secret, new)
            os.replace(new, f)
            os.link(tmp_path / "plain", new)
            os.replace(new, f)

    os.link(tmp_path / "plain", f)
    swapper = threading.Thread(target=swap)
    swapper.start()
    seen: dict[str, int] = {}
    try:
        # At least 5000 reads, and on until both sides of the race were seen
        # (a loaded machine may leave the swapper unscheduled for a while).
        for i in range(500_000):
            if i >= 5000 and seen.get("read") and seen.get("a symlink (never followed)"):
                break
            try:
                data, _ = read_regular(tmp_path, "f", 100)
            except HostileEntry as exc:
                seen[exc.reason] = seen.get(exc.reason, 0) + 1
                continue
            assert b"TOPSECRET" not in data
            seen["read"] = seen.get("read", 0) + 1
    finally:
        stop.set()
        swapper.join()
    # Both sides of the race happened: plain reads and refused symlinks.
    assert seen.get("read") and seen.get("a symlink (never followed)"), seen


def test_make_dirs_refuses_a_symlinked_component(tmp_path: Path) -> None:
    make_dirs(tmp_path, "extra/data")
    assert (tmp_path / "extra" / "data").is_dir()
    make_dirs(tmp_path, "extra/data")  # idempotent
    outside = tmp_path.parent / f"{tmp_path.name}-out"
    outside.mkdir()
    (tmp_path / "extra" / "evil").symlink_to(outside)
    with pytest.raises(HostileEntry):
        make_dirs(tmp_path, "extra/evil/x")
    assert not (outside / "x").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(HostileEntry):
        make_dirs(tmp_path, "file/x")


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root (covered by CI, which runs as root)")
def test_chown_tree_never_follows_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "host.txt").write_text("host")
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "f").write_text("x")
    (ws / "dirlink").symlink_to(outside)
    (ws / "filelink").symlink_to(outside / "host.txt")
    assert chown_tree(ws, 1000, 1000) == 5  # ws, sub, sub/f and the two links themselves
    for p in (ws, ws / "sub", ws / "sub" / "f", ws / "dirlink", ws / "filelink"):
        assert os.lstat(p).st_uid == 1000, p
    for p in (outside, outside / "host.txt"):
        assert os.lstat(p).st_uid == 0, p
    assert chown_tree(ws, 1000, 1000) == 0


def test_connect_unix_reaches_a_socket_and_never_a_link(tmp_path: Path) -> None:
    import socket

    (tmp_path / "d").mkdir()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "d" / "real.sock"))
    server.listen(1)
    trap = socket.socket(socket.AF_UNIX)
    trap.bind(str(tmp_path / "trap.sock"))
    trap.listen(1)
    trap.settimeout(0.2)
    client = connect_unix(tmp_path, "d/real.sock")
    conn, _ = server.accept()
    client.sendall(b"hi")
    assert conn.recv(2) == b"hi"
    for c in (client, conn):
        c.close()
    (tmp_path / "d" / "link.sock").symlink_to(tmp_path / "trap.sock")
    (tmp_path / "d" / "file.sock").write_text("x")
    for name in ("link.sock", "file.sock"):
        with pytest.raises(HostileEntry, match="not a socket"):
            connect_unix(tmp_path, f"d/{name}")
    with pytest.raises(HostileEntry, match="no such file"):
        connect_unix(tmp_path, "d/missing.sock")
    with pytest.raises(TimeoutError):
        trap.accept()  # nothing ever reached the socket behind the link
    server.close()
    trap.close()


def test_remove_entry_never_follows(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("host")
    ws = tmp_path / "ws"
    (ws / "d" / "sub").mkdir(parents=True)
    (ws / "d" / "sub" / "f").write_text("x")
    (ws / "d" / "sub" / "out").symlink_to(outside)
    (ws / "link").symlink_to(outside)
    remove_entry(ws, "link")  # the link goes, not its target
    assert not (ws / "link").is_symlink() and (outside / "keep.txt").exists()
    remove_entry(ws, "d/sub")  # a folder with all it holds; the link inside is not followed
    assert not (ws / "d" / "sub").exists() and (outside / "keep.txt").exists()
    remove_entry(ws, "d/missing")
    remove_entry(ws, "nothing/here")
    (ws / "via").symlink_to(outside)
    with pytest.raises(HostileEntry):
        remove_entry(ws, "via/keep.txt")
    assert (outside / "keep.txt").exists()
