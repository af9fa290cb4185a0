"""The one settings object: the only place that reads the environment.

Every value comes from an ``ORCHESTRATOR_*`` environment variable or an
optional ``.env`` file in the working directory.  Everything the program
writes lives under ``data_dir`` unless configured otherwise, so one folder is
the whole state of an embedded install.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from orchestrator.core.sizes import parse_quota


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="ORCHESTRATOR_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    data_dir: Path = Path("./data")
    # This worker's name in the fleet (the hosts table, run owners, placement).
    # Empty: the machine's hostname.
    host_id: str = ""
    # Empty means: the embedded default under data_dir (SQLite / filesystem://).
    database_url: str = ""
    broker_url: str = ""
    # Polling interval of kombu's virtual transports (filesystem, SQL); every
    # polled hop costs half of it on average, so keep it short.
    broker_polling_interval: float = Field(default=0.05, gt=0)

    # "offline" (no network, deterministic), "anthropic:<model id>" or
    # "openai:<model id>" (any OpenAI-compatible Chat Completions server).
    model: str = "offline"
    anthropic_base_url: str = "https://api.anthropic.com"
    anthropic_api_key: str = ""
    # The OpenAI-compatible server's root (a trailing /v1 is accepted): a
    # local Ollama by default; vLLM, llama.cpp's server or
    # https://api.openai.com work the same.  The key is optional (sent as a
    # bearer token by the gateway; local servers need none).
    openai_base_url: str = "http://127.0.0.1:11434"
    openai_api_key: str = ""
    max_tokens: int = Field(default=1024, ge=1)
    max_turns: int = Field(default=8, ge=1)
    # Tokens (input + output) one run may spend through the model gateway; 0: no limit.
    run_token_budget: int = Field(default=0, ge=0)
    # The model gateway's limits on what a sandbox can make the host spend
    # (orchestrator/sandbox/gateway.py).  The largest request body it reads; a larger
    # Content-Length is refused (413) before any byte of the body is read.
    gateway_max_request_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    # Connections served at once (one host thread each); more are closed at once.
    gateway_max_connections: int = Field(default=16, ge=1)
    # How long a connection may send nothing (request line, headers, body, the
    # wait for a keep-alive's next request) before the gateway closes it.
    gateway_read_timeout_s: float = Field(default=30.0, gt=0)

    assistant_name: str = "Andy"
    # Extra names that also trigger the agent (comma separated).
    trigger_aliases: str = ""
    # How many earlier messages a run shows the model besides the new ones.
    context_messages: int = Field(default=50, ge=0)
    # Context blocks of user messages (files, URLs) are expanded when a run is
    # assembled; these bound what one block may add to the model's input.
    context_file_max_bytes: int = Field(default=200_000, ge=1)
    context_url_max_bytes: int = Field(default=200_000, ge=1)
    context_url_timeout_s: float = Field(default=5.0, gt=0)
    # URL blocks are fetched by the host: by default never from loopback or
    # private addresses, so a chat message cannot probe the host's network.
    context_url_allow_private: bool = False
    # Lease on a group while a run holds it; renewed by a heartbeat.
    lease_ttl_s: float = Field(default=60.0, gt=1)
    # Failed runs that stored no output are retried with backoff and jitter.
    max_attempts: int = Field(default=3, ge=1)
    retry_base_s: float = Field(default=2.0, ge=0)
    retry_max_s: float = Field(default=60.0, ge=0)
    # Deliveries of stored messages to channels (orchestrator/store/deliveries.py):
    # a failed send is retried after base·2ⁿ⁻¹ seconds (capped, with jitter)
    # up to max_attempts; a send that outlives claim_s is presumed cut off
    # and is never retried (never sent twice).
    delivery_max_attempts: int = Field(default=6, ge=1)
    delivery_retry_base_s: float = Field(default=1.0, ge=0)
    delivery_retry_max_s: float = Field(default=300.0, ge=0)
    delivery_claim_s: float = Field(default=120.0, gt=0)
    # Extra channels: comma-separated "module:factory", each called with the
    # settings and returning a channel or a list of them (orchestrator/channels/registry.py).
    channel_plugins: str = ""
    # Shared secret of the webhooks (HMAC-SHA256): inbound ones must be
    # signed with it (empty: inbound webhooks are off); outbound ones are.
    webhook_secret: str = ""
    webhook_timeout_s: float = Field(default=10.0, gt=0)
    # Telegram (orchestrator/channels/telegram.py, the optional "telegram" extra):
    # the bot's token from @BotFather, and the Bot API's root (tests point
    # it at a fake).
    telegram_bot_token: str = ""
    telegram_api_base: str = "https://api.telegram.org"
    # How often Celery beat runs the sweeper.
    sweep_interval_s: float = Field(default=15.0, gt=0)
    # How often Celery beat looks for scheduled tasks that are due.
    schedule_tick_s: float = Field(default=10.0, gt=0)

    # Agent image and how it is built when missing.
    agent_image: str = "orchestrator-agent:latest"
    base_image: str = "orchestrator-base:bookworm-git"
    docker_url: str = ""  # empty: docker's own environment defaults

    # Sandbox limits of the run container.
    container_memory: str = "512m"
    container_cpus: float = Field(default=1.0, gt=0)
    container_pids: int = Field(default=256, ge=16)
    run_timeout_s: float = Field(default=300.0, gt=0)
    # > 0: a group's container stays up this long after a run and takes the
    # next one without a cold start (orchestrator/sandbox/warm.py); 0: one per run.
    warm_idle_s: float = Field(default=0.0, ge=0)
    bash_timeout_s: float = Field(default=60.0, gt=0)
    # Bounds on what one run's output may cost the host (orchestrator/sandbox/bounded_io.py):
    # the agent can write anything to the runner's stdout and stderr.  A run
    # that breaks one is stopped and fails, not retried, with a host message.
    # The longest output line (one event) the host reads; a longer one is never buffered.
    max_event_line_bytes: int = Field(default=1024 * 1024, ge=4096)
    # Output lines one run may write (events, and lines that are not events).
    max_run_events: int = Field(default=2000, ge=10)
    # Bytes of messages (content + metadata) one run may store, summed.
    max_run_stored_bytes: int = Field(default=16 * 1024 * 1024, ge=65536)
    # One tool result's stored output (and its envelope): longer output is cut
    # with a visible marker, the original size kept in the metadata.
    max_tool_result_bytes: int = Field(default=256 * 1024, ge=1024)
    # Host folders a group may mount (orchestrator/sandbox/mounts.py).  Kept outside
    # the project and the data dir, so no agent can ever edit it.
    mount_allowlist: Path = Path("~/.config/orchestrator/mount-allowlist.json")
    # Disk one group's workspace may take (orchestrator/sandbox/quota.py): a size like
    # "2g"; "0": no quota; "auto": 2g where the host can enforce it hard
    # (loop-mounted volumes: root with loop devices), none where only a check
    # before each run could (that walk costs every run; set a size to have
    # it).  A group's container_config may set its own.
    workspace_quota: str = "auto"
    # auto: loop-mounted ext4 volumes when the host runs as root with loop
    # devices, else a usage check before each run; "volume" or "checked" force one.
    workspace_quota_mode: Literal["auto", "volume", "checked"] = "auto"

    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8000, ge=0, le=65535)
    # Bearer token of every /api route (``Authorization: Bearer <token>``).
    # Required when the API listens beyond loopback (it refuses to start
    # without one); optional on loopback, and enforced there too when set.
    api_token: str = ""
    # POST /api/messages (and the stream) answer 404 for a chat that is not a
    # registered group, instead of storing a message no agent will ever see.
    api_require_registered_chat: bool = True
    # How often a chat's event stream (SSE) looks for new messages and runs.
    api_stream_poll_s: float = Field(default=0.2, gt=0, le=5)

    log_level: str = "INFO"

    @field_validator("openai_base_url")
    @classmethod
    def _server_root(cls, v: str) -> str:
        # The gateway appends the request's path (/v1/chat/completions).
        root = v.strip().rstrip("/")
        return root.removesuffix("/v1")

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        # Workers, the API and containers' bind mounts all need the same
        # absolute path, whatever directory each process starts in.
        return v.expanduser().resolve()

    @field_validator("mount_allowlist")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        # Symlinks are resolved when the file is read, not here.
        return v.expanduser().absolute()

    @field_validator("workspace_quota")
    @classmethod
    def _quota(cls, v: str) -> str:
        v = v.strip().lower()
        if v != "auto":
            parse_quota(v)
        return v

    # -- derived values ------------------------------------------------------

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'orchestrator.db'}"

    @property
    def effective_broker_url(self) -> str:
        # An explicit host keeps kombu from warning that none was supplied.
        return self.broker_url or "filesystem://localhost/"

    @property
    def effective_host_id(self) -> str:
        """This worker's fleet name: ``host_id``, or the machine's hostname."""
        import socket

        return self.host_id or socket.gethostname()

    @property
    def install_id(self) -> str:
        """A short stable id of this installation (its database), for container labels."""
        return hashlib.sha256(self.effective_database_url.encode()).hexdigest()[:12]

    @property
    def trigger_names(self) -> list[str]:
        names = [self.assistant_name, *self.trigger_aliases.split(",")]
        return [n.strip() for n in names if n.strip()]

    @property
    def broker_dir(self) -> Path:
        return self.data_dir / "broker"

    @property
    def groups_dir(self) -> Path:
        return self.data_dir / "groups"

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    @property
    def build_dir(self) -> Path:
        return self.data_dir / "build"

    def ensure_dirs(self) -> None:
        for d in (self.data_dir, self.groups_dir, self.runs_dir, self.build_dir):
            d.mkdir(parents=True, exist_ok=True)
        for sub in ("out", "processed", "control"):
            (self.broker_dir / sub).mkdir(parents=True, exist_ok=True)
