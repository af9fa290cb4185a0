"""The exception tree.  Every error the orchestrator raises on purpose is an
``OrchestratorError``, so callers (CLI, API, Celery tasks) catch one root::

    OrchestratorError
    ├── ConfigError            settings that cannot work (bad URL, missing tool)
    │   ├── ContainerConfigError   a group's container_config is invalid (names the field)
    │   └── ChannelError       an unknown channel, a bad name, address or plugin
    ├── StoreError             the database refused or lost something
    │   ├── UnknownGroup       a chat id that is not a registered group
    │   └── MessageNotFound    no such (message id, chat) in the store
    ├── GroupBusy              a run holds the group (edit/regenerate must wait)
    ├── InvalidMessage         bad input to ingest (also a ValueError)
    │   └── InvalidMessageMetadata   (orchestrator.model.envelopes; names the field)
    ├── SandboxError           Docker could not build, start or talk to a container
    │   ├── ImageBuildError
    │   ├── MountRefused       a workspace or extra mount the rules refuse (names the reason)
    │   │   └── WorkspaceQuotaError   the workspace is over its quota, or its volume cannot be set up
    │   └── HostileEntry       an entry of an agent-writable folder the host will not use
    │                          (a symlink, FIFO, '..'; orchestrator.sandbox.hostile_fs)
    └── RunError               an agent run ended badly
        ├── RunTimeout
        ├── AgentFailed        the container reported an error or exited non-zero
        └── OutputLimitExceeded   (orchestrator.sandbox.bounded_io; a run's output broke a host bound)
"""

from __future__ import annotations


class OrchestratorError(Exception):
    """Root of every error raised on purpose by the orchestrator."""


class ConfigError(OrchestratorError):
    pass


class ContainerConfigError(ConfigError, ValueError):
    pass


class ChannelError(ConfigError, ValueError):
    pass


class StoreError(OrchestratorError):
    pass


class UnknownGroup(StoreError, LookupError):
    def __init__(self, chat_jid: str) -> None:
        super().__init__(f"no registered group for chat {chat_jid!r}")
        self.chat_jid = chat_jid


class MessageNotFound(StoreError, LookupError):
    def __init__(self, chat_jid: str, message_id: str) -> None:
        super().__init__(f"no message {message_id!r} in chat {chat_jid!r}")


class GroupBusy(OrchestratorError):
    pass


class InvalidMessage(OrchestratorError, ValueError):
    pass


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


class RunError(OrchestratorError):
    pass


class RunTimeout(RunError):
    pass


class AgentFailed(RunError):
    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable
