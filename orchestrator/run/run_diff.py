"""Two runs side by side: what each said and spent (``orchestrator runs diff A B``,
``GET /api/runs/{a}/diff/{b}``).

Works for any two runs: an original and its replay (``orchestrator/run/replay.py``),
or two replays.  A chat run's outputs are its stored messages (ids ``<run id>-...``,
superseded ones included: the record of what that run said); a replay's are in
``replay_outputs``.  Both are the same records (``run/outputs.py``), so one reading
serves both: the replies (assistant text), the tool calls (name and input, with
their results' exit codes), and the ``result_meta`` record's tokens, cost estimate,
stop reason and turns (read with ``result_meta.read_result_meta``, which refuses a
record it cannot read; a run from before that record: its row's token counts).
Kept apart from the replay itself so the API reads runs without importing the
sandbox.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from agent_runner.protocol import ContainerInput, ProtocolError, Usage, decode_input
from orchestrator.model.parts import ToolResult
from orchestrator.model.pricing import estimate_cost
from orchestrator.run.assembly import stored_input
from orchestrator.run.outputs import OutputMessage
from orchestrator.run.result_meta import ResultMeta, read_result_meta
from orchestrator.sandbox.providers import model_spec, split_spec
from orchestrator.store.db import Database
from orchestrator.store.replays import replay_outputs, run_messages
from orchestrator.store.runs import Run, RunState, get_run


class ToolCall(BaseModel):
    name: str
    input: str = Field(description="The call's input, summarized (a shell command as it is; else JSON, cut).")
    exit_code: int | None = Field(default=None, description="Its result's exit code (null: no result recorded).")


class RunSummary(BaseModel):
    """What one run said and spent, for :func:`diff_runs`."""

    run_id: str
    replay_of: str | None
    model: str = Field(description="`provider:model` (`offline` for the offline model).")
    state: RunState
    error: str | None
    replies: list[str] = Field(description="The assistant's texts, in order.")
    tool_calls: list[ToolCall]
    input_tokens: int = Field(description="Cache reads and writes included.")
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    cost_usd: float | None = Field(description="An estimate at list prices; null: no price known.")
    duration_s: float | None
    stop_reason: str | None
    num_turns: int | None


class RunDiff(BaseModel):
    """Two runs side by side: ``a`` and ``b`` as asked."""

    a: RunSummary
    b: RunSummary
    same_input_messages: bool = Field(description="Both runs' recorded inputs hold the same messages.")


def run_outputs(db: Database, run: Run) -> list[OutputMessage]:
    """What ``run`` said: a replay's from ``replay_outputs``, a chat run's from its stored messages
    (superseded ones included: the record of what that run said)."""
    if run.replay_of is not None:
        return [OutputMessage.model_validate(o) for o in replay_outputs(db, run.id)]
    return [
        OutputMessage.model_validate(
            {
                "id": m.id,
                "sender": m.sender,
                "sender_name": m.sender_name,
                "content": m.content,
                "message_type": m.message_type,
                "metadata": m.metadata,
            }
        )
        for m in run_messages(db, run.id)
    ]


def _summary_of_input(text: Any) -> str:
    return text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)[:200]


def summarize(db: Database, run: Run) -> RunSummary:
    outputs = run_outputs(db, run)
    exit_codes: dict[str, int | None] = {}
    parts = [(out, out.part) for out in outputs]
    for _, part in parts:
        if isinstance(part, ToolResult):
            exit_codes[str(part.tool_use_id)] = part.exit_code
    replies: list[str] = []
    calls: list[ToolCall] = []
    meta_record: ResultMeta | None = None
    for out, part in parts:
        meta = out.metadata or {}
        if part.kind == "assistant_text":
            # A replay's send_message is recorded, never sent: say where it would have gone.
            to = meta.get("to_chat") if meta.get("via") == "send_message" else None
            replies.append(f"[send_message to {to}, not sent] {out.content}" if to else out.content)
        elif part.kind == "tool_use":
            # Every call the run made, a malformed one too: its name and input as stored.
            raw_input = meta.get("input")
            shown = raw_input.get("command") if isinstance(raw_input, dict) and meta.get("tool") == "bash" else None
            calls.append(
                ToolCall(
                    name=str(meta.get("tool") or out.sender_name),
                    input=_summary_of_input(shown if isinstance(shown, str) else raw_input),
                    exit_code=exit_codes.get(str(meta.get("tool_use_id"))),
                )
            )
        elif part.kind == "result_meta":
            meta_record = read_result_meta(meta)
    model = _model_of(db, run, meta_record)
    if meta_record is None:  # a run from before the result_meta record: its row's counts
        provider, model_id = split_spec(model)
        usage = Usage(input_tokens=run.input_tokens, output_tokens=run.output_tokens)
        cost = estimate_cost(provider, model_id or provider, usage)
        duration_s, stop_reason, num_turns = run.duration_s, None, None
    else:
        facts = meta_record["usage"]
        usage = Usage(
            input_tokens=facts["input_tokens"],
            output_tokens=facts["output_tokens"],
            cache_read_input_tokens=facts["cache_read_input_tokens"],
            cache_creation_input_tokens=facts["cache_creation_input_tokens"],
        )
        cost = meta_record["cost_usd"]
        duration_s = run.duration_s if run.duration_s is not None else meta_record["duration_s"]
        stop_reason, num_turns = meta_record["stop_reason"], meta_record["num_turns"]
    return RunSummary(
        run_id=run.id,
        replay_of=run.replay_of,
        model=model,
        state=run.state,
        error=run.error,
        replies=replies,
        tool_calls=calls,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_input_tokens=usage.cache_read_input_tokens,
        cache_creation_input_tokens=usage.cache_creation_input_tokens,
        cost_usd=cost,
        duration_s=duration_s,
        stop_reason=stop_reason,
        num_turns=num_turns,
    )


def _model_of(db: Database, run: Run, meta_record: ResultMeta | None) -> str:
    if meta_record is not None and meta_record["provider"]:
        provider, model = meta_record["provider"], meta_record["model"]
    else:
        recorded = _recorded(db, run)
        if recorded is None:
            return "unknown"
        provider, model = recorded.model.provider, recorded.model.model
    return model_spec(provider, model)


def _recorded(db: Database, run: Run) -> ContainerInput | None:
    raw = stored_input(db, run.id)
    if raw is None:
        return None
    try:
        return decode_input(raw)
    except ProtocolError:
        return None


def diff_runs(db: Database, a: str, b: str) -> RunDiff:
    """Runs ``a`` and ``b`` (ids or unique prefixes) side by side; :class:`StoreError` for no such run."""
    run_a, run_b = get_run(db, a), get_run(db, b)
    input_a, input_b = _recorded(db, run_a), _recorded(db, run_b)
    same = input_a is not None and input_b is not None and input_a.messages == input_b.messages
    return RunDiff(a=summarize(db, run_a), b=summarize(db, run_b), same_input_messages=same)
