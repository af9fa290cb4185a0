"""Every test file's duration: written by each pytest process, merged by ``scripts/test.sh``.

A pytest process started with ``ORCHESTRATOR_TEST_DURATIONS_PART`` (a path; scripts/test.sh
gives each of its processes one) writes there, at the end of its session, the total time of
every test file it ran (setup, call and teardown of each of its tests, summed), with its own
wall time and label (``ORCHESTRATOR_TEST_PROCESS``).  scripts/test.sh then merges the parts
into the durations file (``ORCHESTRATOR_TEST_DURATIONS``, default ``data/test-durations.json``)::

    python -m tests.durations merge --kind whole|quick|partial FILE PART...
    python -m tests.durations summary [FILE]    # the 25 slowest files, the total per process

The file keeps the run just made as ``last`` (``summary`` prints it), and the last run of
each kind that shares its files between processes, ``whole`` (the whole suite) and ``quick``
(``--quick``): their durations order the next run of that kind, longest file first
(``tests/file_claims.py``).  A run given test paths, or a selection (``-k``, ``-m``, ``-x``...), is ``partial``: kept as
``last`` only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

PART_ENV = "ORCHESTRATOR_TEST_DURATIONS_PART"
FILE_ENV = "ORCHESTRATOR_TEST_DURATIONS"
LABEL_ENV = "ORCHESTRATOR_TEST_PROCESS"
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FILE = ROOT / "data" / "test-durations.json"
SLOWEST = 25


def durations_file() -> Path:
    return Path(os.environ.get(FILE_ENV) or DEFAULT_FILE)


class Recorder:
    """A pytest plugin: sums each test file's report durations; writes them at the session's end."""

    def __init__(self, part: Path, label: str) -> None:
        self.part = part
        self.label = label
        self.started = time.monotonic()
        self.files: dict[str, float] = {}
        self.tests: dict[str, int] = {}
        # CPU time (this process's and its finished children's): what a file costs the machine,
        # beside how long it takes (a file that waits costs little on a shared one).
        self.cpu: dict[str, float] = {}
        self._cpu_at = 0.0

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self._cpu_at = _cpu_s()

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        name = nodeid.split("::", 1)[0]
        self.cpu[name] = self.cpu.get(name, 0.0) + _cpu_s() - self._cpu_at

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        name = report.nodeid.split("::", 1)[0]
        self.files[name] = self.files.get(name, 0.0) + report.duration
        if report.when == "setup":
            self.tests[name] = self.tests.get(name, 0) + 1

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        record = {
            "label": self.label,
            "wall_s": round(time.monotonic() - self.started, 3),
            "exit": int(exitstatus),
            "cpu_s": round(_cpu_s(), 3),
            "files": {
                name: {
                    "seconds": round(s, 3),
                    "cpu_s": round(self.cpu.get(name, 0.0), 3),
                    "tests": self.tests.get(name, 0),
                }
                for name, s in self.files.items()
            },
        }
        _write_json(self.part, record)


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def install(config: pytest.Config) -> None:
    """Register the recorder when this process was given a part to write (``pytest_configure``)."""
    part = os.environ.get(PART_ENV)
    if part:
        label = os.environ.get(LABEL_ENV) or f"pid {os.getpid()}"
        config.pluginmanager.register(Recorder(Path(part), label), "orchestrator-test-durations")


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def load(path: Path | None = None) -> dict[str, Any]:
    """The durations file, or ``{}`` when there is none (or it cannot be read)."""
    try:
        data = json.loads((path or durations_file()).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


KINDS = ("whole", "quick", "partial")
ORDERING_KINDS = ("whole", "quick")


def run_seconds(kind: str, path: Path | None = None) -> dict[str, float]:
    """Each file's duration in the last run of ``kind`` (empty when none was recorded)."""
    files = load(path).get(kind, {}).get("files", {})
    return {name: float(entry["seconds"]) for name, entry in files.items() if isinstance(entry, dict)}


def merge(path: Path, parts: list[Path], *, kind: str, argv: list[str]) -> dict[str, Any]:
    """This run (its parts) as ``last``, and as the last run of its ``kind`` when that orders runs."""
    processes = []
    files: dict[str, Any] = {}
    for part in sorted(parts):
        try:
            record = json.loads(part.read_text())
        except (OSError, ValueError):
            continue  # a process that died before its session ended wrote nothing
        processes.append(
            {
                "label": record["label"],
                "wall_s": record["wall_s"],
                "cpu_s": record.get("cpu_s", 0.0),
                "exit": record["exit"],
                "files": len(record["files"]),
                "tests_s": round(sum(e["seconds"] for e in record["files"].values()), 3),
            }
        )
        for name, entry in record["files"].items():
            files[name] = entry | {"process": record["label"]}
    run = {
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "kind": kind,
        "args": argv,
        "processes": processes,
        "files": files,
    }
    data = load(path)
    data["last"] = run
    if kind in ORDERING_KINDS and files:
        data[kind] = run
    _write_json(path, data)
    return data


def summary(path: Path, slowest: int = SLOWEST) -> str:
    run = load(path).get("last")
    if not run:
        return f"no test durations in {path}"
    files = sorted(run["files"].items(), key=lambda kv: -kv[1]["seconds"])
    lines = [f"test durations of the last run ({run['kind']}, args: {' '.join(run['args']) or '(none)'}; {path}):"]
    lines.append(f"the {min(slowest, len(files))} slowest of {len(files)} files (setup, call and teardown; the CPU")
    lines.append("time is the process's and its finished children's while the file ran):")
    for name, entry in files[:slowest]:
        cpu = entry.get("cpu_s", 0.0)
        lines.append(
            f"  {entry['seconds']:8.1f}s  {cpu:6.1f}s CPU  {entry['tests']:4d} tests  {name}  ({entry['process']})"
        )
    lines.append("per process:")
    for proc in run["processes"]:
        lines.append(
            f"  {proc['label']}: {proc['wall_s']:.1f}s wall, {proc.get('cpu_s', 0.0):.1f}s CPU, {proc['tests_s']:.1f}s in tests,"
            f" {proc['files']} files, exit {proc['exit']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.durations", description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    merging = sub.add_parser("merge", help="merge the processes' parts into the durations file")
    merging.add_argument("file", type=Path)
    merging.add_argument("--kind", choices=KINDS, required=True, help="the run's kind (see the module's doc)")
    merging.add_argument("--args", default="", help="the run's pytest arguments, for the record")
    merging.add_argument("parts", type=Path, nargs="*")
    summing = sub.add_parser("summary", help="the slowest files and the total per process")
    summing.add_argument("file", type=Path, nargs="?", default=None)
    ns = parser.parse_args(argv)
    if ns.command == "merge":
        merge(ns.file, ns.parts, kind=ns.kind, argv=ns.args.split())
    else:
        print(summary(ns.file or durations_file()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
