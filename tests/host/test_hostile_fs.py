"""Folders an agent can write, touched by the host: never through a symlink,
never a FIFO, bounded reads, even while something swaps entries under us."""

from __future__ import annotations

import errno
import os
import shutil
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.errors import HostileEntry
from orchestrator.sandbox import hostile_fs
from orchestrator.sandbox.containers import prepare_folder
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


def _traced_peak(fn: Callable[[], object]) -> int:
    """The peak of the Python heap while ``fn`` runs, above where it started."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()


def _hard_links(folder: Path, n: int) -> None:
    """``n`` names of a few files in ``folder`` (ext4 allows 65,000 links an inode)."""
    folder.mkdir()
    for j in range(n // 50_000 + 1):
        (folder / f"src{j}").write_bytes(b"")
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(n):
            os.link(f"src{i // 50_000}", f"l{i:07d}", src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def _count_open_fds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """[the descriptors open now, the most open since]: counted after every os.open and os.scandir."""
    count = [len(os.listdir("/proc/self/fd"))] * 2
    real_open, real_scandir = os.open, os.scandir

    def counting_open(*args: Any, **kwargs: Any) -> int:
        fd = real_open(*args, **kwargs)
        count[1] = max(count[1], len(os.listdir("/proc/self/fd")))
        return fd

    def counting_scandir(*args: Any, **kwargs: Any) -> Any:
        it = real_scandir(*args, **kwargs)
        count[1] = max(count[1], len(os.listdir("/proc/self/fd")))
        return it

    monkeypatch.setattr(os, "open", counting_open)
    monkeypatch.setattr(os, "scandir", counting_scandir)
    return count


def test_chown_tree_walks_a_folder_of_many_hard_links_in_flat_memory(tmp_path: Path) -> None:
    """Names cost folder space, not inodes: a 2 GiB workspace holds tens of millions of hard
    links.  The walk reads the folder as it goes; listing it whole (as it did) costs memory
    in proportion, measured here as the baseline."""
    ws = tmp_path / "ws"
    _hard_links(ws, 100_000)
    try:

        def listed() -> None:
            with os.scandir(ws) as it:
                entries = list(it)
            assert len(entries) == 100_003

        listing = _traced_peak(listed)
        st = os.lstat(ws)
        walk = _traced_peak(lambda: chown_tree(ws, st.st_uid, st.st_gid))  # the owner it has: a pure walk
        assert listing > 10_000_000  # ~140 bytes an entry
        assert walk < listing / 50, (walk, listing)
    finally:
        shutil.rmtree(ws)


def test_chown_tree_holds_two_descriptors_a_level_however_wide(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Depth first with one open folder and listing per level: a wide tree costs no more
    descriptors than its depth (it pushed one for every subfolder: 300 here, and past the
    soft limit of 1024 the rest were skipped silently)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(300):
        (ws / f"w{i}").mkdir()
        (ws / f"w{i}" / "f").write_bytes(b"x")
    deep = ws.joinpath(*["d"] * 40)
    deep.mkdir(parents=True)
    (deep / "bottom").write_bytes(b"x")
    st = os.lstat(ws)
    count = _count_open_fds(monkeypatch)
    chown_tree(ws, st.st_uid, st.st_gid)
    assert count[1] - count[0] <= 2 * (40 + 1), count
    monkeypatch.undo()
    if os.getuid() == 0:  # and everything, to the bottom, was handed over
        assert chown_tree(ws, 1000, 1000) == 1 + 600 + 40 + 1
        assert os.lstat(deep / "bottom").st_uid == 1000


def test_chown_tree_out_of_descriptors_fails_rather_than_skips(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A subfolder it cannot open for want of descriptors is not skipped (as it was, in
    silence): the folder would be handed over in part."""
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    real_open = os.open

    def no_more(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if dir_fd is not None:
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", no_more)
    st = os.lstat(ws)
    with pytest.raises(OSError) as exc:
        chown_tree(ws, st.st_uid, st.st_gid)
    assert exc.value.errno == errno.EMFILE


def test_chown_tree_refuses_a_folder_past_its_entry_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A workspace it cannot walk whole is not handed over in part: the run fails, naming the bound."""
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    for i in range(49):
        (ws / "sub" / f"f{i}").write_bytes(b"")
    monkeypatch.setattr(hostile_fs, "MAX_WALK_ENTRIES", 50)
    st = os.lstat(ws)
    assert chown_tree(ws, st.st_uid, st.st_gid) == 0  # 50 entries: within
    (ws / "one-more").write_bytes(b"")
    with pytest.raises(HostileEntry) as exc:
        chown_tree(ws, st.st_uid, st.st_gid)
    assert "more than 50 entries (hostile_fs.MAX_WALK_ENTRIES)" in str(exc.value)
    if os.getuid() == 0:  # the container's user is not handed it: the cold run fails with that
        with pytest.raises(HostileEntry, match="MAX_WALK_ENTRIES"):
            prepare_folder(ws)


def test_chown_tree_refuses_a_tree_deeper_than_its_depth_cap(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    levels = hostile_fs.MAX_WALK_DEPTH
    ws.joinpath(*["d"] * levels).mkdir(parents=True)
    st = os.lstat(ws)
    chown_tree(ws, st.st_uid, st.st_gid)  # as deep as allowed
    ws.joinpath(*["d"] * (levels + 1)).mkdir()
    with pytest.raises(HostileEntry) as exc:
        chown_tree(ws, st.st_uid, st.st_gid)
    assert f"deeper than {levels} levels (hostile_fs.MAX_WALK_DEPTH)" in str(exc.value)


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


def test_connect_unix_named_tells_one_bind_from_the_next_at_the_same_path(tmp_path: Path) -> None:
    """What lets a warm run skip Docker (orchestrator/sandbox/warm/known.py): the socket a
    connection reached is named, and a runner that binds again at the same path (a new
    container) is another socket, refused when the old one is expected."""
    import socket

    def listen() -> socket.socket:
        (tmp_path / "agent.sock").unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(tmp_path / "agent.sock"))
        server.listen(1)
        return server

    server = listen()
    client, first = hostile_fs.connect_unix_named(tmp_path, "agent.sock")
    client.close()
    again, same = hostile_fs.connect_unix_named(tmp_path, "agent.sock", expect=first)
    again.close()
    assert same == first
    server.close()  # the runner died: its socket refuses, though its entry is still there
    with pytest.raises(ConnectionRefusedError):
        hostile_fs.connect_unix_named(tmp_path, "agent.sock", expect=first)
    server = listen()  # a new runner, bound where the old one was
    with pytest.raises(HostileEntry, match="another socket"):
        hostile_fs.connect_unix_named(tmp_path, "agent.sock", expect=first)
    server.settimeout(0.2)
    with pytest.raises(TimeoutError):
        server.accept()  # refused before any connection was made
    server.close()


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
