"""Hostile walks: memory and descriptors of ``hostile_fs.chown_tree`` (run as root
on every cold run, warm creation and standby adoption) and of the replay's
scratch copy (``replay.copy_workspace``) over folders an agent can shape,
against the old walks (each folder listed whole first) measured in the same
command.

Three trees, made under ``--dir``:

* ``links``: one folder of ``--links`` hard links to a few regular files (a
  name costs folder space, not an inode: ext4 allows 65,000 links an inode);
* ``fifos``: one folder of ``--links`` hard links to a few FIFOs (the copy
  skips them: before, they did not count toward its cap);
* ``wide+deep``: ``--wide`` folders of one file each beside a chain of
  ``--deep`` nested folders.

Each walk runs three times, each in a forked child (a fresh heap and peak
RSS): plain (wall time; peak RSS above the child's start, read from ``VmHWM``
after ``clear_refs``), under ``tracemalloc`` (the peak of the Python heap),
and with the open descriptors counted after every ``os.open`` and
``os.scandir`` (their peak above the start).
chown_tree hands each tree to the owner it has already (no inode written; the
walk is the same), so it runs unprivileged too.  As root, last, the wide+deep
tree is handed to another uid under a soft ``RLIMIT_NOFILE`` of 1024 (what
systemd gives a service), and what each walk left unchanged is counted: the
old walk held a descriptor for every subfolder waiting its turn, and skipped
silently what it could not open.

    .venv/bin/python -m bench.hostile_walk [--links 300000] [--wide 2000] [--deep 120] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import stat
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from orchestrator.core.errors import HostileEntry, ReplayRefused
from orchestrator.run import replay
from orchestrator.run.replay import CopyReport, copy_workspace
from orchestrator.sandbox import hostile_fs
from orchestrator.sandbox.hostile_fs import MAX_DEPTH, chown_tree, open_root, opened_root

MiB = 1024 * 1024
LINKS_PER_INODE = 60_000  # under ext4's 65,000
OTHER_UID = 54321
FD_LIMIT = 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


# -- the old walks, as they were (baseline) --------------------------------------------


def old_chown_tree(folder: Path, uid: int, gid: int) -> int:
    """chown_tree before: each folder listed whole, a descriptor pushed for every subfolder."""
    changed = 0
    try:
        root = open_root(folder)
    except HostileEntry:
        return 0
    stack = [root]
    try:
        st = os.fstat(root)
        if (st.st_uid, st.st_gid) != (uid, gid):
            os.fchown(root, uid, gid)
            changed += 1
        while stack:
            fd = stack.pop()
            try:
                with os.scandir(fd) as it:
                    entries = list(it)
                for entry in entries:
                    try:
                        est = entry.stat(follow_symlinks=False)
                        if (est.st_uid, est.st_gid) != (uid, gid):
                            os.chown(entry.name, uid, gid, dir_fd=fd, follow_symlinks=False)
                            changed += 1
                        if stat.S_ISDIR(est.st_mode):
                            stack.append(os.open(entry.name, _DIR_FLAGS, dir_fd=fd))
                    except OSError:
                        continue
            except OSError:
                pass
            finally:
                os.close(fd)
    finally:
        for fd in stack:
            os.close(fd)
    return changed


def old_copy_workspace(source: Path, dest: Path, *, max_bytes: int, max_files: int) -> CopyReport:
    """copy_workspace before: each folder listed whole; skipped entries neither counted nor bounded."""
    report = CopyReport()
    dest.mkdir(parents=True, exist_ok=False)
    with opened_root(source) as src, opened_root(dest) as dst:
        _old_copy_folder(src, dst, "", 0, report, max_bytes, max_files)
    return report


def _old_copy_folder(
    src: int, dst: int, where: str, depth: int, report: CopyReport, max_bytes: int, max_files: int
) -> None:
    if depth > MAX_DEPTH:
        report.skipped.append(f"{where}: more than {MAX_DEPTH} levels deep")
        return
    with os.scandir(src) as it:
        entries = list(it)
    for entry in entries:
        name = entry.name
        path = f"{where}{name}"
        if report.entries + 1 > max_files:
            raise ReplayRefused(f"the workspace holds more than {max_files} entries")
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
            report.symlinks += 1
        elif stat.S_ISDIR(mode):
            child = os.open(name, _DIR_FLAGS, dir_fd=src)
            try:
                os.mkdir(name, 0o755, dir_fd=dst)
                made = os.open(name, _DIR_FLAGS, dir_fd=dst)
                report.folders += 1
                try:
                    _old_copy_folder(child, made, f"{path}/", depth + 1, report, max_bytes, max_files)
                finally:
                    os.close(made)
            finally:
                os.close(child)
        elif stat.S_ISREG(mode):
            replay._copy_file(src, dst, name, path, report, max_bytes)
        else:
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
            report.skipped.append(f"{path}: {kind}, not copied")


# -- the trees ----------------------------------------------------------------------------


def make_links(folder: Path, n: int, *, fifo: bool) -> None:
    folder.mkdir()
    fd = os.open(folder, _DIR_FLAGS)
    try:
        for j in range((n + LINKS_PER_INODE - 1) // LINKS_PER_INODE):
            if fifo:
                os.mkfifo(f"src{j}", dir_fd=fd)
            else:
                os.close(os.open(f"src{j}", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
        for i in range(n):
            os.link(f"src{i // LINKS_PER_INODE}", f"l{i:08d}", src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def make_wide_deep(folder: Path, wide: int, deep: int) -> None:
    folder.mkdir()
    for i in range(wide):
        (folder / f"w{i:05d}").mkdir()
        (folder / f"w{i:05d}" / "f").write_bytes(b"x")
    fd = os.open(folder, _DIR_FLAGS)
    try:
        for _ in range(deep):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)


def hand_over(walk: Callable[[Path, int, int], int], tree: Path) -> str:
    """``walk`` the tree to another owner with few descriptors allowed; what it missed."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, hard))  # in the child only
    changed = walk(tree, OTHER_UID, OTHER_UID)
    left = sum(
        os.lstat(os.path.join(top, name)).st_uid != OTHER_UID
        for top, dirs, files in os.walk(tree)
        for name in dirs + files
    )
    return f"changed {changed}, {left} entries left unchanged"


