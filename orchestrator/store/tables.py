"""SQLAlchemy table mappings: messages, registered groups, agent runs, scheduled
tasks, the channels of each group and deliveries to them, the fleet's hosts,
the senders' recent messages (the rate limit's window), the groups waiting for
a run slot.

The schema itself is owned by the Alembic migrations in
``orchestrator/migrations``; these classes must stay in step with them (a test
compares the two).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from orchestrator.core.jsontypes import JsonObject


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on every backend.

    PostgreSQL keeps the zone; SQLite stores naive text.  Values go in as
    UTC and always come back aware, so code and JSON look the same on both.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(UTC)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None:
            value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return value


class Base(DeclarativeBase):
    pass


class MessageRow(Base):
    __tablename__ = "messages"

    id: Mapped[str] = mapped_column(Text, primary_key=True)
    chat_jid: Mapped[str] = mapped_column(Text, primary_key=True)
    # Monotonic across the whole table and assigned in commit order: the
    # cursor.  Timestamps are not cursors (equal timestamps lose messages).
    seq: Mapped[int] = mapped_column(Integer, nullable=False, unique=True)
    sender: Mapped[str] = mapped_column(Text, nullable=False)
    sender_name: Mapped[str] = mapped_column(Text, nullable=False, default="")
    content: Mapped[str] = mapped_column(Text, nullable=False, default="")
    timestamp: Mapped[str] = mapped_column(Text, nullable=False)
    is_from_me: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    message_type: Mapped[str] = mapped_column(Text, nullable=False, server_default="user")
    # "metadata" is reserved on declarative classes, hence the attribute name.
    meta: Mapped[JsonObject | None] = mapped_column("metadata", JSON, nullable=True)
    # Set by regenerate / truncate: kept for audit, absent from every view.
    superseded_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    edited_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # The database's clock at the insert (revision 0012; NULL before it): how long a
    # message waited for its run and for its first reply (orchestrator/core/metrics.py).
    # ``timestamp`` is the sender's and is not trusted for that.
    stored_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # The W3C traceparent of the trace this message started, for a message that woke
    # the agent while tracing was on (revision 0013; orchestrator/store/traces.py): the
    # trace a run answering it joins, whichever signal started the run.
    traceparent: Mapped[str | None] = mapped_column(Text, nullable=True)

    __table_args__ = (
        Index("idx_messages_by_chat", "chat_jid", "timestamp"),
        Index("idx_messages_chat_seq", "chat_jid", "seq"),
    )


class GroupRow(Base):
    __tablename__ = "groups"

    chat_jid: Mapped[str] = mapped_column(Text, primary_key=True)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    folder: Mapped[str] = mapped_column(Text, nullable=False, unique=True)
    is_main: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    requires_trigger: Mapped[bool] = mapped_column(Boolean, nullable=False, default=True)
    assistant_name: Mapped[str | None] = mapped_column(Text, nullable=True)
    container_config: Mapped[JsonObject | None] = mapped_column(JSON, nullable=True)
    # The group's own quotas (orchestrator/store/usage.py); NULL: the settings', 0: no limit.
    runs_per_hour: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tokens_per_day: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The group's own profile (revision 0021; orchestrator/run/profile.py), each NULL for the
    # installation's: its model ("provider:model" as ORCHESTRATOR_MODEL spells it), output
    # cap and thinking budget, the trigger names that replace the installation's, and the
    # optional tools its agent has (agent_runner.protocol.OPTIONAL_TOOLS).
    model: Mapped[str | None] = mapped_column(Text, nullable=True)
    max_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    thinking_budget: Mapped[int | None] = mapped_column(Integer, nullable=True)
    trigger_names: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    tools: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # Seq of the last message a run has consumed.
    cursor_seq: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    # Highest seq of a message that should wake the agent (0: none pending).
    pending_seq: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    lease_owner: Mapped[str | None] = mapped_column(Text, nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # When the holder last took or renewed the lease (the database's clock; store/liveness.py).
    lease_renewed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Moved by the database's triggers whenever a stored message of the chat changes or
    # goes (revision 0027): a worker's kept history is good while it stays the same.
    history_rev: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    session_id: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The host the group is placed on (orchestrator/store/placement.py): its signals go to
    # that host's own queue while it is up; NULL: no place yet, the shared queue.
    placed_host: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    # The group's open question (revision 0023; orchestrator/run/questions.py), at most one,
    # read with the group by ingest; and who may answer (NULL: anyone in the chat).
    open_question: Mapped[str | None] = mapped_column(String(16), nullable=True)
    approvers: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)

    __table_args__ = (
        # At most one main group, whoever writes the row (revision 0017): its agent may
        # post into every chat, so a second one is refused by the database itself.
        Index(
            "uq_groups_one_main", "is_main", unique=True, postgresql_where=text("is_main"), sqlite_where=text("is_main")
        ),
    )


class RunRow(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    chat_jid: Mapped[str] = mapped_column(Text, nullable=False, index=True)
    state: Mapped[str] = mapped_column(String(16), nullable=False, index=True)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    cursor_from: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    cursor_to: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    celery_task_id: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The pipeline (host:pid:nonce) running it; matches the group's lease owner while live.
    owner: Mapped[str | None] = mapped_column(Text, nullable=True)
    container_id: Mapped[str | None] = mapped_column(Text, nullable=True)
    input_tokens: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    duration_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # A queued run whose last attempt failed waits (holding no lease) until
    # then for its next one (orchestrator/run/pipeline.py); None otherwise.
    retry_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # The exact ContainerInput JSON the run sent (zlib-compressed) and its hash.
    input_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    input_json: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    # A replay (orchestrator/run/replay.py; revision 0015): the run whose recorded input it
    # ran against another model.  Never a chat run: the sweeper, the recovery and the
    # run slots leave it alone, nothing it says is stored as a message.  NULL for chat runs.
    replay_of: Mapped[str | None] = mapped_column(String(36), nullable=True, index=True)

    # A group's runs by start: its quotas count them (orchestrator/store/usage.py).
    __table_args__ = (Index("idx_runs_chat_created", "chat_jid", "created_at"),)


class ScheduledTaskRow(Base):
    __tablename__ = "scheduled_tasks"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    chat_jid: Mapped[str] = mapped_column(Text, nullable=False, index=True)
    prompt: Mapped[str] = mapped_column(Text, nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)  # cron | interval | once
    spec: Mapped[str] = mapped_column(Text, nullable=False)  # the cron line, seconds, or ISO time
    context_mode: Mapped[str] = mapped_column(String(16), nullable=False)  # group | isolated
    state: Mapped[str] = mapped_column(String(16), nullable=False, index=True)
    next_run_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True, index=True)
    last_run_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    runs: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    # Scheduled by the agent through its tools (revision 0022), not by an operator.
    made_by_agent: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False, server_default=false())


class QuestionRow(Base):
    """A question the agent asked its group (``ask_user``; revision 0023): open -> answered | expired."""

    __tablename__ = "questions"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    chat_jid: Mapped[str] = mapped_column(Text, nullable=False)
    # The run and the tool call that asked: the answer is stored as that call's result.
    run_id: Mapped[str] = mapped_column(String(36), nullable=False)
    tool_use_id: Mapped[str] = mapped_column(Text, nullable=False)
    # The stored message that shows it, and the input its run answered (the answer sits after it).
    message_seq: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reply_to_seq: Mapped[int | None] = mapped_column(Integer, nullable=True)
    question: Mapped[str] = mapped_column(Text, nullable=False)
    options: Mapped[list[str]] = mapped_column(JSON, nullable=False)
    multiple: Mapped[bool] = mapped_column(Boolean, nullable=False)
    allow_other: Mapped[bool] = mapped_column(Boolean, nullable=False)
    # How the answer goes back: "tool_result" (the call's result: the built-in loop),
    # "message" (the next user message: Claude Code, whose call has had its result), or
    # "egress" (the host's question about a host the sandbox tried: its allowlist).
    answer_as: Mapped[str] = mapped_column(String(16), nullable=False)
    # What a question the host asks is about ("egress": {"host", "port"}); NULL for the agent's.
    subject: Mapped[JsonObject | None] = mapped_column(JSON, nullable=True)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    asked_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # {"options": [...], "text": ...}: what was chosen (and the free text, if allowed).
    answer: Mapped[JsonObject | None] = mapped_column(JSON, nullable=True)
    answered_by: Mapped[str | None] = mapped_column(Text, nullable=True)
    answered_by_name: Mapped[str | None] = mapped_column(Text, nullable=True)
    answered_via: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # The stored tool result that closed it (the answer, or why it expired).
    answer_seq: Mapped[int | None] = mapped_column(Integer, nullable=True)
    closed_why: Mapped[str | None] = mapped_column(Text, nullable=True)

    __table_args__ = (
        Index("idx_questions_chat", "chat_jid", "asked_at"),
        # The sweeper's look for open questions past their time.
        Index("idx_questions_due", "state", "expires_at"),
    )


class GroupChannelRow(Base):
    """A channel that shows a group's messages (``orchestrator groups attach``)."""

    __tablename__ = "group_channels"

    chat_jid: Mapped[str] = mapped_column(Text, primary_key=True)
    channel: Mapped[str] = mapped_column(String(64), primary_key=True)
    # Where on that channel (a room, a user id, ...); NULL: the group's chat id.
    address: Mapped[str | None] = mapped_column(Text, nullable=True)
    config: Mapped[JsonObject | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)


