"""The fleet's run cap with real worker processes (issue 14, ``ORCHESTRATOR_MAX_CONCURRENT_RUNS``).

Two workers with three slots each, a cap of 2 and ten groups each sent
``$ sleep 2`` at once: Docker is sampled every 100 ms for this installation's
run containers, never more than two of them run, the groups over the cap
are seen waiting in line, and every group is answered exactly once.  Both
backends (SQLite + filesystem://, PostgreSQL + Redis).  The rules of the
line itself: ``tests/host/test_run_cap.py``.
"""

from __future__ import annotations

import threading
import time

import docker

from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.sandbox.containers import LABEL_INSTALL, LABEL_MANAGED, LABEL_WARM
from orchestrator.store.groups import add_group, get_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import list_runs
from orchestrator.store.slots import RECHECK_S, fleet_slots
from tests.conftest import wait_until

from .conftest import Stack

CAP = 2
GROUPS = [f"cap{i}@g.us" for i in range(10)]


def _answered(stack: Stack, chat: str) -> list[str]:
    return [m.content for m in get_messages_after(chat, 0, db=stack.db) if m.sender == "bot"]


def test_two_workers_never_run_more_containers_than_the_cap(stack: Stack) -> None:
    stack.env["ORCHESTRATOR_MAX_CONCURRENT_RUNS"] = str(CAP)
    for i, chat in enumerate(GROUPS):
        add_group(stack.db, chat_jid=chat, name=f"cap{i}", folder=f"cap{i}", requires_trigger=False)
    stack.start_worker(concurrency=3)
    stack.start_worker(concurrency=3)

    client = docker.from_env()
    labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={stack.settings.install_id}"]
    peak, peak_waiting, samples = 0, 0, 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak, peak_waiting, samples
        while not stop.is_set():
            # The list call alone (no inspect per container: one may be gone by then).
            running = [
                c
                for c in client.api.containers(filters={"label": labels, "status": "running"})
                if (c.get("Labels") or {}).get(LABEL_WARM) != "1"
            ]
            peak = max(peak, len(running))
            peak_waiting = max(peak_waiting, len(fleet_slots(stack.db, CAP).waiting))
            samples += 1
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    start = time.monotonic()
    try:
        for chat in GROUPS:  # all at once: ten groups for two slots
            ingest(
                stack.db,
                stack.settings,
                IncomingMessage(chat_jid=chat, sender="ann", content="$ sleep 2"),
                signal=stack.signals.group,
            )

        def drained() -> bool:
            groups = [get_group(stack.db, chat) for chat in GROUPS]
            return all(g.pending_seq <= g.cursor_seq for g in groups) and all(
                r.finished_at is not None for r in list_runs(stack.db, limit=100)
            )

        wait_until(drained, 90, "every group answered", stack.worker_logs)
    finally:
        stop.set()
        watcher.join()
    took = time.monotonic() - start
    runs = list_runs(stack.db, limit=100)
    # A run that ends signals the next in line: its slot is taken again at once, not at a re-check.
    # The k-th run admitted took the slot the (k - CAP)-th end freed.  PostgreSQL's now() is the
    # transaction's start, so a run admitted by a transaction that waited for the admission lock
    # while that end committed is dated before it: its hand-over counts as 0.
    ends = sorted(r.finished_at for r in runs if r.finished_at is not None)
    admitted = sorted(r.created_at for r in runs)
    handovers = [admitted[k] - ends[k - CAP] for k in range(CAP, len(admitted))]
    slowest = max(max(h.total_seconds(), 0.0) for h in handovers)
    print(
        f"RUN CAP: cap={CAP} workers=2x3 groups={len(GROUPS)} peak_containers={peak} "
        f"peak_waiting={peak_waiting} samples={samples} runs={len(runs)} took={took:.1f}s "
        f"slowest_handover={slowest:.2f}s"
    )
    assert peak <= CAP, f"{peak} run containers at once with a cap of {CAP}"
    assert peak == CAP  # the slots are used
    assert peak_waiting >= len(GROUPS) - CAP - 2  # the others were seen waiting in line
    assert sorted(r.chat_jid for r in runs) == sorted(GROUPS) and {r.state for r in runs} == {"succeeded"}
    assert all(len(_answered(stack, chat)) == 1 for chat in GROUPS), {c: _answered(stack, c) for c in GROUPS}
    assert fleet_slots(stack.db, CAP).waiting == []
    assert slowest < RECHECK_S, "a freed slot waited for the re-check instead of being handed on"
