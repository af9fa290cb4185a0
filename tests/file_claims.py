"""Test files shared between pytest processes that run at once (``scripts/test.sh``).

Every process is given ``ORCHESTRATOR_TEST_CLAIMS`` (one folder for them all): the first
process to reach a test file claims it (an ``O_EXCL`` file named after the file's path)
and runs all of it; the others leave it, unreported.  The integration processes go
through ``tests/integration`` first, longest files first, then help with ``tests/host``
and ``tests/container``, which the third process starts on at once; so the three end
close together, whatever each folder's share of the time.  ``--quick`` shares its files
the same way.  Without the variable every process runs everything it collected.

Why not pytest-xdist (docs/testing.md has the measurements): the processes have roles (the
integration ones first through tests/integration, each with a Redis database of its own;
the third never there), where xdist's workers are alike; a file is the unit, its tests in
its order with its module fixtures, as when it runs alone; and it was not faster.

Longest first: each file's duration in the last run of the same kind (whole or quick), from
the durations file (``tests/durations.py``); files it does not know (new ones) go first, as
they may be long.  With no durations file, :data:`LONGEST_FIRST` (the rest keep their order).
"""

from __future__ import annotations

import os

import pytest

from tests import durations

CLAIMS_ENV = "ORCHESTRATOR_TEST_CLAIMS"
# Which run this is ("whole" or "quick"): whose durations order it (scripts/test.sh sets it).
KIND_ENV = "ORCHESTRATOR_TEST_RUN_KIND"
# The order when no run was recorded yet: the longest files of a whole run in CI, longest first.
LONGEST_FIRST = (
    "tests/integration/test_worker_faults.py",
    "tests/integration/test_soak.py",
    "tests/integration/test_unprivileged_host.py",
    "tests/integration/test_bench.py",
    "tests/integration/test_placement.py",
    "tests/integration/test_claude_code_sandbox.py",
    "tests/integration/test_compose_up.py",
    "tests/integration/test_run_cap.py",
    "tests/integration/test_end_to_end.py",
    "tests/integration/test_hostile_sandbox.py",
    "tests/integration/test_output_bounds.py",
    "tests/integration/test_web_chat.py",
    "tests/host/test_api_contract.py",
)
_claims: dict[str, bool] = {}


def _file_of(item: pytest.Item) -> str:
    """The item's file, relative to the root (two folders may hold files of one name)."""
    return item.nodeid.split("::", 1)[0]


def order(items: list[pytest.Item]) -> None:
    if not os.environ.get(CLAIMS_ENV):
        return
    kind = os.environ.get(KIND_ENV) or "whole"
    measured = durations.run_seconds(kind) or durations.run_seconds("whole")
    if measured:
        # tests/integration first (only its processes collect it: the others cannot help with
        # it), then the rest; within each, the longest first, unknown files before all.
        def key(item: pytest.Item) -> tuple[bool, float]:
            name = _file_of(item)
            return (not name.startswith("tests/integration/"), -measured.get(name, float("inf")))

        items.sort(key=key)  # stable: a file's tests keep their order
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_file_of(item), len(rank)))


def claimed(item: pytest.Item) -> bool:
    """Whether this process runs ``item``'s file: the first process to reach a file takes all of it."""
    folder = os.environ.get(CLAIMS_ENV)
    if not folder:
        return True
    name = _file_of(item)
    if name not in _claims:
        try:
            os.close(os.open(os.path.join(folder, name.replace("/", "__")), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            _claims[name] = True
        except FileExistsError:
            _claims[name] = False
    return _claims[name]


def summary() -> str | None:
    if not os.environ.get(CLAIMS_ENV):
        return None
    ran = sorted(name for name, mine in _claims.items() if mine)
    return f"this process ran {len(ran)} of {len(_claims)} files: {' '.join(ran)}"