# The unfinished states of a delivery, as the partial index's predicate (and
# ``store/deliveries.py`` ``claimable``, which must repeat it in constants to use it).
_UNFINISHED = "state IN ('pending', 'sending')"


class DeliveryRow(Base):
    """One message on one channel: pending -> sending -> sent | failed | cancelled."""

    __tablename__ = "deliveries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    message_seq: Mapped[int] = mapped_column(Integer, nullable=False)
    chat_jid: Mapped[str] = mapped_column(Text, nullable=False)
    channel: Mapped[str] = mapped_column(String(64), nullable=False)
    address: Mapped[str] = mapped_column(Text, nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    # Who is sending it now, and until when the claim holds.
    claimed_by: Mapped[str | None] = mapped_column(Text, nullable=True)
    claimed_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # The channel's own ids of what it posted (a Slack ts, a Telegram message_id per post;
    # the webhook's delivery id), kept for edits and retractions (revision 0024).
    sent_ids: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)

    __table_args__ = (
        UniqueConstraint("message_seq", "channel", name="uq_deliveries_message_channel"),
        Index("idx_deliveries_due", "state", "next_attempt_at"),
        Index("idx_deliveries_line", "chat_jid", "channel", "message_seq"),
        # The unfinished rows of each line alone (revision 0016): ``claimable``'s
        # "no earlier unfinished row" is then one probe, not a read of the line's history.
        Index(
            "idx_deliveries_unfinished",
            "chat_jid",
            "channel",
            "message_seq",
            postgresql_where=text(_UNFINISHED),
            sqlite_where=text(_UNFINISHED),
        ),
    )


