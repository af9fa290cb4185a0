"""The orchestrator's Prometheus metrics, all in one place, and how they are served.

Each metric is a module-level object of the default registry (prometheus_client's
``REGISTRY``); the run path counts with one line per site, mostly through the
helpers below, and never decides anything by a metric.

Where they are seen:

* the HTTP API (one uvicorn process) serves what it counts itself on ``GET
  /metrics`` (orchestrator/http/api.py): ingest, sender refusals;
* a Celery worker counts in its pool children (runs, containers, deliveries, the
  sweeper), separate processes.  With ``ORCHESTRATOR_METRICS_PORT`` set, its main
  process puts prometheus_client in multiprocess mode before anything imports it
  (``PROMETHEUS_MULTIPROC_DIR``, set by workers/app.py: every process of the
  worker writes its counts to a file there) and serves the sum over its processes
  (:func:`serve_multiprocess`).

The metrics (names as exposed; counters end in ``_total``):

* ``orchestrator_messages_ingested_total{wakes}``: messages stored by ingest (a
  duplicate id is not counted), ``wakes`` "yes" when it woke the agent;
* ``orchestrator_sender_refusals_total``: messages refused because their sender
  was over ``ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE``;
* ``orchestrator_unregistered_messages_dropped_total``: messages not stored because
  their chat is no registered group and ``ORCHESTRATOR_UNREGISTERED_CHATS`` such
  chats are kept already (orchestrator/run/ingest.py);
* ``orchestrator_runs_started_total``: runs created (one per run, not per attempt);
* ``orchestrator_runs_finished_total{state}``: runs ended (succeeded, failed,
  timed_out, cancelled), by the pipeline, or closed as failed after their worker
  died (the sweeper, or the group's next lease holder);
* ``orchestrator_run_duration_seconds``: a run's ``duration_s`` as the pipeline
  ended it (from its creation to its end, on the database's clock, retries
  included);
* ``orchestrator_run_first_reply_seconds``: from a run's creation to its first
  stored assistant reply (the database's clock both times);
* ``orchestrator_queue_wait_seconds``: from the oldest message a run answers being
  stored to the run's creation (the database's clock both times; messages stored
  before revision 0012 have no storing time and count in no wait);
* ``orchestrator_message_first_reply_seconds``: from that message being stored to
  the run's first stored assistant reply: what a person waits, queue included;
* ``orchestrator_container_start_seconds{mode}``: from asking the sandbox for the
  agent to having it (``cold``: a new container; ``warm``: a warm one reused;
  ``standby``: a container started ahead, adopted by the group);
* ``orchestrator_deliveries_total{channel,state}``: delivery attempts ended:
  ``sent``, ``retried`` (failed, back to pending), ``failed`` (for good),
  ``cancelled`` (superseded before it was sent);
* ``orchestrator_delivery_seconds{channel}``: a channel's send call;
* ``orchestrator_lease_losses_total``: runs a worker gave up because another took
  the group's lease over;
* ``orchestrator_sweeper_actions_total{action}``: what sweeps did:
  ``interrupted_runs``, ``signalled_groups``, ``removed_containers``,
  ``abandoned_deliveries``;
* ``orchestrator_quota_waits_total{quota}``: steps that found their group over a
  quota (``runs_per_hour``, ``tokens_per_day``) and started nothing.

The API adds the fleet as the database sees it at each scrape
(orchestrator/http/fleet_metrics.py): per host, whether it is up, its unfinished
runs, its warm containers, the groups placed on it and the leases it holds.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest, start_http_server
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

log = logging.getLogger(__name__)

RUN_STATES = ("succeeded", "awaiting_answer", "failed", "timed_out", "cancelled")
SWEEPER_ACTIONS_NAMES = ("interrupted_runs", "signalled_groups", "removed_containers", "abandoned_deliveries")

MESSAGES_INGESTED = Counter(
    "orchestrator_messages_ingested",
    "Messages stored by ingest (duplicates not counted), by whether they woke the agent.",
    ["wakes"],
)
SENDER_REFUSALS = Counter(
    "orchestrator_sender_refusals", "Messages refused: their sender was over ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE."
)
UNREGISTERED_DROPS = Counter(
    "orchestrator_unregistered_messages_dropped",
    "Messages not stored: their chat is "
    "no registered group and ORCHESTRATOR_UNREGISTERED_CHATS such chats are kept already.",
)
RUNS_STARTED = Counter("orchestrator_runs_started", "Agent runs created (one per run, not per attempt).")
RUNS_FINISHED = Counter("orchestrator_runs_finished", "Agent runs ended, by their final state.", ["state"])
RUN_DURATION = Histogram(
    "orchestrator_run_duration_seconds",
    "A finished run's duration, from its creation to its end (the database's clock; retries included).",
    buckets=(1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
RUN_FIRST_REPLY = Histogram(
    "orchestrator_run_first_reply_seconds",
    "From a run's creation to its first stored assistant reply (the database's clock).",
    buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
QUEUE_WAIT = Histogram(
    "orchestrator_queue_wait_seconds",
    "From the oldest message a run answers being stored to the run's creation (the database's clock).",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)
MESSAGE_FIRST_REPLY = Histogram(
    "orchestrator_message_first_reply_seconds",
    "From the oldest message a run answers "
    "being stored to the run's first stored assistant reply (the database's clock).",
    buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
)
CONTAINER_START = Histogram(
    "orchestrator_container_start_seconds",
    "From asking the sandbox for the agent to "
    "having it: a new container (cold), a warm one reused, or a standby one adopted.",
    ["mode"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
DELIVERIES = Counter(
    "orchestrator_deliveries",
    "Delivery attempts ended: sent, retried (back to pending), failed (for good), cancelled (superseded).",
    ["channel", "state"],
)
DELIVERY_CHANGES = Counter(
    "orchestrator_delivery_changes",
    "Changes to what channels show (update, retract, react) ended: done, retried (back to "
    "pending), failed (for good), cancelled (nothing to do).",
    ["channel", "kind", "state"],
)
REACTIONS = Counter(
    "orchestrator_reactions", "The agent's add_reaction: new, again (already there), refused.", ["outcome"]
)
DELIVERY_SECONDS = Histogram("orchestrator_delivery_seconds", "A channel's send call.", ["channel"])
LEASE_LOSSES = Counter("orchestrator_lease_losses", "Runs given up because another worker took the group's lease.")
SWEEPER_ACTIONS = Counter("orchestrator_sweeper_actions", "What sweeps did.", ["action"])
EGRESS_DECISIONS = Counter(
    "orchestrator_egress_decisions", "Requests of sandboxes to the network, by the egress proxy's verdict.", ["verdict"]
)
QUOTA_WAITS = Counter(
    "orchestrator_quota_waits", "Steps that found their group over a quota and started nothing.", ["quota"]
)

# Label values known in advance start at 0, so a rate() has a series before the first event.
for _state in RUN_STATES:
    RUNS_FINISHED.labels(_state)
for _mode in ("cold", "warm", "standby"):
    CONTAINER_START.labels(_mode)
for _wakes in ("yes", "no"):
    MESSAGES_INGESTED.labels(_wakes)
for _action in SWEEPER_ACTIONS_NAMES:
    SWEEPER_ACTIONS.labels(_action)
for _verdict in ("allowed", "refused"):
    EGRESS_DECISIONS.labels(_verdict)


# -- what the run path calls ------------------------------------------------------------


def message_ingested(wakes: bool) -> None:
    MESSAGES_INGESTED.labels("yes" if wakes else "no").inc()


def run_finished(state: str, duration_s: float | None = None) -> None:
    """A run ended in ``state``; ``duration_s`` (its row's) is observed when given."""
    RUNS_FINISHED.labels(state).inc()
    if duration_s is not None:
        RUN_DURATION.observe(max(0.0, duration_s))


def _seconds(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds())


def run_created(created_at: datetime, waiting_since: datetime | None) -> None:
    """A run was created; ``waiting_since``: when the oldest message it answers was stored
    (None: no such time is known), both from the database's clock."""
    RUNS_STARTED.inc()
    if waiting_since is not None:
        QUEUE_WAIT.observe(_seconds(waiting_since, created_at))


def first_reply(created_at: datetime, replied_at: datetime, waiting_since: datetime | None = None) -> None:
    """A run's first stored reply: all times from the database's clock."""
    RUN_FIRST_REPLY.observe(_seconds(created_at, replied_at))
    if waiting_since is not None:
        MESSAGE_FIRST_REPLY.observe(_seconds(waiting_since, replied_at))


def container_started(since: float, agent: object) -> None:
    """The sandbox handed over ``agent``, asked for at ``since`` (:func:`time.perf_counter`).
    A warm pool's agent says how it was had (``start_mode``: cold, warm or standby); any other
    is a new container."""
    mode = getattr(agent, "start_mode", "cold")
    CONTAINER_START.labels(mode).observe(time.perf_counter() - since)


def delivery_ended(channel: str, state: str) -> None:
    DELIVERIES.labels(channel, state).inc()


def swept(**actions: int) -> None:
    """A sweep's report: ``interrupted_runs=N``, ``signalled_groups=N``, ... (names: SWEEPER_ACTIONS_NAMES)."""
    for action, count in actions.items():
        if count:
            SWEEPER_ACTIONS.labels(action).inc(count)


# -- serving ------------------------------------------------------------------------------


def exposition(registry: CollectorRegistry = REGISTRY) -> tuple[bytes, str]:
    """The text format of ``registry`` and its content type: what ``GET /metrics`` answers."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


def serve_multiprocess(path: Path, host: str, port: int) -> WSGIServer | None:
    """Serve ``/metrics`` on ``host:port`` from a thread: the sum of the counts every process
    wrote to ``path`` (the multiprocess folder).  None, with an error logged, when the
    address cannot be bound (the port is taken): the worker goes on without metrics."""
    registry = CollectorRegistry()
    # prometheus_client leaves these two unannotated (the rest of it is typed).
    MultiProcessCollector(registry, path=str(path))  # type: ignore[no-untyped-call]
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        log.error(
            "metrics: cannot serve on %s:%d (%s); this worker goes on without a metrics endpoint "
            "(ORCHESTRATOR_METRICS_PORT: one port per worker on a machine)",
            host,
            port,
            exc,
        )
        return None
    log.info("metrics: serving this worker's processes on http://%s:%d/metrics", host, port)
    return server


def process_dead(pid: int, path: Path) -> None:
    """A worker's pool child ended: prometheus_client drops its live gauges (its counts stay)."""
    mark_process_dead(pid, str(path))  # type: ignore[no-untyped-call]
