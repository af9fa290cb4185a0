"""A run's span, in the trace of the messages it answers (orchestrator/core/tracing.py).

One ``run`` span per attempt (a parked run's next attempt is another task, maybe on
another worker, so another span), joined to the traces its batch's messages started
(``messages.traceparent``, orchestrator/store/traces.py): the first one's trace is the
run's, under the task's span when the task that runs it is in that trace (the
message's own signal, or a follow-up or retry sent from within it), else directly
under the message's span with a link to the task's (a sweeper's, a recovery watch's
or another message's follow-up signal); the batch's other messages are links.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from orchestrator.core import tracing
from orchestrator.store.db import Database
from orchestrator.store.runs import Run
from orchestrator.store.traces import batch_traces


@contextlib.contextmanager
def run_span(db: Database, run: Run) -> Iterator[None]:
    """The span of ``run``'s attempt (``run.attempts`` as its row says now); nothing, and no
    query, while tracing is off."""
    if not tracing.enabled():
        yield
        return
    joined = batch_traces(db, run.chat_jid, run.cursor_from, run.cursor_to)
    with tracing.span(
        "run",
        join=joined,
        attributes={
            "orchestrator.chat_jid": run.chat_jid,
            "orchestrator.run_id": run.id,
            "orchestrator.attempt": run.attempts,
            "orchestrator.cursor_from": run.cursor_from,
            "orchestrator.cursor_to": run.cursor_to,
        },
    ):
        yield
