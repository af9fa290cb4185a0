"""The exception tree.  Every error the orchestrator raises on purpose is an
``OrchestratorError``, so callers (CLI, API, Celery tasks) catch one root;
every class of the tree is defined here.  Each class with what it means and
(in brackets) the modules that raise it (tests/host/test_errors.py holds the
drawing to the classes)::

    OrchestratorError
    ├── ConfigError            settings that cannot work: an unsupported database URL, an unknown
    │   │                      ORCHESTRATOR_MODEL, the API beyond loopback without a token,
    │   │                      OTEL_TRACES_EXPORTER=otlp without the otlp extra, Flower beyond
    │   │                      loopback without a login, an ORCHESTRATOR_MAIN_GROUP that is not the main group
    │   │                      [store.db, store.groups, run.model_choice, http.api, core.tracing, cli.processes]
    │   ├── SettingsError      an ORCHESTRATOR_* (or OTEL_*) variable that does not convert or is out of bounds;
    │   │                      names the variable (also a ValueError) [core.settings.env,
    │   │                      core.settings.checks, core.settings.provider, core.settings.sandbox,
    │   │                      core.settings.channels, core.settings.service]
    │   ├── DataDirNotShared   a worker's data dir is not the installation's (its marker is missing or
    │   │                      another's) [store.installation]
    │   ├── ContainerConfigError   a group's container_config is invalid; names the field [sandbox.config]
    │   └── ChannelError       an unknown channel, a bad name, address or plugin, a send that failed,
    │       │                  a file a channel's message shares that is not taken (also a ValueError)
    │       │                  [channels.registry, channels.webhook, channels.telegram, channels.slack,
    │       │                  channels.slack_socket, channels.slack_files, run.outbound, run.fs_transport,
    │       │                  store.attachments, store.deliveries]
    │       └── ChannelRateLimited   the platform refused a send for now (HTTP 429) and said when to
    │                          come back; carries retry_after_s, which the deliverer waits out
    │                          [channels.telegram, channels.slack, channels.slack_files]
    ├── StoreError             the store refused or lacks something: a file's content missing or
    │   │                      cut short, no free name [store.files, store.file_names, sandbox.inbox]
    │   ├── NotFound           no such thing in the store (also a LookupError; HTTP 404): a run or a
    │   │   │                  scheduled task by id or prefix, its recorded input, a chat the API
    │   │   │                  requires registered [store.runs, store.schedules, run.assembly, http.routes.runs,
    │   │   │                  http.routes.messages]
    │   │   ├── UnknownGroup   a chat id that is not a registered group
    │   │   │   │              [store.groups, store.history, store.placement, store.attachments,
    │   │   │   │              sandbox.config]
    │   │   │   └── UnregisteredChatsFull   a message of a chat that is no registered group, when
    │   │   │                  ORCHESTRATOR_UNREGISTERED_CHATS such chats are kept already: not
    │   │   │                  stored (HTTP 404, as for any unregistered chat) [run.ingest]
    │   │   └── MessageNotFound   no such (message id, chat) in the store [store.message_log, store.history]
    │   ├── Conflict           the change clashes with what is stored: a chat or folder registered
    │   │                      already, a second main group, a task's state that does not allow the
    │   │                      pause, resume or cancel, a question answered or expired already
    │   │                      (HTTP 409) [store.groups, run.schedules, run.questions]
    │   └── DatabaseUnavailable   the database cannot serve for now (a lock held elsewhere past the wait, a
    │                          server restarting or unreachable, a full disk, as store.db.unavailable_reason
    │                          tells); carries retry_after_s (HTTP 503 + Retry-After) [http.errors]
    ├── GroupBusy              a run holds the group; edit/regenerate must wait (HTTP 409) [store.history]
    ├── LeaseLost              another worker took the group over: a run's output is not stored, the
    │                          run is left to the new holder [store.leases]
    ├── InvalidMessage         bad input: a message, an edit, a group, a schedule, an import, a Slack
    │   │                      event (also a ValueError; HTTP 400) [store.message_log, store.groups,
    │   │                      store.history, store.transfer, run.schedules, channels.slack_inbound]
    │   ├── InvalidMessageMetadata   metadata that is no valid envelope or context item; names the
    │   │                      field [model.envelopes, model.context, store.transfer]
    │   ├── BadInput           a request's input a route refuses, or a change of a group's profile,
    │   │                      naming the field (HTTP 400 with ``field``) [http.errors,
    │   │                      http.routes.groups, http.routes.webhooks, run.profile]
    │   └── ChangeRefused      a history change the message's state does not allow: superseded, not a
    │                          person's message to edit, not a reply to regenerate (HTTP 409) [store.history]
    ├── SandboxError           Docker could not start or talk to a container, or the sandbox runtime
    │   │                      cannot be used [sandbox.containers, sandbox.warm.pool, sandbox.warm.making,
    │   │                      sandbox.warm.cleanup, sandbox.standby, sandbox.runtime]
    │   ├── ImageBuildError    the base or agent image could not be built or pulled [sandbox.image]
    │   ├── MountRefused       a workspace, session folder or extra mount the rules refuse; names the
    │   │   │                  reason [sandbox.mounts, sandbox.sessions]
    │   │   └── WorkspaceQuotaError   the workspace (or session folder) is over its quota, or its volume
    │   │                      cannot be set up [sandbox.quota.workspace, sandbox.quota.usage,
    │   │                      sandbox.quota.volume, sandbox.quota.tree_copy, sandbox.quota.groups,
    │   │                      sandbox.quota.scratch]
    │   ├── HostileEntry       an entry of an agent-writable folder the host will not use
    │   │                      (a symlink, FIFO, '..') [sandbox.hostile_fs]
    │   ├── GatewayError       the model gateway's socket cannot be set up safely [sandbox.gateway.server]
    │   ├── VolumeHeldElsewhere   another host holds the group's volumes (mounted on its machine): the
    │   │                      run waits for them [store.volume_holds, run.volume_wait]
    │   └── VolumeMountedElsewhere   another machine's kernel has the group's volume mounted (its
    │                          ext4 multiple-mount protection refused this one): the run waits
    │                          [sandbox.quota.loop]
    ├── NotAllowed             someone the group does not allow: an answer to its question from one
    │                          not among its approvers (HTTP 403) [run.questions]
    ├── BrokerUnavailable      the broker failed moments ago, so a signal is left to the sweeper [run.queue]
    ├── RateLimited            a sender went over ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE; nothing is
    │                          stored; carries retry_after_s (HTTP 429 + Retry-After) [run.ingest]
    ├── FleetFull              ORCHESTRATOR_MAX_CONCURRENT_RUNS runs are unfinished (or better-ranked
    │                          groups wait for the free slots): the run did not start, its group waits
    │                          [store.slots]
    ├── HostUnavailable        a group cannot be placed on a host that is not up and beating (HTTP 409)
    │                          [store.placement]
    ├── ReplayRefused          a replay that cannot be made: no recorded input, a workspace over the
    │   │                      copy's bounds (HTTP 409) [run.replay]
    │   └── ReplayLimited      the group's quota is spent or the fleet's run slots are taken: the replay
    │                          did not start; carries retry_after_s (HTTP 429 + Retry-After)
    │                          [run.replay, store.slots]
    ├── OutputLimitExceeded    a run's output broke a host bound; the pipeline stops the run
    │                          [sandbox.bounded_io]
    ├── FileTooLarge           a file over ORCHESTRATOR_FILE_MAX_BYTES, or one that would take its group
    │                          past ORCHESTRATOR_GROUP_FILES_MAX_BYTES: nothing stored; carries the
    │                          limit and the setting (HTTP 413 later) [store.files]
    ├── ApiUnreachable         the command line finds no API answering at the endpoint (refused, unknown
    │                          host, no reply in time, not an http(s) URL) [cli.api_client]
    └── ApiRefused             the API answered the command line with an error status; carries status
                               and detail [cli.api_client, cli.send]

The exceptions that are not ``OrchestratorError`` are one module's or one package's own (or,
for ``ContextUnavailable``, two modules' of one room), which turns them into
something else: ``ContextUnavailable`` (defined in run.url_fetch, raised there
and in run.expand, which writes an error note in place of the context item),
``Refusal`` (sandbox.gateway.refusal: an HTTP error answer), ``Refused`` (sandbox.egress.refusals: the
egress proxy's refusal of one request, answered 403, 400 or 502), ``PathRefused``
(sandbox.request_paths: a request target it will not normalise, which the egress proxy
answers 403 and sandbox.egress_credentials reads as a bad setting), ``_WalkStopped``
(sandbox.quota.usage: a partial usage count) and ``VolumeUnavailable``
(sandbox.quota.loop: a ``WorkspaceQuotaError`` or the checked-mode fallback).
"""

