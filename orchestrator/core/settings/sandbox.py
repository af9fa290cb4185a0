"""The agent's container and its way out: the sandbox's image, runtime, limits, warm
containers and disk quotas; the egress proxy's pins, credentials and bounds."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal

from msgspec import Meta

from orchestrator.core.errors import SettingsError
from orchestrator.core.settings.env import ENV_PREFIX
from orchestrator.core.settings.section import Section
from orchestrator.core.sizes import parse_quota


class SandboxSettings(Section, kw_only=True):
    """The agent's container: its image, runtime, limits, warm and standby containers, mounts and disk quotas."""

    prefix: ClassVar[str] = "sandbox_"
    unprefixed: ClassVar[frozenset[str]] = frozenset(
        {
            "agent_image",
            "base_image",
            "container_cpus",
            "container_memory",
            "container_pids",
            "docker_url",
            "mount_allowlist",
            "session_quota",
            "standby",
            "warm_idle_s",
            "warm_max",
            "workspace_quota",
            "workspace_quota_mode",
        }
    )

    # The sandbox fences itself (container/agent_runner/fence.py): the worker beats on
    # the run's stream every sandbox_fence_s / 4 seconds, and a runner whose stream ends
    # (the worker died) or stays silent this long (frozen, cut off) kills every process
    # of its container and exits.  Well inside the 9 s after which another host takes a
    # dead host's groups (store/hosts.py).  0: no fence (the runner reads its input to
    # the end of stdin, as runners before the fence did).
    fence_s: Annotated[
        float, Meta(ge=0, le=8, description="seconds of silence after which a run's sandbox kills itself; 0: no fence")
    ] = 5.0
    # The OCI runtime of agent containers (sandbox/runtime.py): runc, gVisor's runsc (a
    # probe proves its limits hold before the first container, or the process stops),
    # or auto (runsc when the engine has it and the probe passes, else runc).
    runtime: Annotated[
        Literal["runc", "runsc", "auto"],
        Meta(description="the OCI runtime of agent containers: runc, runsc (gVisor) or auto"),
    ] = "runc"
    # Agent image and how it is built when missing.
    agent_image: Annotated[str, Meta(description="the agent image runs use (built when missing)")] = (
        "orchestrator-agent:latest"
    )
    base_image: Annotated[str, Meta(description="the base image the agent image is built on")] = (
        "orchestrator-base:bookworm-net"
    )
    # Empty: docker's own environment defaults.
    docker_url: Annotated[
        str, Meta(description="the Docker engine's address; empty: docker's own environment defaults")
    ] = ""
    # Sandbox limits of the run container.
    container_memory: Annotated[str, Meta(description="a run container's memory limit")] = "512m"
    container_cpus: Annotated[float, Meta(gt=0, description="a run container's CPUs")] = 1.0
    container_pids: Annotated[int, Meta(ge=16, description="a run container's process limit")] = 256
    # > 0: a group's container stays up this long after a run and takes the
    # next one without a cold start (orchestrator/sandbox/warm/); 0: one per run.
    # On by default: a warm run costs a tenth of a cold one and an idle warm
    # container about 11 MiB; the cap below bounds how many one host keeps.
    warm_idle_s: Annotated[
        float,
        Meta(ge=0, description="seconds a group's container stays up after a run for the next one; 0: one per run"),
    ] = 300.0
    # The most warm containers one host keeps; past it the least recently used
    # idle one is stopped.  0: sized by the host's memory (warm.warm_cap).
    warm_max: Annotated[
        int, Meta(ge=0, description="warm containers one host keeps; 0: sized by the host's memory")
    ] = 0
    # Standby sandboxes a host keeps started ahead for quiet groups' first runs
    # (orchestrator/sandbox/standby.py; needs root and warm sessions); 0: none.
    standby: Annotated[
        int, Meta(ge=0, le=64, description="standby sandboxes a host keeps started ahead for quiet groups; 0: none")
    ] = 2
    # Host folders a group may mount (orchestrator/sandbox/mounts.py).  Kept outside
    # the project and the data dir, so no agent can ever edit it.
    mount_allowlist: Annotated[Path, Meta(description="the file naming host folders groups may mount")] = Path(
        "~/.config/orchestrator/mount-allowlist.json"
    )
    # Disk one group's workspace may take (orchestrator/sandbox/quota/): a size like
    # "2g"; "0": no quota; "auto": 2g where the host can enforce it hard
    # (loop-mounted volumes: root with loop devices), none where only a check
    # before each run could (that walk costs every run; set a size to have
    # it).  A group's container_config may set its own.
    workspace_quota: Annotated[str, Meta(description="disk one group's workspace may take (a size, 0, or auto)")] = (
        "auto"
    )
    # auto: loop-mounted ext4 volumes when the host runs as root with loop
    # devices, else a usage check before each run; "volume" or "checked" force one.
    workspace_quota_mode: Annotated[
        Literal["auto", "volume", "checked"],
        Meta(description="how the quota is kept: auto, volume (loop-mounted ext4) or checked"),
    ] = "auto"
    # Disk one group's session folder (data/sessions/<folder>, where Claude Code keeps
    # its transcripts; mounted read-write at /session) may take: a size like "256m";
    # "0": no quota; "auto": 512m.  Enforced as the workspace's is (a volume of its
    # own, or a check before each run), by the same mode.
    session_quota: Annotated[
        str, Meta(description="disk one group's session folder may take (a size, 0, or auto: 512m)")
    ] = "auto"

    def __post_init__(self) -> None:
        # Symlinks are resolved when the file is read, not here.
        self.mount_allowlist = Path(self.mount_allowlist).expanduser().absolute()
        for name in ("workspace_quota", "session_quota"):
            size = getattr(self, name).strip().lower()
            setattr(self, name, size)
            if size != "auto":
                try:
                    parse_quota(size)
                except ValueError as exc:
                    raise SettingsError(f"{ENV_PREFIX}{name.upper()}: {exc}") from exc


class EgressSettings(Section, kw_only=True):
    """A run's egress proxy (orchestrator/sandbox/egress/): pins, brokered credentials, bounds and its log's retention."""

    prefix: ClassVar[str] = "egress_"

    # The egress proxy of a run whose group's network policy is not off
    # (orchestrator/sandbox/egress/): names mapped to addresses, exactly per host and port,
    # like curl's --resolve ("host:port:address", comma separated), for tests and on-premise
    # hosts (such an address may be private; the installation's own ports never are allowed);
    # and a run's bounds: requests, bytes both ways, connections open at once, idle seconds.
    resolve: Annotated[
        str, Meta(description="host:port:address pins for the egress proxy, comma separated (tests, on-premise)")
    ] = ""
    # Secrets the egress proxy adds to requests to their hosts, never entering a sandbox
    # (orchestrator/sandbox/egress_credentials.py: a JSON list of name, hosts, header, value,
    # methods, path_prefixes); a group's policy names the ones it gets.  And a CA file trusted
    # besides the system's (tests and on-premise hosts): by the proxy for those hosts, and by
    # the sandboxes (its certificates only) for the hosts they reach through a tunnel.
    credentials: Annotated[
        str, Meta(description="brokered secrets the egress proxy adds to requests (a JSON list)")
    ] = ""
    upstream_ca_file: Annotated[
        str, Meta(description="a CA file trusted besides the system's, by the proxy and the sandboxes")
    ] = ""
    max_requests: Annotated[int, Meta(ge=1, description="requests one run may make through its egress proxy")] = 1000
    max_bytes: Annotated[
        int, Meta(ge=1024, description="bytes both ways one run may move through its egress proxy")
    ] = 256 * 1024 * 1024
    max_connections: Annotated[
        int, Meta(ge=1, description="connections one run may have open through its egress proxy")
    ] = 64
    idle_s: Annotated[float, Meta(gt=0, description="seconds an egress connection may stay silent")] = 60.0
    # Days a run's egress log (its stored-only ``egress_log`` record) is kept; the sweeper
    # deletes older ones (orchestrator/run/sweeper.py).  0: kept for ever.
    log_retention_days: Annotated[int, Meta(ge=0, description="days a run's egress log is kept; 0: for ever")] = 30

    @property
    def resolve_entries(self) -> list[str]:
        """ORCHESTRATOR_EGRESS_RESOLVE's ``host:port:address`` entries."""
        return [e.strip() for e in self.resolve.split(",") if e.strip()]
