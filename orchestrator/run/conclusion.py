"""A chat run's conclusion after an attempt: parked for its next attempt, or ended.

A failed attempt that may be retried (retryable, no reply in the chat yet, attempts
left) parks the run (``queued``, ``retry_at`` after a backoff with jitter); any other
ends it: the chat is told why it did not succeed (a host message, never the model's),
and the run's end is one transaction (the run row, its ``result_meta`` record, the
cursor past its batch and the group's lease let go of).  A run whose group was taken
over by another worker is left as it is, for the new holder to close.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from orchestrator.core import metrics, tracing
from orchestrator.core.backoff import backoff_delay
from orchestrator.core.clock import Clock
from orchestrator.core.errors import LeaseLost
from orchestrator.core.settings import Settings
from orchestrator.run.attempt import Verdict
from orchestrator.run.chat_outputs import ChatOutputs
from orchestrator.run.outcome import RunOutcome
from orchestrator.run.outputs import OutputMessage, host_message
from orchestrator.run.result_meta import result_meta_message
from orchestrator.run.stop_notice import stop_notice
from orchestrator.sandbox.providers import split_spec
from orchestrator.store import leases
from orchestrator.store.runs import GOOD_ENDS, park_run

log = logging.getLogger(__name__)


def conclude(outputs: ChatOutputs, verdict: Verdict, *, settings: Settings, clock: Clock, isolated: bool) -> RunOutcome:
    """Park the run for a retry, or end it: the host message, the cursor, the run row.
    ``isolated``: the run's session is not the group's (an isolated scheduled task)."""
    db, group, outcome = outputs.db, outputs.group, outputs.outcome
    run = outcome.run
    if verdict.lease_lost:
        return _taken_over(outcome, verdict.error)
    # A run that already answered is never replayed from the start (no
    # duplicate replies). Tool records of a failed attempt stay: those
    # commands did run.
    if verdict.retryable and not outcome.replied and run.attempts < settings.runs.max_attempts:
        delay = backoff_delay(run.attempts, settings.runs.retry_base_s, settings.runs.retry_max_s)
        log.warning("run %s attempt %d failed (%s); retrying in %.1fs", run.id, run.attempts, verdict.error, delay)
        outcome.run = park_run(
            db,
            run.id,
            attempts=run.attempts + 1,
            error=verdict.error,
            retry_at=clock.now() + timedelta(seconds=delay),
            input_tokens=verdict.usage.input_tokens,
            output_tokens=verdict.usage.output_tokens,
        )
        outcome.retry_in = delay
        tracing.annotate(run_state="parked", error=verdict.error, retry_in_s=round(delay, 3))
        return outcome
    try:
        notice = _stop_notice(outputs, verdict, settings)
        if verdict.state == "cancelled":
            outputs.emit(host_message(run_id=run.id, text="🛑 Run cancelled."))
        elif notice is not None:
            # A limit stopped it: say which, and how to raise it.
            outputs.emit(host_message(run_id=run.id, text=notice))
        elif verdict.state not in GOOD_ENDS:
            outputs.emit(host_message(run_id=run.id, text=f"⚠️ Agent error: {verdict.error}"))
        record = _result_meta(outputs, verdict, settings)
    except LeaseLost as lost:
        return _taken_over(outcome, str(lost))
    session_id = None if isolated else verdict.session_id
    try:
        with outputs.span(record):
            # The run's end is one transaction: the run row's end; its record (stored only,
            # for people and tools, never the model); the cursor past its batch and the
            # lease let go of, in one statement that also proves the lease still ours (the
            # fence: else LeaseLost, and nothing of the end is committed).  The pending mark
            # and cursor the release leaves say whether work is left (Pipeline.step).  In
            # this order: the record's insert takes the message-seq lock and ingest takes
            # it before the group's row, so the row comes after it here too (no deadlock),
            # and the run row before it (no one else locks a run row after the seq lock).
            with db.transaction() as conn:
                ended = verdict.end_run(db, run.id, conn)
                stored = outputs.insert(conn, record, fenced=True)
                released = leases.end_hold(conn, group.chat_jid, outputs.owner, run.cursor_to, session_id)
            # Committed: the run has ended and the lease is let go of (a LeaseLost above
            # rolled all of it back, and the outcome still says the run is unfinished).
            outcome.run, outcome.released = ended, released
            outputs.stored(stored)
    except LeaseLost as lost:
        return _taken_over(outcome, str(lost))
    metrics.run_finished(outcome.run.state, outcome.run.duration_s)
    tracing.annotate(run_state=outcome.run.state, error=outcome.run.error, outputs=len(outcome.stored))
    if outcome.run.state not in GOOD_ENDS:
        tracing.failed(outcome.run.error or outcome.run.state)
    log.info(
        "run %s of %s ended %s after %d attempt(s), %d output(s) stored",
        run.id,
        group.chat_jid,
        outcome.run.state,
        outcome.run.attempts,
        len(outcome.stored),
    )
    return outcome


def _stop_notice(outputs: ChatOutputs, verdict: Verdict, settings: Settings) -> str | None:
    """The chat's message when a limit stopped the run (orchestrator/run/stop_notice.py), else None."""
    if verdict.limit is None:
        return None
    model = outputs.outcome.model
    return stop_notice(
        verdict.limit,
        settings=settings,
        group=outputs.group,
        num_turns=verdict.num_turns,
        max_tokens=model.max_tokens if model is not None else settings.provider.max_tokens,
        tokens_spent=verdict.usage.input_tokens + verdict.usage.output_tokens,
    )


def _result_meta(outputs: ChatOutputs, verdict: Verdict, settings: Settings) -> OutputMessage:
    """The run's ``result_meta`` record (orchestrator/run/result_meta.py)."""
    run, chosen = outputs.outcome.run, outputs.outcome.model
    provider: str
    if chosen is not None:
        provider, model = chosen.provider, chosen.model
    else:  # the input was never built (a bad ORCHESTRATOR_MODEL among the reasons)
        provider, model = split_spec(settings.provider.model)
        model = model or provider
    duration = None
    if run.started_at is not None:
        # The clock started_at was taken from, as finish_run's.
        duration = max(0.0, (outputs.db.now() - run.started_at).total_seconds())
    return result_meta_message(
        run_id=run.id,
        provider=provider,
        model=model,
        state=verdict.state,
        stop_reason=verdict.stop_reason,
        limit=verdict.limit,
        num_turns=verdict.num_turns,
        attempts=run.attempts,
        duration_s=duration,
        usage=verdict.usage,
    )


def _taken_over(outcome: RunOutcome, why: str | None) -> RunOutcome:
    """The group's lease went to another worker during this run: stop here, store
    nothing more, leave the run as it is.  Its new holder closes it before it runs
    (``sweeper.recover_group``: a reply already stored moves the cursor on, none
    leaves the messages pending for the new run), or the sweeper does."""
    metrics.LEASE_LOSSES.inc()
    log.warning("run %s of %s: %s; left to the group's new lease holder", outcome.run.id, outcome.run.chat_jid, why)
    return outcome
