"""Assembling a run's input, recording it, and rebuilding it from history.

The pipeline calls :func:`plan_batch` and :func:`build_input`; the same two
functions rebuild the input of a finished run from the stored history
(:func:`rebuild_input`), which is how we show that the history is a faithful
record of what the model saw: for an unchanged history the rebuilt JSON is
byte for byte the JSON the run sent (``orchestrator runs show RUN --input
--verify``).  Each run stores that JSON, zlib-compressed, with its SHA-256.

The history a run sees is bounded twice, both from the stored rows and the
settings alone (so a rebuild with the same settings cuts it the same way):
by count (``context_messages`` messages of the model's view before the
batch; stored-only records count for nothing) and by tokens
(``context_tokens``, estimated as JSON bytes / 4: the oldest whole turns go
first, the batch always stays, and a system notice says what was left out).
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass

import msgspec

from agent_runner.protocol import ContainerInput, Limits, ModelSettings, SdkMessage, decode_input
from orchestrator.core.errors import NotFound
from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.model.views import Fitted, counts_in_view, fit_budget, model_view
from orchestrator.run.expand import expand_content
from orchestrator.run.history_cache import HistoryCache, KeptHistory
from orchestrator.run.instructions import group_instructions, read_memory
from orchestrator.run.run_files import sees_images, with_images
from orchestrator.run.schedules import is_isolated
from orchestrator.run.url_fetch import UrlBudget
from orchestrator.sandbox.config import effective_limits
from orchestrator.store.db import Database
from orchestrator.store.groups import Group, get_group
from orchestrator.store.message_log import get_messages_after, get_recent_messages
from orchestrator.store.runs import RecordedInput, recorded_input, run_cursors, save_input


@dataclass(frozen=True)
class Batch:
    """The new messages one run answers."""

    messages: list[StoredMessage]
    isolated: bool  # an isolated scheduled task: no history, no session

    @property
    def cursor_to(self) -> int:
        return self.messages[-1].seq


def plan_batch(new: list[StoredMessage]) -> Batch | int | None:
    """Which of the ``new`` messages the next run takes.

    Returns a :class:`Batch`, or a seq the cursor may skip to without a run
    (only our own output precedes an isolated task), or None for nothing.
    An isolated scheduled task runs alone; messages before it form their
    own run first.
    """
    if not new:
        return None
    cut = next((i for i, m in enumerate(new) if is_isolated(m.metadata)), None)
    if cut and all(m.is_from_me for m in new[:cut]):
        return new[cut - 1].seq
    if cut == 0:
        return Batch(new[:1], isolated=True)
    return Batch(new if cut is None else new[:cut], isolated=False)


def prior_messages(
    db: Database,
    settings: Settings,
    group: Group,
    batch: Batch,
    cursor_from: int,
    cache: HistoryCache | None = None,
) -> list[StoredMessage]:
    """The history shown before the batch (none for an isolated task): the last
    ``context_messages`` rows that may be in the model's view, read a page at a
    time so that rows it never shows (thinking, host notes) do not count.

    With a ``cache`` (a worker's), the rows its last run of the group showed
    and answered are reused while the group's ``history_rev`` says none
    changed, and only the rows stored since are read (``run/history_cache.py``);
    the batch is kept for the next run.  The answer is the same either way."""
    if batch.isolated or settings.context.messages == 0:
        return []
    wanted, chat_jid = settings.context.messages, group.chat_jid
    kept = None if cache is None else cache.get(chat_jid, group.history_rev, cursor_from, wanted)
    found: tuple[list[StoredMessage], bool] | None = None
    if kept is not None:
        since = (
            []
            if kept.upto == cursor_from
            else get_messages_after(chat_jid, kept.upto, limit=cursor_from - kept.upto, db=db)
        )
        rows, counted = _last_counted([*kept.rows, *(m for m in since if m.seq <= cursor_from)], wanted)
        if counted == wanted or kept.complete:
            found = rows, kept.complete and counted < wanted
    picked, complete = found if found is not None else _read_prior(db, chat_jid, cursor_from, wanted)
    if cache is not None:
        # The batch is all the live rows in (cursor_from, cursor_to]: the next run's history.
        rows, counted = _last_counted([*picked, *batch.messages], wanted)
        kept = KeptHistory(group.history_rev, batch.cursor_to, rows, complete and counted < wanted, wanted)
        cache.keep(chat_jid, kept)
    return picked


def _read_prior(db: Database, chat_jid: str, cursor_from: int, wanted: int) -> tuple[list[StoredMessage], bool]:
    """:func:`prior_messages` from the database alone; and whether the rows go back to the
    chat's first one the view counts (fewer than ``wanted`` were stored)."""
    before = cursor_from + 1
    # Rows cost their decoding: read little more than wanted (a run stores a
    # record or two the view skips: result_meta, thinking), another page if short.
    page = wanted + wanted // 4 + 8
    picked: list[StoredMessage] = []
    counted = 0
    while counted < wanted:
        rows = get_recent_messages(chat_jid, page, before_seq=before, db=db)
        for m in reversed(rows):
            if counts_in_view(m):
                if counted == wanted:
                    break
                counted += 1
            picked.append(m)
        if len(rows) < page:
            break
        before = rows[0].seq
    picked.reverse()
    shown, counted = _last_counted(picked, wanted)
    return shown, counted < wanted


def _last_counted(rows: list[StoredMessage], wanted: int) -> tuple[list[StoredMessage], int]:
    """The rows from the ``wanted``-th last that the view counts (from the first it counts, if
    fewer), and how many it counts: leading stored-only rows belong to an older turn."""
    counted, start = 0, len(rows)
    for i in range(len(rows) - 1, -1, -1):
        if counts_in_view(rows[i]):
            if counted == wanted:
                break
            counted += 1
            start = i
    return rows[start:], counted


def history_view(
    settings: Settings, group: Group, prior: list[StoredMessage], batch: Batch, *, images: bool = False
) -> Fitted:
    """The model's view of ``prior`` and the batch, user messages' context blocks
    expanded now, within ``settings.context.tokens``; with ``images`` (a model that sees
    them), the batch's messages name their images for the runner (``run/run_files.py``)."""
    workspace = settings.groups_dir / group.folder
    urls = UrlBudget(settings.context)  # one deadline for all the URL blocks of this input
    items = model_view([*prior, *batch.messages])
    if images:
        items = with_images(items, {m.seq for m in batch.messages})
    return fit_budget(
        items,
        {m.seq for m in batch.messages},
        settings.context.tokens,
        # Expanded only if kept: an old turn's file and URL blocks are not read to be dropped.
        expand=lambda m: expand_content(m.content, m.metadata, workspace, settings, urls),
    )


def left_out_notice(fitted: Fitted) -> list[str]:
    """The system notice saying how much of the history the budget left out (none if nothing was)."""
    if not fitted.dropped_messages:
        return []
    return [
        f"Note: to keep within the context budget, the {fitted.dropped_messages} oldest messages of this "
        f"conversation (about {fitted.dropped_tokens} tokens) are left out; the conversation shown starts after them."
    ]


def build_input(
    *,
    settings: Settings,
    group: Group,
    run_id: str,
    prior: list[StoredMessage],
    batch: Batch,
    assistant_name: str,
    notices: list[str],
    model: ModelSettings,
    send_targets: list[str] | None = None,
) -> ContainerInput:
    fitted = history_view(settings, group, prior, batch, images=sees_images(settings, model))
    instructions = group_instructions(settings, group)
    memory, memory_notice = read_memory(settings, settings.groups_dir / group.folder)
    return ContainerInput(
        run_id=run_id,
        chat_jid=group.chat_jid,
        group_folder=group.folder,
        assistant_name=assistant_name,
        messages=fitted.messages,
        system_notices=[*notices, *left_out_notice(fitted), *([memory_notice] if memory_notice else [])],
        instructions=instructions or msgspec.UNSET,
        memory=memory or msgspec.UNSET,
        send_targets=send_targets or [],
        session_id=None if batch.isolated else group.session_id,
        model=model,
        limits=Limits(
            max_turns=settings.provider.max_turns,
            bash_timeout_s=effective_limits(settings, group.container_config).bash_timeout_s,
        ),
    )


def input_bytes(payload: ContainerInput) -> bytes:
    """The exact bytes written to the container's stdin."""
    return payload.to_json()


def recorded(data: bytes) -> RecordedInput:
    """``data`` (a run's input) as it is recorded: compressed, with its digest."""
    return RecordedInput(hashlib.sha256(data).hexdigest(), zlib.compress(data))


def record_input(db: Database, run_id: str, data: bytes) -> str:
    """Record ``data`` as the (existing) run's input; its digest."""
    entry = recorded(data)
    save_input(db, run_id, entry)
    return entry.digest


def stored_input(db: Database, run_id: str) -> bytes | None:
    compressed = recorded_input(db, run_id)
    return None if compressed is None else zlib.decompress(compressed)


def rebuild_input(db: Database, settings: Settings, run_id: str) -> bytes:
    """Rebuild a recorded run's input from the stored history as it is now.

    The messages come from the history (with context blocks expanded again);
    what is not history (notices, which are ephemeral by design, the model
    and limits, the session) comes from the recorded input.
    """
    recorded = stored_input(db, run_id)
    if recorded is None:
        raise NotFound(f"run {run_id} has no recorded input")
    original = decode_input(recorded)
    cursor_from, cursor_to = run_cursors(db, run_id)
    group = get_group(db, original.chat_jid)
    new = [m for m in get_messages_after(group.chat_jid, cursor_from, db=db) if m.seq <= cursor_to]
    planned = plan_batch(new)
    if not isinstance(planned, Batch):
        messages: list[SdkMessage] = []
    else:
        prior = prior_messages(db, settings, group, planned, cursor_from)
        messages = history_view(settings, group, prior, planned, images=sees_images(settings, original.model)).messages
    return input_bytes(original.replace(messages=messages))
