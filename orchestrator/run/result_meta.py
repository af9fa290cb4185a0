"""The record every run ends with: a ``result_meta`` message.

Stored as the run's last output (sender ``result_meta``, type ``assistant``):
which model answered, how the run ended and why it stopped, its turns and
tokens (the gateway's count for a real model, cache reads and writes apart),
how long it took and what that cost at list price (an estimate:
``orchestrator/model/pricing.py``; None for a model without a price).  A
stored-only sender: never part of the model's view, never delivered to a
channel; the page shows it muted under the run.  The content is the same
facts on one line, for ``orchestrator history``.  A stored record is read
back through :func:`read_result_meta`, which checks it against
:class:`ResultMeta` (its state a ``RunState``, its limit a ``Limit``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

import msgspec

from agent_runner.protocol import Usage
from orchestrator.core.errors import StoreError
from orchestrator.model.messages import SENDER_RESULT_META
from orchestrator.model.pricing import PRICES_CHECKED, estimate_cost
from orchestrator.run.outputs import OutputMessage
from orchestrator.run.stop_notice import Limit
from orchestrator.store.runs import RunState


class UsageFacts(TypedDict):
    input_tokens: int  # cache reads and writes included
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int


class ResultMeta(TypedDict):
    """The ``result_meta`` message's metadata (the pipeline adds the run's id and cursor)."""

    # The run's provider: ModelSettings.provider, or ORCHESTRATOR_MODEL's first word when the
    # run's input was never built (a value that names no provider among the reasons).
    provider: str
    model: str
    state: RunState  # how the run ended: succeeded, failed, timed_out, cancelled
    stop_reason: str | None  # the model's last stop reason ("end_turn", "max_turns", ...); None if it did not end
    limit: Limit | None  # the limit that stopped the run (orchestrator/run/stop_notice.py), if one did
    num_turns: int
    attempts: int
    duration_s: float | None
    usage: UsageFacts
    cost_usd: float | None
    cost_basis: str


def result_meta_message(
    *,
    run_id: str,
    provider: str,
    model: str,
    state: RunState,
    stop_reason: str | None,
    limit: Limit | None,
    num_turns: int,
    attempts: int,
    duration_s: float | None,
    usage: Usage,
) -> OutputMessage:
    cost = estimate_cost(provider, model, usage)
    meta: ResultMeta = {
        "provider": provider,
        "model": model,
        "state": state,
        "stop_reason": stop_reason,
        "limit": limit,
        "num_turns": num_turns,
        "attempts": attempts,
        "duration_s": None if duration_s is None else round(duration_s, 3),
        "usage": {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cache_read_input_tokens": usage.cache_read_input_tokens,
            "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        },
        "cost_usd": cost,
        "cost_basis": f"an estimate at list prices of {PRICES_CHECKED}"
        if cost is not None
        else "no price known for this model",
    }
    return OutputMessage(
        id=f"{run_id}-meta",
        sender=SENDER_RESULT_META,
        sender_name="result",
        content=summary(meta),
        message_type="assistant",
        metadata=dict(meta),
    )


def read_result_meta(metadata: Mapping[str, object] | None) -> ResultMeta:
    """A stored ``result_meta`` message's metadata as its record (the run's id and cursor the
    pipeline adds are left out); :class:`StoreError` naming the field and the value that do
    not fit (a state or limit this version does not know, a field missing)."""
    try:
        return msgspec.convert(metadata, ResultMeta)
    except msgspec.ValidationError as exc:
        raise StoreError(f"a result_meta record this version cannot read: {exc}") from None


def summary(meta: ResultMeta) -> str:
    """The facts on one line: ``claude-sonnet-4-5 · end_turn · 3 turns · 12,034 in / 410 out tokens · 8.2 s · ≈ $0.0423``."""
    usage = meta["usage"]
    parts = [meta["model"], meta["stop_reason"] or meta["state"]]
    if meta["state"] != "succeeded" and meta["stop_reason"]:
        parts.append(meta["state"])
    turns = meta["num_turns"]
    parts.append(f"{turns} turn{'' if turns == 1 else 's'}")
    tokens = f"{usage['input_tokens']:,} in / {usage['output_tokens']:,} out tokens"
    if usage["cache_read_input_tokens"] or usage["cache_creation_input_tokens"]:
        tokens += (
            f" ({usage['cache_read_input_tokens']:,} cache reads, "
            f"{usage['cache_creation_input_tokens']:,} cache writes)"
        )
    parts.append(tokens)
    if meta["duration_s"] is not None:
        parts.append(f"{meta['duration_s']:.1f} s")
    cost = meta["cost_usd"]
    parts.append(f"≈ ${cost:.4f} (estimate)" if cost is not None else "no cost estimate")
    return " · ".join(parts)