from __future__ import annotations

from typing import Any


class OrchestratorError(Exception):
    """Root of every error raised on purpose by the orchestrator."""


class ConfigError(OrchestratorError):
    pass


class SettingsError(ConfigError, ValueError):
    pass


class DataDirNotShared(ConfigError):
    """This process's data dir is not the installation's (the marker is missing or another's)."""


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


class InvalidMessageMetadata(InvalidMessage, ValueError):
    """Metadata that cannot be stored; ``field`` is the offending path (for API error bodies)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class BadInput(InvalidMessage):
    """A request's input a route refuses: ``field`` names it, dotted as the other 400s name
    fields (``container_config.extra_mounts``); ``detail`` is the answer's text as it is."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(detail)
        self.field = field


class NotAllowed(OrchestratorError):
    """Someone the group does not allow to do what they tried (answer its question, when the
    group names its approvers): nothing changed (HTTP 403)."""


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


class BrokerUnavailable(OrchestratorError):
    """The broker refused a signal recently; the sweeper will re-send it."""


class FleetFull(OrchestratorError):
    """The fleet runs its cap (or better-ranked groups wait for the free slots): the run did not start.

    ``wait`` is the group's place in line, an ``orchestrator.store.slots.SlotWait`` (typed
    ``Any``: this floor imports no room; read are its ``chat_jid``, ``lane`` and
    ``position``); ``retry_in``: seconds until the group asks again."""

    def __init__(self, wait: Any, running: int, cap: int, retry_in: float) -> None:
        super().__init__(
            f"{running} of {cap} run slots taken; {wait.chat_jid} waits ({wait.lane}, position {wait.position})"
        )
        self.wait, self.running, self.cap = wait, running, cap
        self.retry_in = retry_in