class DeliveryChangeRow(Base):
    """An edit, a retraction or a reaction of what a channel shows
    (``orchestrator/store/delivery_changes.py``): pending -> sending -> done | failed |
    cancelled, as deliveries go."""

    __tablename__ = "delivery_changes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # NULL: a reaction on the channel a person's message came from (no delivery of ours).
    delivery_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    chat_jid: Mapped[str] = mapped_column(Text, nullable=False)
    channel: Mapped[str] = mapped_column(String(64), nullable=False)
    message_seq: Mapped[int] = mapped_column(Integer, nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)  # update | retract | react
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    claimed_by: Mapped[str | None] = mapped_column(Text, nullable=True)
    claimed_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    done_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    reaction_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # a react's
    address: Mapped[str | None] = mapped_column(Text, nullable=True)  # where, without a delivery

    __table_args__ = (
        Index("idx_delivery_changes_due", "state", "next_attempt_at"),
        # A change waits for the earlier unfinished ones of its delivery: one probe.
        Index(
            "idx_delivery_changes_unfinished",
            "delivery_id",
            "id",
            postgresql_where=text(_UNFINISHED),
            sqlite_where=text(_UNFINISHED),
        ),
    )


class HostRow(Base):
    """A worker host of the fleet (``orchestrator/store/hosts.py``): who it is and its last heartbeat.

    Every time here is the database's clock (``CURRENT_TIMESTAMP`` in the
    statement that writes it), never the host's.
    """

    __tablename__ = "hosts"

    host_id: Mapped[str] = mapped_column(Text, primary_key=True)
    # The process that holds the row now (pid:nonce): a second process with the same id takes it over.
    instance: Mapped[str] = mapped_column(Text, nullable=False)
    hostname: Mapped[str] = mapped_column(Text, nullable=False)
    # Its machine id and boot id (core/machine.py; revision 0028): hosts that share one
    # share the kernel's mounts.  NULL: written before the column was.
    machine: Mapped[str | None] = mapped_column(Text, nullable=True)
    pid: Mapped[int] = mapped_column(Integer, nullable=False)
    version: Mapped[str] = mapped_column(String(64), nullable=False)
    concurrency: Mapped[int] = mapped_column(Integer, nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False)  # up | draining | stopped
    # Running warm containers of this installation on the host's Docker engine (NULL: could not count).
    warm_containers: Mapped[int | None] = mapped_column(Integer, nullable=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class ProcessLivenessRow(Base):
    """A worker process's liveness token (``orchestrator/store/liveness.py``; revision 0026):
    what any host can test to tell whether that process still runs."""

    __tablename__ = "process_liveness"

    host_id: Mapped[str] = mapped_column(Text, primary_key=True)
    pid: Mapped[int] = mapped_column(Integer, primary_key=True)
    token: Mapped[str] = mapped_column(Text, nullable=False)
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)


class SenderHitRow(Base):
    """A message a person sent through ingest while the sender rate limit is on
    (``orchestrator/store/usage.py``); ``at`` is the database's clock.  A sender's
    rows older than the window are deleted as its new ones are written."""

    __tablename__ = "sender_hits"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    chat_jid: Mapped[str] = mapped_column(Text, nullable=False)
    sender: Mapped[str] = mapped_column(Text, nullable=False)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)

    __table_args__ = (Index("idx_sender_hits_window", "chat_jid", "sender", "at"),)


