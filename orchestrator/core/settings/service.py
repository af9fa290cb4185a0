"""The installation's services: stored files and their links, the HTTP API and Flower,
logs, metrics and traces."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal

from msgspec import Meta

from orchestrator.core.errors import SettingsError
from orchestrator.core.settings.env import ENV_PREFIX
from orchestrator.core.settings.section import Section


class FileSettings(Section, kw_only=True):
    """Files people send and agents hand back (orchestrator/store/files.py), and the signed links to them."""

    prefix: ClassVar[str] = "file_"
    unprefixed: ClassVar[frozenset[str]] = frozenset({"group_files_max_bytes", "public_base_url"})

    # Files people send and agents hand back (orchestrator/store/files.py), stored once by
    # content under <data_dir>/files.  The largest one file may be: an upload is counted as
    # it streams in and stopped past it, nothing kept.
    max_bytes: Annotated[int, Meta(ge=1, description="the largest one stored file may be")] = 25 * 1024 * 1024
    # The bytes of all the files a group stored first (a file another group stored before
    # costs nothing more); a file that would take the group past it is refused.
    group_files_max_bytes: Annotated[int, Meta(ge=1, description="bytes of all the files a group stored first")] = (
        1024 * 1024 * 1024
    )
    # How long a stored file no live message names is kept before the sweeper frees it: an
    # upload's message comes after it; a truncated history's files go after this long.
    unreferenced_grace_s: Annotated[float, Meta(ge=0, description="seconds a file no live message names is kept")] = (
        86400.0
    )
    # The address people and other systems reach this installation's API at (e.g.
    # https://orchestrator.example.com): an outbound webhook names a message's files with
    # signed links under it (orchestrator/core/file_links.py), each good this long (a link
    # that says it is good for longer is refused).  The links' key: this one when set (hosts
    # that share no data dir), else one made once under the data dir; never a webhook secret.
    public_base_url: Annotated[
        str, Meta(description="the address people reach this installation's API at (for signed file links)")
    ] = ""
    link_ttl_s: Annotated[float, Meta(gt=0, description="seconds a signed file link is good for")] = 86400.0
    link_key: Annotated[
        str, Meta(description="the key file links are signed with; empty: one made under the data dir")
    ] = ""


class ApiSettings(Section, kw_only=True):
    """The HTTP API, its streams and Flower."""

    prefix: ClassVar[str] = "api_"
    unprefixed: ClassVar[frozenset[str]] = frozenset({"flower_basic_auth", "stream_safety_poll_s", "stream_wakeup"})

    # The API the CLI's ``send`` talks to (e.g. http://10.0.0.5:8000 for a
    # fleet's API).  Empty: the one ``orchestrator up``/``api`` announced in
    # the data dir (orchestrator/http/endpoint.py), else the CLI stores in process.
    url: Annotated[
        str, Meta(description="the API the CLI's send talks to; empty: the one announced in the data dir")
    ] = ""
    host: Annotated[str, Meta(description="the address the API listens on")] = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65535, description="the port the API listens on")] = 8000
    # Bearer token of every /api route (``Authorization: Bearer <token>``).
    # Required when the API listens beyond loopback (it refuses to start
    # without one); optional on loopback, and enforced there too when set.
    token: Annotated[str, Meta(description="the bearer token of every /api route (required beyond loopback)")] = ""
    # ``user:password`` for Flower's page and JSON API (``orchestrator flower``), passed to it
    # through its environment, never its command line.  Required when Flower listens beyond
    # loopback; empty on loopback: no login (the JSON API too, for local scripts).
    flower_basic_auth: Annotated[str, Meta(description="user:password for Flower (required beyond loopback)")] = ""
    # POST /api/messages (and the stream) answer 404 for a chat that is not a
    # registered group, instead of storing a message no agent will ever see.
    require_registered_chat: Annotated[
        bool, Meta(description="whether a message to a chat that is no registered group is refused (404)")
    ] = True
    # The largest request body the API reads (orchestrator/http/guards.py): a larger
    # Content-Length is a 413 before any byte of the body is read, and a chunked body
    # is cut off at it.  1 MiB holds the largest message (100,000 characters of
    # content) with its context items.
    max_request_bytes: Annotated[int, Meta(ge=4096, description="the largest request body the API reads")] = 1024 * 1024
    # Without a token the API serves loopback only, and answers only requests whose
    # Host header names this machine (127.0.0.1, localhost, [::1], with any port):
    # a web page whose name an attacker re-points at 127.0.0.1 (DNS rebinding) must
    # not drive the agent from a browser.  Further names (comma separated) that
    # reach this API on loopback, e.g. one from /etc/hosts.
    allowed_hosts: Annotated[
        str, Meta(description="further Host names that reach the API on loopback (comma separated)")
    ] = ""
    # How a chat's open readers (the API's event streams, `orchestrator chat`) hear that the
    # chat changed (a message stored, a draft written, a run's state): "push" is a wake-up
    # (PostgreSQL LISTEN/NOTIFY; SQLite: an inotify watch of the wake-up files beside the
    # database, orchestrator/store/chat_listener.py), "poll" only the safety poll below:
    # for a PostgreSQL behind a pooler that cannot LISTEN (PgBouncer's transaction mode),
    # and the baseline of bench/stream_push.py.
    stream_wakeup: Annotated[
        Literal["push", "poll"], Meta(description="how a chat's open readers hear of a change: push, or poll")
    ] = "push"
    # How often an open reader looks without being woken: at most what a lost wake-up costs
    # (and, with stream_wakeup=poll, how late a change is seen).  An idle stream's look is
    # three indexed reads: at 2 s, about 1.5 a second (0.2 s before streams were woken).
    stream_safety_poll_s: Annotated[
        float, Meta(gt=0, le=300, description="seconds between an open reader's looks when not woken")
    ] = 2.0
    # How long an API request waits for SQLite's write lock (another process holding
    # it: a worker's long transaction, a backup, a stray sqlite3 shell) before it
    # answers 503 with Retry-After.  Workers wait 60 s (they have no caller waiting);
    # a client should hear "busy, retry" in seconds, not hang for a minute.
    db_wait_s: Annotated[
        float, Meta(gt=0, le=60, description="seconds an API request waits for SQLite's write lock before a 503")
    ] = 5.0

    def __post_init__(self) -> None:
        user, colon, password = self.flower_basic_auth.partition(":")
        if self.flower_basic_auth and not (user and colon and password and "," not in self.flower_basic_auth):
            raise SettingsError(f"{ENV_PREFIX}FLOWER_BASIC_AUTH must be user:password (one pair, both non-empty)")


class TelemetrySettings(Section, kw_only=True):
    """Logs, Prometheus metrics and OpenTelemetry traces."""

    prefix: ClassVar[str] = ""

    log_level: Annotated[str, Meta(description="the log level (DEBUG, INFO, WARNING, ...)")] = "INFO"
    # "text" for people, "json" for log pipelines: one object per line with the
    # chat, run, host and trace it is about (orchestrator/core/logs.py).
    log_format: Annotated[Literal["text", "json"], Meta(description="text for people, json for log pipelines")] = "text"
    # Prometheus metrics (orchestrator/core/metrics.py).  The API serves its own on
    # GET /metrics.  A worker's main process serves those of its pool children on
    # http://<metrics_host>:<metrics_port>/metrics; 0: not served, and the worker's
    # processes count in memory only (nothing written to metrics_dir).  Two workers on
    # one machine (`orchestrator up` runs two) need two ports.
    metrics_port: Annotated[
        int, Meta(ge=0, le=65535, description="the port a worker serves its metrics on; 0: not served")
    ] = 0
    metrics_host: Annotated[str, Meta(description="the address a worker serves its metrics on")] = "127.0.0.1"
    # Where a serving worker's processes keep their counts (prometheus_client's
    # multiprocess mode: a file per process, read by the main process): a folder per
    # worker, <host id>-<pid>, made empty when the worker starts and removed when it
    # stops.  None: <data_dir>/metrics.
    metrics_dir: Annotated[
        Path | None,
        Meta(description="where serving workers keep their processes' counts; empty: the data dir's metrics/"),
    ] = None
    # OpenTelemetry traces (orchestrator/core/tracing.py), set by the standard OTEL_*
    # variables, not ORCHESTRATOR_* ones (read here all the same: _OTEL_VARIABLES):
    # OTEL_TRACES_EXPORTER "none" (the default: nothing of OpenTelemetry is even
    # imported), "console" (one JSON object per span on stderr) or "otlp" (OTLP over
    # HTTP/protobuf, the `otlp` extra), or both comma-separated; OTEL_SERVICE_NAME;
    # OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces,
    # else the SDK's default (http://localhost:4318/v1/traces).
    otel_traces_exporter: Annotated[
        str, Meta(description="OTEL_TRACES_EXPORTER: none, console, otlp or console,otlp")
    ] = "none"
    otel_service_name: Annotated[str, Meta(description="OTEL_SERVICE_NAME: the service's name on its spans")] = (
        "agent-orchestrator"
    )
    otel_exporter_otlp_endpoint: Annotated[
        str, Meta(description="OTEL_EXPORTER_OTLP_ENDPOINT: the collector's root (+ /v1/traces)")
    ] = ""
    otel_exporter_otlp_traces_endpoint: Annotated[
        str, Meta(description="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: the collector's traces URL")
    ] = ""

    def __post_init__(self) -> None:
        if self.metrics_dir is not None:
            self.metrics_dir = Path(self.metrics_dir).expanduser().resolve()
        unknown = set(self.trace_exporters) - {"console", "otlp"}
        if unknown:
            raise SettingsError(
                f"OTEL_TRACES_EXPORTER={self.otel_traces_exporter!r}: "
                f"use none, console, otlp or console,otlp (not {', '.join(sorted(unknown))})"
            )

    @property
    def trace_exporters(self) -> list[str]:
        """The span exporters OTEL_TRACES_EXPORTER names (``none``: none; empty: none)."""
        names = [n.strip().lower() for n in self.otel_traces_exporter.split(",")]
        return [n for n in dict.fromkeys(names) if n and n != "none"]
