"""A lease holder in a process of its own, for tests/host/test_liveness.py: it takes a group's
lease as a process of host ``HOST`` (keeping its liveness token), says ``held``, then renews
the lease every half second until it is killed."""

from __future__ import annotations

import sys
import time

from orchestrator.store import hosts, leases
from orchestrator.store.db import Database


def main() -> None:
    url, host, jid = sys.argv[1:4]
    db = Database(url)
    owner = hosts.process_owner(host)
    if not leases.acquire(db, jid, owner, 60):
        print("refused", flush=True)
        return
    print(f"held {owner}", flush=True)
    while True:
        time.sleep(leases.RENEW_EVERY_S)
        leases.renew(db, jid, owner, 60)


if __name__ == "__main__":
    main()
