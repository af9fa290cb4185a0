"""The fleet as the database sees it, in Prometheus' format, at each scrape of the API.

A worker's own ``/metrics`` says what its processes did; how many runs each host
has going, its warm containers and the groups placed on it are facts of the
database (``orchestrator/store/hosts.py``), the same whichever process reads
them.  So the API, the one scrape target every setup has, reads them when it is
scraped: no gauge to keep in step, and a dead host shows as down at once
instead of keeping its last values.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from orchestrator.store.db import Database
from orchestrator.store.hosts import list_hosts


class FleetCollector(Collector):
    """Per host (label ``host``): up, unfinished runs, warm containers, placed groups, leases held."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "orchestrator_host_up",
            "1 while the host beats (its heartbeat is younger than the liveness window and it did not stop), else 0.",
            labels=["host"],
        )
        runs = GaugeMetricFamily(
            "orchestrator_host_runs",
            "Runs owned by the host that are not final (queued, parked for a retry or running).",
            labels=["host"],
        )
        warm = GaugeMetricFamily(
            "orchestrator_host_warm_containers",
            "Warm agent containers the host reported at its last heartbeat.",
            labels=["host"],
        )
        placed = GaugeMetricFamily(
            "orchestrator_host_placed_groups",
            "Groups placed on the host (their signals go to its queue).",
            labels=["host"],
        )
        leases = GaugeMetricFamily("orchestrator_host_leases", "Group leases the host holds now.", labels=["host"])
        for host in list_hosts(self.db):
            up.add_metric([host.host_id], 1.0 if host.alive else 0.0)
            runs.add_metric([host.host_id], float(len(host.runs)))
            if host.warm_containers is not None:  # unknown (Docker did not answer) is no sample, not 0
                warm.add_metric([host.host_id], float(host.warm_containers))
            placed.add_metric([host.host_id], float(len(host.placed)))
            leases.add_metric([host.host_id], float(len(host.groups)))
        yield from (up, runs, warm, placed, leases)


def fleet_exposition(db: Database) -> bytes:
    """The fleet's gauges in the text format, read from ``db`` now."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(db))
    return generate_latest(registry)
