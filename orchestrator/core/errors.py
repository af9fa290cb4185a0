"""The exception tree.  Every error the orchestrator raises on purpose is an
``OrchestratorError``, so callers (CLI, API, Celery tasks) catch one root.
Each class with what it means and (in brackets) the modules that raise it;
the classes defined outside this module say where they live::

    OrchestratorError
    ├── ConfigError            settings that cannot work: an unsupported database URL, an unknown
    │   │                      ORCHESTRATOR_MODEL, the API beyond loopback without a token,
    │   │                      OTEL_TRACES_EXPORTER=otlp without the otlp extra
    │   │                      [store.db, run.pipeline, http.api, core.tracing]
    │   ├── SettingsError      an ORCHESTRATOR_* (or OTEL_*) variable that does not convert or is out of bounds;
    │   │                      names the variable (also a ValueError) [core.settings]
    │   ├── DataDirNotShared   a worker's data dir is not the installation's (its marker is missing or
    │   │                      another's) (defined in store.installation) [store.installation]
    │   ├── ContainerConfigError   a group's container_config is invalid; names the field [sandbox.config]
    │   └── ChannelError       an unknown channel, a bad name, address or plugin, a send that failed
    │                          [channels.registry, channels.webhook, channels.telegram, run.outbound,
    │                          store.attachments, store.deliveries]
    ├── StoreError             the database refused or lacks something (a duplicate group, no such
    │   │                      run or task) [store.runs, run.assembly, run.schedules]
    │   ├── NotFound           no such thing in the store (also a LookupError; HTTP 404): a run by id or
    │   │   │                  prefix, a chat the API requires registered [store.runs, http.routes]
    │   │   ├── UnknownGroup   a chat id that is not a registered group
    │   │   │   │              [store.groups, store.attachments, sandbox.config]
    │   │   │   └── UnregisteredChatsFull   a message of a chat that is no registered group, when
    │   │   │                  ORCHESTRATOR_UNREGISTERED_CHATS such chats are kept already: not
    │   │   │                  stored (HTTP 404, as for any unregistered chat) [run.ingest]
    │   │   └── MessageNotFound   no such (message id, chat) in the store [store.message_log, store.history]
    │   ├── Conflict           the change clashes with what is stored: a chat or folder registered
    │   │                      already, a second main group (HTTP 409) [store.groups]
    │   └── DatabaseUnavailable   the database cannot serve for now (a lock held elsewhere past the wait, a
    │                          server restarting or unreachable, a full disk); carries retry_after_s
    │                          (HTTP 503 + Retry-After) [http.errors, from store.db.unavailable_reason]
    ├── GroupBusy              a run holds the group; edit/regenerate must wait [store.history]
    ├── LeaseLost              another worker took the group over: a run's output is not stored, the
    │                          run is left to the new holder [store.leases]
    ├── InvalidMessage         bad input: a message, an edit, a group, a schedule, an import
    │   │                      (also a ValueError) [store.message_log, store.groups, store.history,
    │   │                      store.transfer, run.schedules]
    │   ├── InvalidMessageMetadata   metadata that is no valid envelope or context item; names the
    │   │                      field (defined in model.envelopes) [model.envelopes, model.context,
    │   │                      store.transfer]
    │   ├── BadInput           a request's input a route refuses, naming the field (HTTP 400 with
    │   │                      ``field``) (defined in http.errors) [http.routes]
    │   └── ChangeRefused      a history change the message's state does not allow: superseded, not a
    │                          person's message to edit, not a reply to regenerate (HTTP 409) [store.history]
    ├── SandboxError           Docker could not start or talk to a container [sandbox.containers, sandbox.warm]
    │   ├── ImageBuildError    the base or agent image could not be built or pulled [sandbox.image]
    │   ├── MountRefused       a workspace or extra mount the rules refuse; names the reason [sandbox.mounts]
    │   │   └── WorkspaceQuotaError   the workspace (or session folder) is over its quota, or its volume
    │   │                      cannot be set up [sandbox.quota]
    │   ├── HostileEntry       an entry of an agent-writable folder the host will not use
    │   │                      (a symlink, FIFO, '..') [sandbox.hostile_fs]
    │   └── GatewayError       the model gateway's socket cannot be set up safely
    │                          (defined in sandbox.gateway) [sandbox.gateway]
    ├── BrokerUnavailable      the broker failed moments ago, so a signal is left to the sweeper
    │                          (defined in run.queue) [run.queue]
    ├── RateLimited            a sender went over ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE; nothing is
    │                          stored; carries retry_after_s (HTTP 429 + Retry-After) [run.ingest]
    ├── FleetFull              ORCHESTRATOR_MAX_CONCURRENT_RUNS runs are unfinished (or better-ranked
    │                          groups wait for the free slots): the run did not start, its group waits
    │                          (defined in store.slots) [store.slots]
    ├── HostUnavailable        a group cannot be placed on a host that is not up and beating (HTTP 409)
    │                          (defined in store.placement) [store.placement]
    ├── ReplayRefused          a replay that cannot be made: no recorded input, a workspace over the
    │   │                      copy's bounds (HTTP 409) [run.replay]
    │   └── ReplayLimited      the group's quota is spent or the fleet's run slots are taken: the replay
    │                          did not start; carries retry_after_s (HTTP 429 + Retry-After)
    │                          [run.replay, store.slots]
    ├── FileTooLarge           a file over ORCHESTRATOR_FILE_MAX_BYTES, or one that would take its group
    │                          past ORCHESTRATOR_GROUP_FILES_MAX_BYTES: nothing stored; carries the
    │                          limit and the setting (HTTP 413 later) [store.files]
    └── OutputLimitExceeded    a run's output broke a host bound; the pipeline stops the run
                               (defined in sandbox.bounded_io) [sandbox.bounded_io]

The exceptions that are not ``OrchestratorError`` are one module's own, which
turns them into something else: ``ContextUnavailable`` (run.expand: an error
note in place of the context item), ``_Refusal`` (sandbox.gateway: an HTTP
error answer), ``_WalkStopped`` (sandbox.quota: a partial usage count) and
``VolumeUnavailable`` (sandbox.quota: a ``WorkspaceQuotaError`` or the
checked-mode fallback).
"""