class HostUnavailable(OrchestratorError):
    """A group cannot be placed on a host that is not up and beating (HTTP 409); ``live``: the
    hosts that take groups, ``alive_window_s``: the beat window they are judged by."""

    def __init__(self, host_id: str, live: list[str], alive_window_s: float) -> None:
        hosts = ", ".join(live) if live else "none"
        super().__init__(
            f"host {host_id!r} does not take groups now (it is not up, or has not beaten within "
            f"{alive_window_s:.0f} s, or is draining); hosts that do: {hosts}"
        )
        self.host_id = host_id
        self.live = live


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


class GatewayError(SandboxError):
    """The gateway's socket could not be set up safely."""


class VolumeHeldElsewhere(SandboxError):
    """Another host holds the group's volumes (mounted on its machine): this attempt cannot mount
    them now; retried, as the holder unmounts once it sees the group moved."""

    def __init__(self, folder: str, holder: str, gone_after_s: float) -> None:
        super().__init__(
            f"the volumes of {folder!r} are held by host {holder!r} (mounted on its machine): it unmounts them "
            f"once it sees the group moved, or they are taken over after it has been gone for "
            f"{gone_after_s:.0f}s (ORCHESTRATOR_DEAD_HOST_S); mounting them here too would corrupt them"
        )
        self.folder, self.holder = folder, holder


class VolumeMountedElsewhere(SandboxError):
    """Another machine's kernel has the group's volume image mounted: ext4's multiple-mount
    protection refused a second mount (``sandbox/mmp.py``).  The run waits until that machine
    lets go (its worker unmounts a volume it no longer holds; a machine that died, by itself)."""

    def __init__(self, folder: str, node: str) -> None:
        super().__init__(
            f"the volume of {folder!r} is mounted on machine {node!r}: mounting it here too would corrupt "
            "it, so its multiple-mount protection refused; it is mounted here once that machine lets go"
        )
        self.folder, self.node = folder, node


class OutputLimitExceeded(OrchestratorError):
    """A run's output broke one of the host's bounds; ``setting`` names the knob."""

    def __init__(self, what: str, limit: int, setting: str) -> None:
        self.what = what
        self.limit = limit
        self.setting = setting
        super().__init__(f"output limit: {what} (ORCHESTRATOR_{setting.upper()}={limit}); the agent was stopped")


class FileTooLarge(OrchestratorError):
    """A file over the per-file limit, or one its group's files have no room left for
    (orchestrator/store/files.py): nothing was stored.  ``limit`` is in bytes, ``setting``
    names the variable that raises it."""

    def __init__(self, what: str, limit: int, setting: str) -> None:
        super().__init__(f"{what}: the limit is {limit} bytes (ORCHESTRATOR_{setting.upper()})")
        self.what = what
        self.limit = limit
        self.setting = setting


class ApiUnreachable(OrchestratorError):
    """Nothing answers at the endpoint (refused, unknown host, timed out before a reply)."""


class ApiRefused(OrchestratorError):
    """The API answered with an error status; ``detail`` is its explanation."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"the API answered {status}: {detail}")
        self.status = status
        self.detail = detail
