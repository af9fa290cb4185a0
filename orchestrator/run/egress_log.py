"""A run's egress log: every decision of its egress proxy (``sandbox/egress/``), kept with
the run as one stored-only ``egress_log`` record (never shown to the model nor sent to a
channel), and read back for ``orchestrator runs show RUN --egress`` and
``GET /api/runs/{run_id}/egress``.  At most the proxy's cap of decisions are kept, with a
count of the rest."""

from __future__ import annotations

import dataclasses

from pydantic import BaseModel, Field

from orchestrator.core import metrics
from orchestrator.core.jsontypes import JsonObject
from orchestrator.sandbox.egress import EgressProxy
from orchestrator.store.db import Database
from orchestrator.store.replays import run_messages
from orchestrator.store.runs import get_run


class EgressDecision(BaseModel):
    at: float = Field(description="When (seconds since the epoch).")
    method: str
    host: str
    port: int
    allowed: bool
    reason: str = Field(description="Why it was refused (or 'allowed').")
    sent: int = Field(description="Bytes the sandbox sent through it.")
    received: int = Field(description="Bytes it received through it.")
    path: str | None = Field(
        None, description="An intercepted request's path without its query string (a tunnel's is never seen)."
    )


class EgressLog(BaseModel):
    run_id: str
    decisions: list[EgressDecision]
    left_out: int = Field(description="Decisions past the log's cap, counted only.")
    bytes: int = Field(description="Bytes both ways, all the run's requests.")


def record_metadata(proxy: EgressProxy) -> JsonObject | None:
    """The ``egress_log`` record's metadata for the proxy's run (None: it decided nothing),
    its decisions counted in the metrics as they are kept."""
    decisions = proxy.decisions
    if not decisions and not proxy.run.left_out:
        return None
    for d in decisions:
        metrics.EGRESS_DECISIONS.labels("allowed" if d.allowed else "refused").inc()
    return {
        "decisions": [dataclasses.asdict(d) for d in decisions],
        "left_out": proxy.run.left_out,
        "bytes": proxy.run.bytes,
    }


def run_egress(db: Database, run_id: str) -> EgressLog:
    """The run's egress log (empty when its policy was off or it asked for nothing); NotFound
    for no such run."""
    run = get_run(db, run_id)
    decisions: list[EgressDecision] = []
    left_out = sent = 0
    for m in run_messages(db, run.id):
        if m.part.kind != "egress_log" or not m.metadata:
            continue
        decisions += [EgressDecision.model_validate(d) for d in m.metadata.get("decisions") or []]
        left_out += int(m.metadata.get("left_out") or 0)
        sent += int(m.metadata.get("bytes") or 0)
    return EgressLog(run_id=run.id, decisions=decisions, left_out=left_out, bytes=sent)
