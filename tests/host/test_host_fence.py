"""The self-fence's clock (orchestrator/store/host_fence.py): a host whose beats stop reaching
the database runs its fence once per outage, past the deadline and not before; a beat that
gets through ends the outage."""

from __future__ import annotations

import threading
import time

from orchestrator.store.host_fence import FENCE_AFTER_S, SelfFence
from orchestrator.store.hosts import ALIVE_WINDOW_S, HEARTBEAT_INTERVAL_S
from orchestrator.store.leases import UNSURE_AFTER_S


def test_the_deadline_falls_between_the_lease_guard_and_the_liveness_window() -> None:
    # After the runs' own guard has stopped their sandboxes, with a beat's worth of margin
    # before another host may take the groups.
    assert UNSURE_AFTER_S < FENCE_AFTER_S <= ALIVE_WINDOW_S - HEARTBEAT_INTERVAL_S


def test_a_silent_host_fences_once_per_outage_and_not_while_it_beats() -> None:
    calls: list[float] = []
    fenced = threading.Event()

    def fence(silent: float) -> None:
        calls.append(silent)
        fenced.set()

    watch = SelfFence(fence, after_s=0.6).start()
    try:
        for _ in range(8):  # beating: never fenced
            time.sleep(0.15)
            watch.beat_ok()
        assert calls == [] and not watch.fenced
        assert fenced.wait(3)  # beats stop: fenced once, past the deadline
        assert len(calls) == 1 and calls[0] > 0.6 and watch.fenced
        time.sleep(1.0)
        assert len(calls) == 1  # the same outage: not again
        watch.beat_ok()  # the database answers: the outage is over
        assert not watch.fenced
        fenced.clear()
        assert fenced.wait(3)  # a second outage fences again
        assert len(calls) == 2
    finally:
        watch.stop()


def test_a_failing_fence_is_logged_and_the_watch_goes_on() -> None:
    tries: list[float] = []

    def fence(silent: float) -> None:
        tries.append(silent)
        raise OSError("docker is away")

    watch = SelfFence(fence, after_s=0.2).start()
    try:
        deadline = time.monotonic() + 3
        while not tries and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(tries) == 1 and watch.fenced
        watch.beat_ok()
        deadline = time.monotonic() + 3
        while len(tries) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(tries) == 2
    finally:
        watch.stop()
