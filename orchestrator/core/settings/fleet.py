"""The fleet: this worker's names, leases, when a host is gone, and the run cap."""

from __future__ import annotations

from typing import Annotated, ClassVar

from msgspec import Meta

from orchestrator.core.settings.section import Section


class FleetSettings(Section, kw_only=True):
    """Hosts, leases and the fleet's clocks: who this worker is, when a host is gone, the run cap."""

    prefix: ClassVar[str] = ""

    # This worker's name in the fleet (the hosts table, run owners, placement).
    # Empty: the machine's hostname.
    host_id: Annotated[str, Meta(description="this worker's name in the fleet; empty: the machine's hostname")] = ""
    # The machine this worker runs on, as hosts compare it to know whether they share a
    # kernel (and so its mounts): empty, /etc/machine-id with the kernel's boot id
    # (core/machine.py).  Set it only to stand for another machine (the fault trials).
    machine_id: Annotated[
        str, Meta(description="the machine this worker runs on; empty: machine id and boot id (tests stand for others)")
    ] = ""
    # The installation's id in container labels; empty: a hash of the database's URL.  Set
    # the same value on every host when hosts reach the database by different addresses
    # (a connection pooler beside each, a proxy), so that they know each other's containers.
    installation_id: Annotated[
        str,
        Meta(
            pattern=r"^([a-z0-9][a-z0-9-]{0,31})?$",
            description="the installation's id in container labels; empty: a hash of the database's URL",
        ),
    ] = ""
    # Lease on a group while a run holds it; renewed by a heartbeat.
    lease_ttl_s: Annotated[
        float, Meta(gt=1, description="seconds a run's lease on its group lasts between renewals")
    ] = 60.0
    # A host that has not beaten for this long is gone for good: any live host on the
    # same Docker engine removes its warm and standby containers (sandbox/warm/; a
    # worker SIGKILLed for good leaves them running otherwise), and another host may
    # take over the group volumes it held (store/volume_holds.py).  0: never.
    dead_host_s: Annotated[
        float, Meta(ge=0, description="seconds without a beat after which a host is gone for good; 0: never")
    ] = 120.0
    # Runs at once across the whole fleet (every worker of every host), counted
    # and admitted by the database (orchestrator/store/slots.py); 0: no cap.
    # A run over it never starts: its group waits (`orchestrator runs waiting`),
    # a person's message before scheduled tasks, the main group before others,
    # then the oldest wait, and a run that ends hands its slot on at once.
    max_concurrent_runs: Annotated[int, Meta(ge=0, description="runs at once across the whole fleet; 0: no cap")] = 0
    # How often each worker looks for groups whose lease holder is gone (a
    # SIGKILLed process of its host, a dead host) and signals them, so they
    # are taken over without waiting for the lease to expire (orchestrator/run/recovery.py); 0: never.
    recovery_interval_s: Annotated[
        float,
        Meta(ge=0, description="seconds between each worker's looks for groups whose lease holder is gone; 0: never"),
    ] = 0.5
    # How often Celery beat runs the sweeper.
    sweep_interval_s: Annotated[float, Meta(gt=0, description="seconds between beat's sweeps")] = 15.0
    # How often Celery beat looks for scheduled tasks that are due.
    schedule_tick_s: Annotated[
        float, Meta(gt=0, description="seconds between beat's looks for due scheduled tasks")
    ] = 10.0

    @property
    def effective_host_id(self) -> str:
        """This worker's fleet name: ``host_id``, or the machine's hostname."""
        import socket

        return self.host_id or socket.gethostname()