from __future__ import annotations


class OrchestratorError(Exception):
    """Root of every error raised on purpose by the orchestrator."""


class ConfigError(OrchestratorError):
    pass


class SettingsError(ConfigError, ValueError):
    pass


class ContainerConfigError(ConfigError, ValueError):
    pass


class ChannelError(ConfigError, ValueError):
    pass


class ChannelRateLimited(ChannelError):
    """A channel's platform refused a send for now (HTTP 429) and said when to come back:
    ``retry_after_s`` seconds.  The deliverer waits at least that long before the next
    attempt (orchestrator/run/outbound.py), so the platform's limit is honoured."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class StoreError(OrchestratorError):
    pass


class NotFound(StoreError, LookupError):
    """The store holds no such thing (a run by its id or a unique prefix, say); the message
    names what was looked for.  The kinds with a class of their own (``UnknownGroup``,
    ``MessageNotFound``) are under it: the API answers 404 for every one."""


class Conflict(StoreError):
    """A change the stored state does not allow: a chat or folder registered already, a
    second main group (orchestrator.store.groups); nothing changed."""


class UnknownGroup(NotFound):
    def __init__(self, chat_jid: str) -> None:
        super().__init__(f"no registered group for chat {chat_jid!r}")
        self.chat_jid = chat_jid


class UnregisteredChatsFull(UnknownGroup):
    """A message of a chat that is no registered group, and ``limit`` such chats are kept already
    (ORCHESTRATOR_UNREGISTERED_CHATS; orchestrator.run.ingest): nothing was stored."""

    def __init__(self, chat_jid: str, limit: int) -> None:
        super().__init__(chat_jid)
        self.args = (
            f"no registered group for chat {chat_jid!r}, and {limit} unregistered chats are kept "
            "already (ORCHESTRATOR_UNREGISTERED_CHATS): the message was not stored; register the "
            "chat as a group to take its messages",
        )
        self.limit = limit


class MessageNotFound(NotFound):
    def __init__(self, chat_jid: str, message_id: str) -> None:
        super().__init__(f"no message {message_id!r} in chat {chat_jid!r}")


class DatabaseUnavailable(StoreError):
    """The database cannot serve for now and the caller should come back (``retry_after_s``,
    whole seconds); nothing of the failed request was stored.  ``reason`` is for people and
    names no address, user or path of the database."""

    def __init__(self, reason: str, retry_after_s: int) -> None:
        super().__init__(
            f"the database is unavailable for now: {reason}; nothing was stored, try again in {retry_after_s} s"
        )
        self.reason = reason
        self.retry_after_s = retry_after_s


class GroupBusy(OrchestratorError):
    pass


class LeaseLost(OrchestratorError):
    """Another worker holds the group's lease now: this one stores nothing more for it."""


class InvalidMessage(OrchestratorError, ValueError):
    pass


class ChangeRefused(InvalidMessage):
    """A well-formed edit, regenerate or truncate that the message's current state does not
    allow (a conflict with the history, not bad input: the API answers 409)."""


class RateLimited(OrchestratorError):
    """A sender sent more messages in the last minute than the setting allows (orchestrator.run.ingest);
    the message is not stored.  ``retry_after_s``: whole seconds until one more would be taken."""

    def __init__(self, sender: str, limit: int, retry_after_s: int) -> None:
        super().__init__(
            f"slow down: {sender!r} sent {limit} messages in the last minute; try again in {retry_after_s} s"
        )
        self.sender = sender
        self.limit = limit
        self.retry_after_s = retry_after_s


class ReplayRefused(OrchestratorError):
    """A replay that cannot be made (orchestrator/run/replay.py): no recorded input, a
    workspace over the copy's bounds; nothing ran."""


class ReplayLimited(ReplayRefused):
    """A replay the group's quotas or the fleet's run cap leave no room for now: a replay is
    spent on the group's behalf and takes a run slot like any run, behind every chat that
    waits for one (orchestrator/run/replay.py, store/slots.py); nothing ran."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SandboxError(OrchestratorError):
    pass


class ImageBuildError(SandboxError):
    pass


class MountRefused(SandboxError):
    """A mount the allowlist or the built-in rules do not allow; refused before any container starts."""


class WorkspaceQuotaError(MountRefused):
    """The workspace is over its quota (checked mode) or its volume cannot be made or mounted
    (orchestrator.sandbox.quota); like every refused mount, the run fails at once, without retries."""


class HostileEntry(SandboxError):
    """An entry below an agent-writable folder that the host refuses to touch."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class FileTooLarge(OrchestratorError):
    """A file over the per-file limit, or one its group's files have no room left for
    (orchestrator/store/files.py): nothing was stored.  ``limit`` is in bytes, ``setting``
    names the variable that raises it."""

    def __init__(self, what: str, limit: int, setting: str) -> None:
        super().__init__(f"{what}: the limit is {limit} bytes (ORCHESTRATOR_{setting.upper()})")
        self.what = what
        self.limit = limit
        self.setting = setting