# -- measuring ----------------------------------------------------------------------------


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _in_child(fn: Callable[[], str], how: str) -> dict[str, Any]:
    """Run ``fn`` in a forked child; what it measured."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        out: dict[str, Any] = {}
        try:
            real_open, real_scandir = os.open, os.scandir
            base = _open_fds()
            peak = [base]
            # Each in a run of its own: listing /proc/self/fd at every open costs time (with
            # the old walk's thousands of descriptors, a lot of it) and heap.

            def counting_open(*args: Any, **kwargs: Any) -> int:
                fd = real_open(*args, **kwargs)
                peak[0] = max(peak[0], _open_fds())
                return fd

            def counting_scandir(*args: Any, **kwargs: Any) -> Any:
                it = real_scandir(*args, **kwargs)
                peak[0] = max(peak[0], _open_fds())
                return it

            if how == "fds":
                os.open, os.scandir = counting_open, counting_scandir
            elif how == "heap":
                tracemalloc.start()
            else:
                Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here
            rss0 = _status("VmRSS")
            t0 = time.perf_counter()
            try:
                out["result"] = fn()
            except (HostileEntry, ReplayRefused) as exc:
                out["result"] = f"refused: {str(exc)[:80]}"
            out["seconds"] = time.perf_counter() - t0
            os.open, os.scandir = real_open, real_scandir
            out["fds"] = peak[0] - base
            if how == "heap":
                out["heap"] = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
            elif how == "plain":
                out["rss"] = _status("VmHWM") - rss0
        except BaseException as exc:  # noqa: BLE001 - reported by the parent
            out["error"] = repr(exc)
        os.write(w, pickle.dumps(out))
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    result: dict[str, Any] = pickle.loads(data)
    return result


def measure(name: str, fn: Callable[[], str]) -> None:
    plain, traced, fds = _in_child(fn, "plain"), _in_child(fn, "heap"), _in_child(fn, "fds")
    for run in (plain, traced, fds):
        if "error" in run:
            print(f"  {name:<28} error: {run['error']}")
            return
    print(
        f"  {name:<28} {plain['seconds']:7.2f} s  peak RSS +{plain['rss'] / MiB:7.1f} MiB  "
        f"heap peak {traced['heap'] / MiB:8.2f} MiB  open fds +{fds['fds']:<5}  {plain['result']}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--links", type=int, default=300_000, help="hard links in one folder")
    ap.add_argument("--wide", type=int, default=2000, help="folders side by side in the wide+deep tree")
    ap.add_argument("--deep", type=int, default=120, help="nested folders in the wide+deep tree")
    ap.add_argument("--max-files", type=int, default=50_000, help="the copy's cap (ORCHESTRATOR_REPLAY_MAX_FILES)")
    ap.add_argument("--dir", default=None, help="where to make the trees (default: the temp dir)")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="hostile-walk-", dir=args.dir))
    try:
        links, fifos, tree = base / "links", base / "fifos", base / "tree"
        t0 = time.perf_counter()
        make_links(links, args.links, fifo=False)
        make_links(fifos, args.links, fifo=True)
        make_wide_deep(tree, args.wide, args.deep)
        print(
            f"trees made in {time.perf_counter() - t0:.1f}s under {base}; chown_tree bounds: "
            f"{hostile_fs.MAX_WALK_ENTRIES} entries, {hostile_fs.MAX_WALK_DEPTH} levels"
        )

        def scratch() -> Path:  # each walk runs in a child of its own
            return base / f"scratch-{os.getpid()}"

        def chown(walk: Callable[[Path, int, int], int], folder: Path) -> Callable[[], str]:
            st = os.lstat(folder)
            return lambda: f"changed {walk(folder, st.st_uid, st.st_gid)}"

        def copy(walk: Callable[..., CopyReport], folder: Path) -> Callable[[], str]:
            def go() -> str:
                r = walk(folder, scratch(), max_bytes=512 * MiB, max_files=args.max_files)
                return f"copied {r.entries}, skipped {len(r.skipped)} kept of {r.skipped_count or len(r.skipped)}"

            return go

        print(f"\n== {args.links} hard links in one folder: chown_tree")
        measure("before (listed whole)", chown(old_chown_tree, links))
        measure("after (lazy, bounded)", chown(chown_tree, links))
        print(f"\n== {args.links} hard links to FIFOs in one folder: the replay's copy (cap {args.max_files})")
        measure("before (listed whole)", copy(old_copy_workspace, fifos))
        measure("after (lazy, every entry)", copy(copy_workspace, fifos))
        print(f"\n== {args.wide} folders wide + {args.deep} deep: chown_tree")
        measure("before (fd per subfolder)", chown(old_chown_tree, tree))
        measure("after (two fds a level)", chown(chown_tree, tree))
        print(f"\n== {args.wide} folders wide + {args.deep} deep: the replay's copy (depth {MAX_DEPTH})")
        measure("before (listed whole)", copy(old_copy_workspace, tree))
        measure("after (lazy)", copy(copy_workspace, tree))
        if os.geteuid() == 0:
            print(
                f"\n== {args.wide} folders wide + {args.deep} deep handed to uid {OTHER_UID} under "
                f"RLIMIT_NOFILE {FD_LIMIT} (systemd's default soft limit)"
            )
            owner = os.lstat(tree)
            for name, walk in (("before (fd per subfolder)", old_chown_tree), ("after (two fds a level)", chown_tree)):
                chown_tree(tree, owner.st_uid, owner.st_gid)  # as it was
                print(f"  {name:<28} {_in_child(partial(hand_over, walk, tree), 'plain')['result']}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
