"""Fast recovery: every worker watches for groups whose lease holder is gone.

A SIGKILLed worker stops renewing its leases, but a lease stays taken until it
expires (``lease_ttl_s``, 60 s), the sweeper runs only every
``sweep_interval_s`` on beat (and not at all without beat), and no broker hands
the killed worker's task to another one in time (Redis redelivers an unacked
task only after its visibility timeout, longer than the longest run; the
``filesystem://`` broker never does).  So each worker's main process runs a
:class:`RecoveryWatch`: every ``recovery_interval_s`` seconds (0.5 s) one read of
the held leases, and a signal for each group whose holder is gone:

* a process of this worker's host that no longer runs (``hosts.gone_from_this_host``;
  ``leases.acquire`` takes such a lease over at once), or
* a holder the database gives up: a lease past its expiry, or held on a host
  that is ``stopped`` or has not beaten for ``hosts.ALIVE_WINDOW_S``
  (``leases.holder_gone``: any acquirer may take it), or
* a holder whose process is gone by its liveness token (``store/liveness.py``) and
  which has stopped renewing (``leases.gone_holders``; ``leases.acquire`` takes it over).

It signals too the groups with pending work and no live holder that are
placed on a host that takes no groups now (dead, stopped, draining:
``store.placement.stranded``): their last signal may sit in that host's own
queue, which nobody consumes; this one goes to the shared queue, and the
host that takes the group becomes its place.

The worker that gets the signal takes the lease and closes the dead holder's
run (``sweeper.recover_group``, called by the pipeline right after it took the
lease) before its own run starts.  A group is signalled again for the same
holder only after ``resignal_s``: the first signal may be waiting behind busy
workers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from orchestrator.run.queue import signal_group
from orchestrator.store.db import Database
from orchestrator.store.hosts import gone_from_this_host
from orchestrator.store.leases import gone_holders
from orchestrator.store.leftovers import held_leases
from orchestrator.store.placement import stranded

log = logging.getLogger(__name__)

# What stands for the holder of a group stranded on a host that takes no groups now.
PLACED_ON = "placed on "


def dead_holders(db: Database, host_id: str) -> list[tuple[str, str]]:
    """(group, holder) of every held lease whose holder is gone, judged by the
    database's clock, for processes of ``host_id`` (this machine) by their pids, and for
    any other by its liveness token once it stopped renewing (``leases.gone_holders``)."""
    judged, by_token = _dead_holders(db, host_id)
    return sorted(judged + by_token)


def _dead_holders(db: Database, host_id: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """:func:`dead_holders` in two: those the database or a pid judges, and those found
    by their liveness token (whose group may still be placed on a host that looks alive)."""
    judged, alive = [], []
    for jid, holder, gone in held_leases(db):
        if holder is None:
            continue
        if gone or gone_from_this_host(holder, host_id):
            judged.append((jid, holder))
        else:
            alive.append((jid, holder))
    by_token = gone_holders(db, alive) if alive else set()
    return judged, [k for k in alive if k in by_token]


class RecoveryWatch:
    """Signals the groups whose lease holder is gone, every ``interval_s`` seconds, from a thread.

    Started by the worker's main process (``workers/tasks.py``) on a
    composition root of its own; :meth:`check` is one look (tests call it).
    """

    def __init__(
        self,
        db: Database,
        *,
        host_id: str,
        signal: Callable[[str], object],
        interval_s: float,
        resignal_s: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db, self.host_id, self.interval_s, self.resignal_s = db, host_id, interval_s, resignal_s
        self._signal = signal
        self._monotonic = monotonic
        self._signalled: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="recovery-watch", daemon=True)

    def start(self) -> RecoveryWatch:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def check(self) -> list[str]:
        """One look: signal each group whose holder is gone, and each group stranded on a
        host that no longer takes groups (``store.placement.stranded``: its signal may sit
        in that host's queue), not again for the same holder or host within
        ``resignal_s``; returns the groups signalled."""
        judged, by_token = _dead_holders(self.db, self.host_id)
        found = sorted(judged + by_token)
        # Its host may still look alive (its heartbeat window not over), and its queue be the
        # group's: the signal goes to the shared queue, and the taker becomes the place.
        shared = {jid for jid, _ in by_token}
        held = {jid for jid, _ in found}
        found += [(jid, f"{PLACED_ON}{host}") for jid, host in stranded(self.db) if jid not in held]
        now = self._monotonic()
        self._signalled = {k: t for k, t in self._signalled.items() if k in set(found)}
        signalled: list[str] = []
        for chat_jid, holder in found:
            last = self._signalled.get((chat_jid, holder))
            if last is not None and now - last < self.resignal_s:
                continue
            try:
                if chat_jid in shared:
                    signal_group(self._signal, chat_jid, None)
                else:
                    self._signal(chat_jid)
            except Exception as exc:  # noqa: BLE001 - the broker away: next look
                log.warning(
                    "could not signal %s, whose lease holder %s is gone (%s); trying again in %.0fs",
                    chat_jid,
                    holder,
                    exc,
                    self.interval_s,
                )
                break
            self._signalled[(chat_jid, holder)] = now
            signalled.append(chat_jid)
            if holder.startswith(PLACED_ON):
                log.warning("%s is %s, which takes no groups now: signalled it on the shared queue", chat_jid, holder)
            else:
                log.warning(
                    "the lease holder of %s (%s) is gone: signalled a worker to take the group over", chat_jid, holder
                )
        return signalled

    def _run(self) -> None:
        while True:
            try:
                self.check()
            except Exception:  # the database away: next look
                log.warning(
                    "could not look for dead lease holders; trying again in %.0fs", self.interval_s, exc_info=True
                )
            if self._stop.wait(self.interval_s):
                return
