"""A chat run's outputs, stored as they arrive: the pipeline's
:class:`~orchestrator.run.attempt.RunOutputs`, and what the run's end stores with them.

Each output is a message of the chat, stored in a transaction of its own with its
pending deliveries, and only while this worker still holds the group's lease (the
fence: ``store/leases.py``), so a holder that was replaced stores nothing; after the
commit a deliverer is signalled.  A ``send_message`` to another chat (the main group's)
is stored there as our message, where the group may post.  A ``send_file`` stores the
workspace's file in the file store (``sandbox/outbox.py``) and posts it as an assistant
message with a FILE envelope.  Either is refused, with a host message, when it is not
among the group's tools (its profile: ``store/groups.py``, ``tool_refusal``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

from agent_runner.protocol import EditEvent, QuestionEvent, ReactEvent, TaskEvent, reaction_of
from orchestrator.core import metrics, tracing
from orchestrator.core.errors import FileTooLarge, HostileEntry, LeaseLost
from orchestrator.core.settings import Settings
from orchestrator.model.messages import SENDER_BOT, SENDER_EGRESS_LOG, NewMessage, StoredMessage
from orchestrator.model.parts import RECORD_KINDS
from orchestrator.model.views import REPLY_TO_KEY, RUN_ID_KEY
from orchestrator.run import agent_tasks, questions
from orchestrator.run.egress_log import record_metadata
from orchestrator.run.outcome import RunOutcome
from orchestrator.run.outputs import OutputMessage, checked_output, host_message
from orchestrator.sandbox.egress import EgressProxy
from orchestrator.sandbox.outbox import take_file
from orchestrator.sandbox.providers import facts_of
from orchestrator.store import leases
from orchestrator.store.db import Connection, Database, db_now
from orchestrator.store.deliveries import attached_channels, record_deliveries
from orchestrator.store.file_refs import file_envelope
from orchestrator.store.files import FileStore
from orchestrator.store.groups import Group, send_refusal, tool_refusal
from orchestrator.store.history import edit_agent_message
from orchestrator.store.message_log import insert_message, now_iso
from orchestrator.store.questions import AnswerAs, insert_question, open_question_of, set_message_seq
from orchestrator.store.reactions import react_to_person

log = logging.getLogger(__name__)

# An edit's words, and how far back an agent's message may be (as the runner's tool says).
MAX_EDIT_CHARS = 20_000
MAX_EDIT_BACK = 50
# The hosts one run's refusals may ask the chat about (a loop over many names asks about a few).
MAX_EGRESS_QUESTIONS = 3


class StoredOutput(NamedTuple):
    """An output stored in a run's transaction, for what follows its commit."""

    message: StoredMessage
    created: bool  # False: its id was stored already (the first copy stands)
    queued: int  # deliveries queued for the group's channels
    first_reply_at: datetime | None  # the run's first reply: when (the database's clock)


class ChatOutputs:
    """Stores the outputs of ``outcome``'s run in ``group``'s chat, as ``owner`` (the lease
    holder); ``deliver`` signals a deliverer for a chat (off the run's path, never raises)."""

    def __init__(
        self,
        db: Database,
        group: Group,
        outcome: RunOutcome,
        *,
        owner: str,
        deliver: Callable[[str], None],
        files: FileStore | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.db, self.group, self.outcome, self.owner = db, group, outcome, owner
        self._deliver = deliver
        self.files = files
        self.settings = settings

    # -- RunOutputs ---------------------------------------------------------------

    def output(self, out: OutputMessage) -> None:
        self.emit(out)

    def send_message(self, chat_jid: str, out: OutputMessage | None, index: int) -> None:
        """Post the agent's message where it asked, if this group may post there."""
        group, run_id = self.group, self.outcome.run.id
        refusal = tool_refusal(group, "send_message") or send_refusal(self.db, group, chat_jid)
        if refusal is not None:
            log.warning("run %s: send_message refused: %s", run_id, refusal)
            self.emit(host_message(run_id=f"{run_id}-{index:04d}", text=f"🚫 send_message refused: {refusal}"))
            return
        if out is None:
            return
        if chat_jid == group.chat_jid:
            self.emit(out)
            return
        # Another chat (main group only): stored there as our message; it
        # does not wake that chat's agent and is not this run's reply.
        meta = {**(out.metadata or {}), "via": "send_message", "from_chat": group.chat_jid, RUN_ID_KEY: run_id}
        with self.db.write() as session:
            leases.fence(session, group.chat_jid, self.owner)
            fields = {**out.model_dump(), "metadata": meta}
            new = NewMessage(chat_jid=chat_jid, timestamp=now_iso(), is_from_me=True, **fields)
            msg, created = insert_message(session, self.db, new)
            queued = record_deliveries(session, msg) if created else 0
        if queued:
            self._deliver(chat_jid)

    def send_file(self, workspace: Path, path: str, out: OutputMessage) -> None:
        """Store the workspace's file at ``path`` (by the hostile-folder rules: ``sandbox/outbox.py``)
        and post it in the chat with ``out``'s caption; a refusal is said in the chat instead."""
        run_id = self.outcome.run.id
        refusal = tool_refusal(self.group, "send_file")
        if refusal is not None:
            log.warning("run %s: send_file refused: %s", run_id, refusal)
            self.emit(host_message(run_id=out.id, text=f"🚫 send_file refused: {refusal}"))
            return
        try:
            if self.files is None:
                raise HostileEntry(path, "this worker keeps no files")
            stored = take_file(workspace, path, self.files, self.group.chat_jid)
        except (HostileEntry, FileTooLarge) as exc:
            log.warning("run %s: send_file refused: %s", run_id, exc)
            self.emit(host_message(run_id=out.id, text=f"🚫 send_file refused: {exc}"))
            return
        self.emit(out.model_copy(update={"metadata": file_envelope([stored], extras={"via": "send_file"})}))

    def task(self, event: TaskEvent, index: int) -> None:
        """Make or change a scheduled task as the agent asked, if it may (``run/agent_tasks.py``);
        what was done, or why not, is said in the chat."""
        run_id = self.outcome.run.id
        refusal = tool_refusal(self.group, "schedules") or (None if self.settings else "this worker has no settings")
        if refusal is not None or self.settings is None:
            said = f"🚫 {agent_tasks.tool_of(event)} refused: {refusal}"
        else:
            said = agent_tasks.handle(self.db, self.settings, self.group, event)
        if said.startswith("🚫"):
            log.warning("run %s: %s", run_id, said)
        self.emit(host_message(run_id=f"{run_id}-{index:04d}", text=said))

    def egress(self, proxy: EgressProxy) -> None:
        """The run's egress log, stored with it as a record (never shown to the model nor sent
        to a channel): every decision of its proxy, up to the proxy's cap, and how many were
        left out.  ``orchestrator runs show RUN --egress`` reads it."""
        metadata = record_metadata(proxy)
        if metadata is None:
            return
        run_id = self.outcome.run.id
        record = OutputMessage(
            id=f"{run_id}-egress-{len(self.outcome.stored):04d}",
            sender=SENDER_EGRESS_LOG,
            sender_name="egress",
            content=f"{len(proxy.decisions) + proxy.run.left_out} egress decision(s)",
            message_type="system",
            metadata=metadata,
        )
        try:
            self.emit(record)
            self._ask_about(proxy)
        except LeaseLost:
            log.warning("run %s: its egress log is not stored (the group was taken over)", run_id)

    def _ask_about(self, proxy: EgressProxy) -> None:
        """In ``ask`` mode: ask the chat about the hosts the run was refused (a few per run;
        one question per host at a time), fenced like every output."""
        hosts = list(proxy.run.to_ask)[:MAX_EGRESS_QUESTIONS]
        if not hosts or self.settings is None:
            return
        queued = 0
        with self.db.transaction() as conn:
            leases.fence(conn, self.group.chat_jid, self.owner)
            for host, port in hosts:
                asked = questions.ask_about_egress(
                    conn,
                    self.db,
                    chat_jid=self.group.chat_jid,
                    run_id=self.outcome.run.id,
                    host=host,
                    port=port,
                    asked_at=db_now(conn),
                    ttl_s=self.settings.runs.question_ttl_s,
                )
                queued += asked[1] if asked is not None else 0
        if queued:
            self._deliver(self.group.chat_jid)

    def edit(self, event: EditEvent, index: int) -> None:
        """Change the words of the agent's own ``nth_last`` message in this chat, if the group's
        agent may (``store/history.py``: the old words kept, the channels updated in place); a
        refusal is said in the chat."""
        run_id = self.outcome.run.id
        refusal = tool_refusal(self.group, "message_changes")
        if refusal is None and (len(event.text) > MAX_EDIT_CHARS or not event.text.strip()):
            refusal = f"the new words are empty or over {MAX_EDIT_CHARS} characters"
        if refusal is None and not 1 <= event.nth_last <= MAX_EDIT_BACK:
            refusal = f"nth_last is from 1 to {MAX_EDIT_BACK}, not {event.nth_last}"
        if refusal is None:
            changed = edit_agent_message(
                self.db, self.group.chat_jid, event.text, nth_last=event.nth_last, owner=self.owner, by_run=run_id
            )
            if changed is not None:
                self._deliver(self.group.chat_jid)
                return
            refusal = f"you have no message {event.nth_last} back in this chat to edit"
        log.warning("run %s: edit_message refused: %s", run_id, refusal)
        self.emit(host_message(run_id=f"{run_id}-{index:04d}", text=f"🚫 edit_message refused: {refusal}"))

    def react(self, event: ReactEvent, index: int) -> None:
        """Put ``event``'s emoji on a person's ``nth_last`` message in this chat, if the group's
        agent may (``store/reactions.py``: kept once, the channels asked to show it); a refusal
        is said in the chat."""
        run_id = self.outcome.run.id
        refusal = tool_refusal(self.group, "message_changes")
        reaction = reaction_of(event.emoji)
        if refusal is None and reaction is None:
            refusal = f"{event.emoji[:40]!r} is not one of the reactions every channel takes"
        if refusal is None and not 1 <= event.nth_last <= MAX_EDIT_BACK:
            refusal = f"nth_last is from 1 to {MAX_EDIT_BACK}, not {event.nth_last}"
        if refusal is None and reaction is not None:
            reacted = react_to_person(
                self.db, self.group.chat_jid, reaction.emoji, nth_last=event.nth_last, owner=self.owner, by_run=run_id
            )
            if reacted is not None:
                metrics.REACTIONS.labels(outcome="new" if reacted.created else "again").inc()
                if reacted.changes:
                    self._deliver(self.group.chat_jid)
                return
            refusal = f"there is no message {event.nth_last} back from a person in this chat to react to"
        log.warning("run %s: add_reaction refused: %s", run_id, refusal)
        metrics.REACTIONS.labels(outcome="refused").inc()
        self.emit(host_message(run_id=f"{run_id}-{index:04d}", text=f"🚫 add_reaction refused: {refusal}"))

    def question(self, event: QuestionEvent, index: int) -> bool:
        """Ask the group ``event``'s question, if the group's agent may and the question is one
        the host takes (``run/questions.py``): the question's row, the group's open question
        (an earlier one open expires), and the agent's message with an APPROVAL envelope, in
        one transaction.  A refusal is said in the chat; the run then ends as any other."""
        run_id = self.outcome.run.id
        refusal = tool_refusal(self.group, "questions") or questions.question_refusal(event)
        if refusal is None and self.settings is None:
            refusal = "this worker has no settings"
        if refusal is not None or self.settings is None:
            log.warning("run %s: ask_user refused: %s", run_id, refusal)
            self.emit(host_message(run_id=f"{run_id}-{index:04d}", text=f"🚫 ask_user refused: {refusal}"))
            return False
        model = self.outcome.model
        facts = facts_of(model.provider) if model is not None else None
        answer_as: AnswerAs = "message" if facts is not None and not facts.answers_as_tool_result else "tool_result"
        out = OutputMessage(
            id=f"{run_id}-{index:04d}",
            sender=SENDER_BOT,
            sender_name=self.group.assistant_name or self.settings.assistant_name,
            content=questions.question_text(
                event.question, event.options, multiple=event.multiple, allow_other=event.allow_other
            ),
            message_type="assistant",
        )
        with self.span(out), self.db.transaction() as conn:
            leases.fence(conn, self.group.chat_jid, self.owner)
            earlier = open_question_of(conn, self.group.chat_jid)
            if earlier is not None:
                questions.expire_in(conn, self.db, earlier, "a newer question was asked")
            asked = questions.new_question(
                chat_jid=self.group.chat_jid,
                run_id=run_id,
                reply_to_seq=self.outcome.run.cursor_to,
                event=event,
                answer_as=answer_as,
                asked_at=db_now(conn),
                ttl_s=self.settings.runs.question_ttl_s,
            )
            insert_question(conn, asked)
            out = out.model_copy(update={"metadata": questions.approval_envelope(asked)})
            stored = self.insert(conn, out, fenced=True)
            set_message_seq(conn, asked.id, stored.message.seq)
        self.stored(stored)
        return True

    # -- storing ------------------------------------------------------------------

    def emit(self, out: OutputMessage) -> None:
        """Store ``out`` in a transaction of its own (fixed statements on the driver)."""
        with self.span(out):
            with self.db.transaction() as conn:
                stored = self.insert(conn, out)
            self.stored(stored)

    @contextlib.contextmanager
    def span(self, out: OutputMessage) -> Iterator[None]:
        """Each stored output is a span of the run's trace (orchestrator/core/tracing.py)."""
        with tracing.span(
            f"store {out.message_type}",
            attributes={"orchestrator.message_id": out.id, "orchestrator.sender": out.sender},
        ):
            before = len(self.outcome.stored)
            yield
            stored = self.outcome.stored
            tracing.annotate(seq=stored[-1] if len(stored) > before else None)

    def insert(self, conn: Connection, out: OutputMessage, *, fenced: bool = False) -> StoredOutput:
        """Store ``out`` in the caller's transaction, if this worker still holds the group's lease
        (else :class:`LeaseLost`, and the caller's transaction stores nothing; ``fenced``: the
        caller's transaction made sure of it already).

        What can be read before the message is inserted is (the lease, the group's channels,
        the clock): the insert takes the lock that orders every message's seq and holds it to
        the commit, so every statement after it holds back every other writer of messages
        (``bench/db_reach.py``: the lock is where one database saturates)."""
        group, outcome = self.group, self.outcome
        out = checked_output(conn, group.chat_jid, out)  # what the container said of files, held to the store's
        # Outputs remember the last input their run saw: messages that arrive
        # during a run get later seqs than the run's replies, but the model
        # must see those replies first (see views.model_order).
        fields = out.model_dump()
        fields["metadata"] = {
            **(fields["metadata"] or {}),
            REPLY_TO_KEY: outcome.run.cursor_to,
            RUN_ID_KEY: outcome.run.id,
        }
        if not fenced:
            leases.fence(conn, group.chat_jid, self.owner)  # nothing stored by a replaced holder
        part = out.part
        attached = attached_channels(conn, group.chat_jid) if part.kind not in RECORD_KINDS else []
        # The run's first reply: when, on the clock its creation was taken from (metrics).
        first_reply = part.kind == "assistant_text" and not outcome.replied
        now = db_now(conn) if first_reply else None
        new = NewMessage(chat_jid=group.chat_jid, timestamp=now_iso(), is_from_me=True, **fields)
        msg, created = insert_message(conn, self.db, new)
        queued = record_deliveries(conn, msg, attached) if created else 0
        return StoredOutput(msg, created, queued, now if created else None)

    def stored(self, stored: StoredOutput) -> None:
        """What follows an output's commit: the run's record of it, metrics, the delivery signal."""
        outcome = self.outcome
        if stored.first_reply_at is not None:
            metrics.first_reply(outcome.run.created_at, stored.first_reply_at, outcome.waiting_since)
        if stored.created:
            outcome.stored.append(stored.message.seq)
            if stored.message.part.kind == "assistant_text":
                outcome.replied = True
        if stored.queued:
            self._deliver(self.group.chat_jid)
