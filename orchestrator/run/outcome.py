"""What a run did, as the pipeline's step reports it (``orchestrator/run/pipeline.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from agent_runner.protocol import ModelSettings
from orchestrator.sandbox.bounded_io import OutputBudget
from orchestrator.store.runs import Run


@dataclass
class RunOutcome:
    run: Run
    stored: list[int] = field(default_factory=list)  # seqs of stored outputs
    replied: bool = False  # an assistant reply reached the chat
    # The run's output caps, shared by its attempts (orchestrator/sandbox/bounded_io.py).
    budget: OutputBudget | None = None
    # Set when this attempt parked the run: its next attempt is due in this many seconds.
    retry_in: float | None = None
    # Outputs are numbered across the run's attempts (their ids, run_id-NNNN,
    # must never repeat): the last number given.
    indexed: int = 0
    # When the oldest message the run answers was stored (the database's clock; metrics).
    waiting_since: datetime | None = None
    # The model the run's input names (its result_meta record says which answered).
    model: ModelSettings | None = None
    # The run's end let go of the group's lease: the pending mark and cursor it left
    # (None: it did not, or the run has not ended).
    released: tuple[int, int] | None = None