class VolumeHoldRow(Base):
    """The host that may have a group's volumes (workspace, session folder) loop-mounted
    (``orchestrator/store/volume_holds.py``): one machine at a time, whatever the fleet shares."""

    __tablename__ = "volume_holds"

    folder: Mapped[str] = mapped_column(Text, primary_key=True)
    host_id: Mapped[str] = mapped_column(Text, nullable=False, index=True)
    held_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)


class RunWaitRow(Base):
    """A group whose next run waits for a free slot of ``ORCHESTRATOR_MAX_CONCURRENT_RUNS``
    (``orchestrator/store/slots.py``): since when, and when it last asked (the
    database's clock).  Its rank (a person's message or a scheduled task, main
    group or not) is read from the group's pending messages each time."""

    __tablename__ = "run_waits"

    chat_jid: Mapped[str] = mapped_column(Text, primary_key=True)
    since: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)


class ReplayOutputRow(Base):
    """What a replay run said (``orchestrator/run/replay.py``; revision 0015): its outputs
    as the messages they would have been, zlib-compressed JSON, kept here and never in
    ``messages``, so no view, cursor or channel ever sees them."""

    __tablename__ = "replay_outputs"

    run_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    # The model asked for, as ORCHESTRATOR_MODEL spells it ("openai:<model id>").
    model: Mapped[str] = mapped_column(Text, nullable=False)
    # NULL until the replay ended.
    outputs_json: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    # What the workspace copy left out (symlinks kept as links; FIFOs, sockets, devices skipped).
    copy_report: Mapped[JsonObject | None] = mapped_column(JSON, nullable=True)


class RunDraftRow(Base):
    """A running run's reply as the model writes it (``orchestrator/store/drafts.py``; revision
    0014): one row per run, updated in place (never a row per piece), deleted when the
    reply is stored or the run ends.  ``version`` grows with each write, so a reader sees
    a change without comparing the text."""

    __tablename__ = "run_drafts"

    run_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    chat_jid: Mapped[str] = mapped_column(Text, nullable=False, index=True)
    text: Mapped[str] = mapped_column(Text, nullable=False)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)


class InstallationRow(Base):
    """The installation's own facts, by key (``orchestrator/store/installation.py``)."""

    __tablename__ = "installation"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text, nullable=False)


class FileRow(Base):
    """A file a chat stored (``orchestrator/store/files.py``; revision 0019): one row per
    reference, the bytes once per content under ``<data_dir>/files`` by their SHA-256.
    ``owner_jid`` is the chat that stored the content first, on every row of that content:
    the bytes count against its group's ``ORCHESTRATOR_GROUP_FILES_MAX_BYTES`` alone."""

    __tablename__ = "files"

    # Opaque and unguessable (secrets.token_urlsafe): the id a message's metadata names.
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    chat_jid: Mapped[str] = mapped_column(Text, nullable=False)
    sha256: Mapped[str] = mapped_column(String(64), nullable=False, index=True)
    size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    # Sniffed from the bytes (store/file_types.py: sniff), never the sender's word.
    mime: Mapped[str] = mapped_column(Text, nullable=False)
    # The sender's name made safe (store/file_names.py: safe_name).
    name: Mapped[str] = mapped_column(Text, nullable=False)
    owner_jid: Mapped[str] = mapped_column(Text, nullable=False, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)

    __table_args__ = (Index("idx_files_chat_created", "chat_jid", "created_at"),)


class MessageFileRow(Base):
    """A message naming a file in its FILE envelope (``orchestrator/store/files.py``; revision
    0020), written with the message: a file no live message names is freed after a grace."""

    __tablename__ = "message_files"

    chat_jid: Mapped[str] = mapped_column(Text, primary_key=True)
    message_id: Mapped[str] = mapped_column(Text, primary_key=True)
    file_id: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)


class ReactionRow(Base):
    """An emoji on a message of a chat, put there once by one reactor (the agent: ``bot``;
    ``orchestrator/store/reactions.py``; revision 0025)."""

    __tablename__ = "reactions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    chat_jid: Mapped[str] = mapped_column(Text, nullable=False)
    message_seq: Mapped[int] = mapped_column(Integer, nullable=False)
    emoji: Mapped[str] = mapped_column(String(32), nullable=False)
    sender: Mapped[str] = mapped_column(Text, nullable=False)
    run_id: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)

    __table_args__ = (
        UniqueConstraint("chat_jid", "message_seq", "emoji", "sender", name="uq_reactions_once"),
        Index("idx_reactions_chat", "chat_jid", "id"),
    )
