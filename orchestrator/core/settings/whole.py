"""``Settings``: the installation's own fields (the data dir, the database, the broker, the
assistant's names), a section per room, and what spans them: loading, replacing, the
secrets, the paths under the data dir."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from orchestrator.core.private_dirs import private_dir
from orchestrator.core.settings.channels import DeliverySettings, SlackSettings, TelegramSettings, WebhookSettings
from orchestrator.core.settings.checks import check_settings
from orchestrator.core.settings.env import EnvIndex, read_settings
from orchestrator.core.settings.fleet import FleetSettings
from orchestrator.core.settings.provider import GatewaySettings, ProviderSettings
from orchestrator.core.settings.runs import ContextSettings, QuotaSettings, RunSettings
from orchestrator.core.settings.sandbox import EgressSettings, SandboxSettings
from orchestrator.core.settings.secrets import masked, secret_values
from orchestrator.core.settings.service import ApiSettings, FileSettings, TelemetrySettings


class Settings(msgspec.Struct, kw_only=True):
    data_dir: Annotated[
        Path,
        Meta(
            description="where everything the program writes lives (the embedded database, broker, groups, runs, files)"
        ),
    ] = Path("./data")
    # Empty means: the embedded default under data_dir (SQLite / filesystem://).
    database_url: Annotated[
        str, Meta(description="the database (PostgreSQL for a fleet); empty: SQLite under the data dir")
    ] = ""
    broker_url: Annotated[
        str, Meta(description="Celery's broker (Redis for a fleet); empty: the filesystem:// broker under the data dir")
    ] = ""
    # Polling interval of kombu's virtual transports (filesystem, SQL); every
    # polled hop costs half of it on average, so keep it short.
    broker_polling_interval: Annotated[
        float, Meta(gt=0, description="seconds between looks of kombu's virtual transports (filesystem, SQL)")
    ] = 0.05
    # How an idle worker on the filesystem:// broker hears of a message:
    # "inotify" wakes it when the message file appears (no polling delay, an
    # idle worker near 0 % CPU; orchestrator/run/fs_transport.py), "poll"
    # looks every broker_polling_interval as kombu does (the benchmark's
    # baseline; also what happens by itself where inotify is unavailable).
    broker_wakeup: Annotated[
        Literal["inotify", "poll"],
        Meta(description="how an idle worker on filesystem:// hears of a message: inotify, or poll"),
    ] = "inotify"
    assistant_name: Annotated[str, Meta(description='the agent\'s name: what it signs with and what "@Name" wakes')] = (
        "Andy"
    )
    # The main group's chat id (it answers every message and may post to other
    # chats): made on start by `up`, `api` and `worker` when missing, so a fleet
    # started by compose has one.  Empty: `up` makes "main@local".
    main_group: Annotated[
        str, Meta(description="the main group's chat id, made on start when missing (empty: `up` makes main@local)")
    ] = ""
    # Extra names that also trigger the agent (comma separated), besides assistant_name:
    # "@Name" at the start of a message wakes a group that requires the trigger.  A group
    # with trigger names of its own (`orchestrator groups set JID --trigger-name NAME`)
    # answers to those instead of these two (and to its own assistant name).
    trigger_aliases: Annotated[
        str, Meta(description="further names that wake a group that requires the trigger (comma separated)")
    ] = ""
    # Extra channels: comma-separated "module:factory", each called with the
    # settings and returning a channel or a list of them (orchestrator/channels/registry.py).
    channel_plugins: Annotated[str, Meta(description="extra channels, comma-separated module:factory")] = ""

    # The rooms' sections (each reads the variables of its flat names: section.py).
    provider: ProviderSettings = msgspec.field(default_factory=ProviderSettings)
    gateway: GatewaySettings = msgspec.field(default_factory=GatewaySettings)
    sandbox: SandboxSettings = msgspec.field(default_factory=SandboxSettings)
    egress: EgressSettings = msgspec.field(default_factory=EgressSettings)
    runs: RunSettings = msgspec.field(default_factory=RunSettings)
    context: ContextSettings = msgspec.field(default_factory=ContextSettings)
    quotas: QuotaSettings = msgspec.field(default_factory=QuotaSettings)
    fleet: FleetSettings = msgspec.field(default_factory=FleetSettings)
    delivery: DeliverySettings = msgspec.field(default_factory=DeliverySettings)
    webhook: WebhookSettings = msgspec.field(default_factory=WebhookSettings)
    telegram: TelegramSettings = msgspec.field(default_factory=TelegramSettings)
    slack: SlackSettings = msgspec.field(default_factory=SlackSettings)
    files: FileSettings = msgspec.field(default_factory=FileSettings)
    api: ApiSettings = msgspec.field(default_factory=ApiSettings)
    telemetry: TelemetrySettings = msgspec.field(default_factory=TelemetrySettings)

    def __post_init__(self) -> None:
        # Runs for Settings made in code and for loaded ones alike (each section's own
        # __post_init__ has run before).  Workers, the API and containers' bind mounts all
        # need the same absolute path, whatever directory each process starts in.
        self.data_dir = Path(self.data_dir).expanduser().resolve()
        self.main_group = self.main_group.strip()
        check_settings(self)

    @classmethod
    def load(
        cls, *, environ: Mapping[str, str] | None = None, env_file: str | Path | None = ".env", **values: Any
    ) -> Settings:
        """The settings from ``ORCHESTRATOR_*`` variables, converted and checked.

        Later sources win: the ``.env`` file (None: none), then ``environ``
        (default: the process environment), then ``values`` given in code, by flat
        name (``gateway_max_connections=4``) or a whole section (``gateway=...``).
        Raises :class:`SettingsError` naming the variable and what is wrong.
        """
        return read_settings(cls, ENV_INDEX, environ=environ, env_file=env_file, values=values)

    def __repr__(self) -> str:
        # Settings end up in tracebacks, debug prints and error reports: the secrets never do.
        shown = (f"{f.name}={masked(f.name, getattr(self, f.name))!r}" for f in msgspec.structs.fields(self))
        return f"Settings({', '.join(shown)})"

    def value_of(self, flat: str) -> Any:
        """A setting's value by its flat name (``gateway_max_connections``)."""
        place = ENV_INDEX.places[flat]
        return getattr(self if place.section is None else getattr(self, place.section), place.field)

    def secrets(self) -> list[str]:
        """The secret values set (tokens, keys, URL passwords): what no log line, error,
        export or answer may show (orchestrator/core/logs.py removes them from log lines)."""
        return secret_values(self.value_of)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` (as given, not converted; by flat name or whole sections),
        re-normalized."""
        nested = ENV_INDEX.nest(changes)
        for name, fields in nested.items():
            if name in ENV_INDEX.sections and isinstance(fields, dict):
                nested[name] = msgspec.structs.replace(getattr(self, name), **fields)
        return msgspec.structs.replace(self, **nested)

    # -- derived values ------------------------------------------------------

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'orchestrator.db'}"

    @property
    def effective_broker_url(self) -> str:
        # An explicit host keeps kombu from warning that none was supplied.
        return self.broker_url or "filesystem://localhost/"

    @property
    def install_id(self) -> str:
        """A short stable id of this installation (its database), for container labels:
        ``fleet.installation_id`` when set, else a hash of the database's URL."""
        return self.fleet.installation_id or hashlib.sha256(self.effective_database_url.encode()).hexdigest()[:12]

    @property
    def trigger_names(self) -> list[str]:
        names = [self.assistant_name, *self.trigger_aliases.split(",")]
        return [n.strip() for n in names if n.strip()]

    @property
    def own_ports(self) -> frozenset[int]:
        """The ports of this installation's own services (API, metrics, database, broker): never
        reachable through the egress proxy, whatever a resolve entry says."""
        ports = {self.api.port, self.telemetry.metrics_port, 5432, 6379}
        for url in (self.database_url, self.broker_url):
            port = urlsplit(url).port if url else None
            if port:
                ports.add(port)
        return frozenset(p for p in ports if p)

    @property
    def effective_metrics_dir(self) -> Path:
        """Where serving workers keep their metrics files: ``telemetry.metrics_dir`` or ``<data_dir>/metrics``."""
        return self.telemetry.metrics_dir or self.data_dir / "metrics"

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
    def sessions_dir(self) -> Path:
        return self.data_dir / "sessions"

    @property
    def files_dir(self) -> Path:
        """Where stored files live, once each by content (orchestrator/store/files.py)."""
        return self.data_dir / "files"

    @property
    def build_dir(self) -> Path:
        return self.data_dir / "build"

    def ensure_dirs(self) -> None:
        """The data dir's folders; the data dir, ``runs/`` and ``sessions/`` this user's alone
        (:func:`private_dir`), made so or tightened if an older version made them under a looser umask."""
        for d in (self.data_dir, self.runs_dir, self.sessions_dir):
            private_dir(d)
        for d in (self.groups_dir, self.build_dir):
            d.mkdir(parents=True, exist_ok=True)
        for sub in ("out", "processed", "control"):
            (self.broker_dir / sub).mkdir(parents=True, exist_ok=True)


# Every flat name's place (env.py), for load, replace and value_of.
ENV_INDEX = EnvIndex(Settings)
