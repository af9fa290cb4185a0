"""Conversation continuity: what a 30-turn conversation costs in input tokens
per run, and how much of it the prompt cache serves, with the history as text
(before) and as tool blocks with cache breakpoints (after), in one command.

    .venv/bin/python -m bench.continuity [--turns 30] [--budget 60000] [--small-budget 6000]

Everything but the container runs as the worker runs it: a real database
(SQLite, a temporary data dir), the pipeline's own assembly (``plan_batch``,
``prior_messages``, ``build_input``, ``record_input``; each recorded input is
then rebuilt and must match byte for byte), the runner's agent loop and
Anthropic provider in this process (the real SDK over loopback HTTP), its
tools in a temporary workspace, and each event stored as the pipeline stores
it.  The model is the fake Messages API (``fakes/anthropic_api.py``)
with its :class:`PromptCache`, which counts a request's tokens (JSON bytes /
4 a block) and the cache's reads and writes as the API does (breakpoints, a
20-block look-back, a 1024-token minimum).  The script: every other question
makes the model call bash once (``seq`` prints ~1 KB) before it answers; the
others are answered at once.

Modes, each a fresh conversation of the same script:

* **before**: the model's view as it was: earlier tool calls left out,
  their results as ``[tool_result ...]`` user text; no prompt caching (the
  fake caches nothing).
* **text history, cached**: the view as before, with the cache
  breakpoints: which part of the saving is the cache's alone.
* **after**: earlier tool calls as tool_use/tool_result blocks (ids
  matched), the cache breakpoints of ``providers/anthropic.py``; the history
  within ``--budget`` tokens (the default setting).
* **after, small budget**: the same with ``--small-budget``: once the
  history is over it, each run drops its oldest turns, the prefix changes,
  and the cache is read only as far as the tools and the system prompt.

Per run: the input tokens of its model calls (cache reads and writes
included), the part read from the cache, the part written to it, and the
cost in uncached input tokens at Anthropic's prices (a cache write 1.25x, a
read 0.1x).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import msgspec
from sqlalchemy import update

from agent_runner.loop import run_agent
from agent_runner.protocol import ContainerInput, Event, ModelSettings, ResultEvent, SdkMessage
from agent_runner.providers.anthropic import AnthropicProvider
from fakes.anthropic_api import FakeAnthropic, PromptCache, Recorded, Reply, message
from orchestrator.core.settings import Settings
from orchestrator.model.views import REPLY_TO_KEY, RUN_ID_KEY
from orchestrator.run.assembly import (
    Batch,
    build_input,
    input_bytes,
    plan_batch,
    prior_messages,
    rebuild_input,
    record_input,
)
from orchestrator.run.model_choice import model_settings
from orchestrator.run.outputs import event_to_message
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, get_group
from orchestrator.store.message_log import get_messages_after, store_message_direct
from orchestrator.store.runs import create_run
from orchestrator.store.tables import GroupRow

JID = "bench@continuity"
NEVER = 10**12  # a cache minimum no prompt reaches: nothing cached


@dataclass
class RunFigures:
    input_tokens: int
    cache_read: int
    cache_write: int
    model_calls: int
    notices: int

    @property
    def cost(self) -> float:
        uncached = self.input_tokens - self.cache_read - self.cache_write
        return uncached + 1.25 * self.cache_write + 0.1 * self.cache_read


@dataclass
class Mode:
    name: str
    budget: int
    flatten: bool  # the view as it was before: tool calls out, results as text
    cache_min_tokens: int
    runs: list[RunFigures] = field(default_factory=list)


def flattened(messages: list[SdkMessage]) -> list[SdkMessage]:
    """The model's view before tool blocks: calls left out, every result plain text."""
    return [m.replace(tool_use_id=msgspec.UNSET) for m in messages if not m.tool_use]


def script(turn: int) -> Callable[[Recorded], Reply]:
    """The fake model: a bash call first on even turns, then an answer."""

    def reply(rec: Recorded) -> Reply:
        last = rec.body["messages"][-1]["content"]
        answered_tool = any(b.get("type") == "tool_result" for b in last)
        if turn % 2 == 0 and not answered_tool:
            return message(
                [
                    {"type": "text", "text": f"Let me count to {100 + turn}."},
                    {
                        "type": "tool_use",
                        "id": f"toolu_bench_{turn}",
                        "name": "bash",
                        "input": {"command": f"seq 1 {100 + turn} | tr '\\n' ' '"},
                    },
                ],
                "tool_use",
                n=40,
            )
        return message(
            [{"type": "text", "text": f"Answer {turn}: " + "the numbers are in order. " * 6}], "end_turn", n=60
        )

    return reply


def _store_outputs(db: Database, events: list[Event], run_id: str, answered: int) -> None:
    for i, event in enumerate(events):
        out = event_to_message(event, run_id=run_id, index=i, assistant_name="Andy")
        if out is None:
            continue
        store_message_direct(
            db=db,
            id=out.id,
            chat_jid=JID,
            sender=out.sender,
            sender_name=out.sender_name,
            content=out.content,
            timestamp=datetime.now(UTC).isoformat(),
            is_from_me=True,
            message_type=out.message_type,
            metadata={**(out.metadata or {}), REPLY_TO_KEY: answered, RUN_ID_KEY: run_id},
        )


def converse(mode: Mode, turns: int, root: Path) -> None:
    data = root / mode.name.replace(" ", "-").replace(",", "")
    settings = Settings.load(data_dir=data, env_file=None, context_tokens=mode.budget, workspace_quota="0")
    settings.ensure_dirs()
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    db.migrate()
    add_group(db, chat_jid=JID, name="bench", folder="bench", requires_trigger=False)
    workspace = settings.groups_dir / "bench"
    workspace.mkdir(parents=True, exist_ok=True)
    fake = FakeAnthropic(prompt_cache=PromptCache(min_tokens=mode.cache_min_tokens))
    with fake.serve() as base_url:
        model = ModelSettings(provider="anthropic", model="claude-fake", max_tokens=1024, base_url=base_url)
        for turn in range(turns):
            store_message_direct(
                db=db,
                id=f"q{turn}",
                chat_jid=JID,
                sender="ann",
                sender_name="Ann",
                content=f"Question {turn}: count for me, and remember what you counted before.",
                timestamp=datetime.now(UTC).isoformat(),
            )
            group = get_group(db, JID)
            batch = plan_batch(get_messages_after(JID, group.cursor_seq, db=db))
            assert isinstance(batch, Batch)
            run = create_run(
                db, chat_jid=JID, cursor_from=group.cursor_seq, cursor_to=batch.cursor_to, celery_task_id=None
            )
            payload = build_input(
                settings=settings,
                group=group,
                run_id=run.id,
                batch=batch,
                assistant_name="Andy",
                notices=[],
                prior=prior_messages(db, settings, group, batch, group.cursor_seq),
                model=model_settings(settings),
            )
            sent = input_bytes(payload)
            record_input(db, run.id, sent)
            if rebuild_input(db, settings, run.id) != sent:
                raise SystemExit(f"{mode.name}: run {turn}'s recorded input does not rebuild")
            inp: ContainerInput = payload.replace(model=model)
            if mode.flatten:
                inp = inp.replace(messages=flattened(inp.messages))
            fake.replies.extend([script(turn)] * 2)
            events: list[Event] = []
            result = run_agent(inp, AnthropicProvider(model), events.append, workspace=workspace)
            fake.replies.clear()
            assert isinstance(result, ResultEvent)
            _store_outputs(db, events, run.id, batch.cursor_to)
            with db.write() as session:
                session.execute(
                    update(GroupRow)
                    .where(GroupRow.chat_jid == JID)
                    .values(cursor_seq=batch.cursor_to, pending_seq=batch.cursor_to)
                )
            u = result.usage
            mode.runs.append(
                RunFigures(
                    u.input_tokens,
                    u.cache_read_input_tokens,
                    u.cache_creation_input_tokens,
                    result.num_turns,
                    len(payload.system_notices),
                )
            )
    db.dispose()


def report(modes: list[Mode], turns: int) -> None:
    print(f"# {turns}-turn conversation, fake Anthropic API with prompt-cache accounting")
    print("input tokens per run (cache read / written) [cost in uncached tokens]; * = history trimmed")
    header = "run  " + "".join(f"{m.name:>42}" for m in modes)
    print(header)
    for i in range(turns):
        cells = []
        for m in modes:
            r = m.runs[i]
            mark = "*" if r.notices else " "
            cells.append(f"{r.input_tokens:>8} ({r.cache_read:>6}/{r.cache_write:>6}) [{r.cost:>8.0f}]{mark}")
        print(f"{i + 1:>3}  " + "".join(f"{c:>42}" for c in cells))
    print()
    for m in modes:
        total = sum(r.input_tokens for r in m.runs)
        read = sum(r.cache_read for r in m.runs)
        cost = sum(r.cost for r in m.runs)
        hits = sum(1 for r in m.runs if r.cache_read)
        print(
            f"{m.name:>24}: input {total:>8} tokens, {100 * read / max(total, 1):5.1f}% read from the cache, "
            f"{hits}/{len(m.runs)} runs with a cache hit, cost {cost:>9.0f} uncached-token equivalents, "
            f"last run {m.runs[-1].input_tokens} tokens"
        )
    print(json.dumps({m.name: [r.__dict__ for r in m.runs] for m in modes}), file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--budget", type=int, default=Settings.load(env_file=None).context.tokens)
    parser.add_argument("--small-budget", type=int, default=6000)
    args = parser.parse_args(argv)
    modes = [
        Mode("before", args.budget, flatten=True, cache_min_tokens=NEVER),
        Mode("text history, cached", args.budget, flatten=True, cache_min_tokens=1024),
        Mode("after", args.budget, flatten=False, cache_min_tokens=1024),
        Mode(f"after, budget {args.small_budget}", args.small_budget, flatten=False, cache_min_tokens=1024),
    ]
    with tempfile.TemporaryDirectory(prefix="bench-continuity-") as tmp:
        for mode in modes:
            converse(mode, args.turns, Path(tmp))
    report(modes, args.turns)


if __name__ == "__main__":
    main()
