"""Run the agent in a hardened, throw-away Docker container.

Protocol plumbing (see ``agent_runner.protocol``): create the container with
stdin open, attach one socket for stdin/stdout/stderr *before* starting it (so
no output is missed), start, write the ``ContainerInput`` JSON, half-close the
socket (the container sees EOF on stdin) and read the multiplexed frames:
stdout lines are events, stderr is the runner's log.

Hardening is on from the first run: non-root user, no network, every
capability dropped, no-new-privileges, read-only root with a tmpfs for /tmp,
memory / CPU / pids limits, and labels that name run and group so orphans can
be found.  A watchdog kills the container at the run's time limit; the
container is always removed afterwards.  Under all of that, the kernel's own
walls, as the engine offers them (:func:`engine_security_opt`): Docker's
default seccomp profile (never relaxed here; a daemon that runs without it is
warned about) and, where the engine uses AppArmor, the ``docker-default``
profile named explicitly.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self, TypedDict

import docker
from docker.errors import DockerException, NotFound
from docker.models.containers import Container
from docker.types import LogConfig
from docker.utils.socket import STDERR, STDOUT, frames_iter

from agent_runner.protocol import KeepEvent
from orchestrator.core.errors import SandboxError
from orchestrator.core.settings import Settings
from orchestrator.core.spare_threads import SPARE
from orchestrator.sandbox.bounded_io import DEFAULT_MAX_LINE_BYTES, TailBuffer, read_lines
from orchestrator.sandbox.hostile_fs import chown_tree
from orchestrator.sandbox.runtime import RUNC, Runtime, engine_runtime

log = logging.getLogger(__name__)

LABEL_MANAGED = "orchestrator.managed"
LABEL_RUN = "orchestrator.run"
LABEL_GROUP = "orchestrator.group"
# Which installation (database) a container belongs to: installs sharing one
# Docker engine must never sweep each other's containers.
LABEL_INSTALL = "orchestrator.install"
# A group's warm container (orchestrator/sandbox/warm/): not tied to one run.
LABEL_WARM = "orchestrator.warm"
WORKSPACE_MOUNT = "/workspace"
# The model gateway's folder, always mounted read-only: the host binds its
# socket there and the container may connect to it (a unix socket connects on
# a read-only mount) but can never plant anything in it.
GATEWAY_MOUNT = "/run/gateway"
CONTAINER_UID = 1000  # the image's "agent" user, used when the host runs as root


@dataclass(frozen=True)
class ContainerSpec:
    """Everything needed to start one run container."""

    image: str
    name: str
    workspace: Path
    run_id: str
    group_folder: str
    memory: str = "512m"
    cpus: float = 1.0
    pids: int = 256
    timeout_s: float = 300.0
    install_id: str = ""
    extra_labels: dict[str, str] = field(default_factory=dict)
    # host path -> container path, mounted read-write (the run's private folder, read-write extra folders).
    extra_mounts: dict[str, str] = field(default_factory=dict)
    # host path -> container path, mounted read-only (allowlisted extra folders, orchestrator/sandbox/mounts.py).
    readonly_mounts: dict[str, str] = field(default_factory=dict)
    # The host's fence (agent_runner/fence.py): the run's stream stays open and gets a
    # beat every fence_s / 4 seconds; the payload carries the same host_fence_s.  0: none.
    fence_s: float = 0.0


@dataclass
class ContainerExit:
    status_code: int | None
    timed_out: bool
    stderr_tail: str


APPARMOR_ENABLED = Path("/sys/module/apparmor/parameters/enabled")
# The engine's answer, per engine (its API's address): asked once per process.
_engine_security: dict[str, list[str]] = {}
_engine_lock = threading.Lock()


def engine_security_opt(client: docker.DockerClient) -> list[str]:
    """The ``security_opt`` every agent container gets from this engine.

    ``no-new-privileges`` always.  ``apparmor=docker-default`` when the engine
    confines containers with AppArmor (``docker info``'s security options name
    it; the engine loads that profile itself): said explicitly, so a daemon
    configured otherwise fails the create rather than running the agent
    unconfined.  Seccomp needs no option: the engine applies its default
    profile unless told ``seccomp=unconfined``, which this never says; an
    engine that reports no seccomp, or another profile, is logged once as a
    warning (``tests/integration/test_sandbox_defences.py`` checks a running
    agent is filtered).
    """
    key = str(getattr(client.api, "base_url", ""))
    with _engine_lock:
        if key in _engine_security:
            return list(_engine_security[key])
    try:
        engine = [str(o) for o in client.info().get("SecurityOptions") or []]
    except DockerException as exc:
        raise SandboxError(f"cannot reach the Docker engine: {exc}") from exc
    options = ["no-new-privileges"]
    if any(o.startswith("name=apparmor") for o in engine):
        options.append("apparmor=docker-default")
    else:
        host = APPARMOR_ENABLED.read_text().strip() if APPARMOR_ENABLED.exists() else "absent"
        level = logging.WARNING if host == "Y" else logging.INFO
        log.log(
            level,
            "agent containers run without an AppArmor profile: the engine uses none (AppArmor on this "
            "host: %s); seccomp, capabilities and no-new-privileges still confine them",
            host,
        )
    seccomp = next((o for o in engine if o.startswith("name=seccomp")), None)
    if seccomp is None or "profile=default" not in seccomp and "profile=builtin" not in seccomp:
        log.warning(
            "the Docker engine reports %s: agent containers may not get Docker's default seccomp "
            "filter (see docs/architecture.md, 'Kernel walls')",
            seccomp or "no seccomp support",
        )
    with _engine_lock:
        _engine_security[key] = options
    return list(options)


def docker_client(settings: Settings) -> docker.DockerClient:
    try:
        if settings.sandbox.docker_url:
            return docker.DockerClient(base_url=settings.sandbox.docker_url)
        return docker.from_env()
    except DockerException as exc:
        raise SandboxError(f"cannot reach the Docker engine: {exc}") from exc


# How often a listing is tried again when a container went away while it was read.
LIST_ATTEMPTS = 5


def list_containers(
    client: docker.DockerClient, *, filters: dict[str, str | list[str] | bool], all: bool = False, sparse: bool = False
) -> list[Container]:  # the SDK's own name
    """``containers.list``, whole: the SDK lists, then inspects each container, and a
    container removed in between (a warm one idling out, auto-removed) fails the
    whole listing with NotFound; list again, it will not be in the next one.
    ``sparse``: the listing's own fields only, no inspect per container (one
    request however many there are); read them with :func:`labels_of` and
    :func:`name_of`."""
    for attempt in range(LIST_ATTEMPTS):
        try:
            return client.containers.list(all=all, filters=filters, sparse=sparse)
        except NotFound:
            if attempt == LIST_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def image_id(client: docker.DockerClient, image: str) -> str:
    """The id of the image tagged ``image`` (the tag itself when it cannot be read): a
    rebuilt image under the same tag must not be served by a container of the old one."""
    try:
        return str(client.images.get(image).id)
    except DockerException:
        return image


def labels_of(container: Container) -> dict[str, str]:
    """A container's labels, listed sparse or inspected."""
    attrs = container.attrs
    return attrs.get("Labels") or (attrs.get("Config") or {}).get("Labels") or {}


def name_of(container: Container) -> str:
    """A container's name, listed sparse or inspected."""
    attrs = container.attrs
    names = attrs.get("Names") or [attrs.get("Name") or container.short_id]
    return str(names[0]).lstrip("/")


def prepare_folder(folder: Path) -> str:
    """Make ``folder`` usable by the container's user; returns the user to run as.

    Root on the host: run as the image's unprivileged user and hand it the
    folder.  Any other host user: run as that same uid, so files the agent
    writes stay the user's own.
    """
    if os.getuid() == 0:
        _hand_over(folder)
    return container_user()


def container_user() -> str:
    """The user agent containers run as (:func:`prepare_folder` hands them their folders)."""
    uid, gid = os.getuid(), os.getgid()
    return f"{uid}:{gid}" if uid != 0 else f"{CONTAINER_UID}:{CONTAINER_UID}"


def _hand_over(folder: Path) -> None:
    """lchown everything under ``folder`` to the container's user, by
    descriptor and never through a symlink (``hostile_fs.chown_tree``): the
    folder is the agent's, and as root a chown that followed a planted link
    would hand it any host file."""
    chown_tree(folder, CONTAINER_UID, CONTAINER_UID)


class CreateArgs(TypedDict):
    """``containers.create`` keyword arguments shared by cold and warm containers."""

    image: str
    name: str
    user: str
    network_mode: str
    cap_drop: list[str]
    security_opt: list[str]
    read_only: bool
    tmpfs: dict[str, str]
    mem_limit: str
    memswap_limit: str
    nano_cpus: int
    pids_limit: int
    runtime: str
    volumes: dict[str, dict[str, str]]  # host path -> {"bind": container path, "mode": "rw" | "ro"}
    environment: dict[str, str]
    log_config: LogConfig
    labels: dict[str, str]


def hardened_create_args(
    spec: ContainerSpec, user: str, security_opt: list[str] | None = None, runtime: Runtime = RUNC
) -> CreateArgs:
    """``containers.create`` keyword arguments shared by cold and warm containers
    (``security_opt``: :func:`engine_security_opt` of the engine that creates it;
    ``runtime``: :func:`~orchestrator.sandbox.runtime.engine_runtime`'s choice)."""
    return {
        "image": spec.image,
        "name": spec.name,
        "user": user,
        "network_mode": "none",
        "cap_drop": ["ALL"],
        "security_opt": security_opt or ["no-new-privileges"],
        "read_only": True,
        "tmpfs": {"/tmp": "rw,nosuid,nodev,size=64m"},
        "mem_limit": spec.memory,
        "memswap_limit": spec.memory,
        "nano_cpus": int(spec.cpus * 1e9),
        "pids_limit": runtime.host_pids(spec.pids),
        "runtime": runtime.name,
        "volumes": {
            str(spec.workspace): {"bind": WORKSPACE_MOUNT, "mode": "rw"},
            **{h: {"bind": c, "mode": "rw"} for h, c in spec.extra_mounts.items()},
            **{h: {"bind": c, "mode": "ro"} for h, c in spec.readonly_mounts.items()},
        },
        # The runner loads pydantic only with the Anthropic SDK, and no pydantic
        # plugins exist in the image: skipping their discovery (an
        # importlib.metadata scan) saves ~50 ms of such a run's start.
        "environment": {"HOME": "/tmp", "PYDANTIC_DISABLE_PLUGINS": "1"},
        # Docker keeps what a container writes in its log file; the agent can
        # write to the runner's stdout/stderr at will, so cap the file (one
        # file, rotated at 1 MB) or it can fill the host's disk.
        "log_config": LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
        "labels": {
            LABEL_MANAGED: "1",
            LABEL_RUN: spec.run_id,
            LABEL_GROUP: spec.group_folder,
            LABEL_INSTALL: spec.install_id,
            **spec.extra_labels,
        },
    }


class StreamedRun(ABC):
    """What a cold run (:class:`RunningContainer`) and a warm one
    (``warm.WarmRun``) share: the event lines, read in bounded memory from the
    subclass's :meth:`_chunks`, the watchdog at the run's time limit, and the
    end, logged and kept the same way."""

    exit: ContainerExit | None
    _container: Container

    @property
    def id(self) -> str:
        return str(self._container.id)

    @abstractmethod
    def kill(self) -> None: ...

    @abstractmethod
    def finish(self) -> ContainerExit: ...

    @abstractmethod
    def _chunks(self) -> Iterator[bytes]:
        """The run's stdout as it comes, until it closes."""

    @abstractmethod
    def _close(self) -> None:
        """After the run, killed and finished if the caller did not: let go of what it holds."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self.exit is None:
            self.kill()
            self.finish()
        self._close()

    def _beat(self, send: Callable[[bytes], object], fence_s: float) -> None:
        """Keep the run's stream alive for the runner's fence: a newline every ``fence_s / 4``
        seconds from a thread of its own (frozen with the worker, gone with its process)
        until the run is over (:meth:`_stop_beats`) or the stream fails."""
        self._beats_done = threading.Event()
        if fence_s <= 0:
            return
        done = self._beats_done

        def beat() -> None:
            while not done.wait(fence_s / 4):
                try:
                    send(b"\n")
                except OSError:
                    return  # the run's stream is closed: the run is over either way

        SPARE.start(beat, "sandbox-beat")

    def _stop_beats(self) -> None:
        done = getattr(self, "_beats_done", None)
        if done is not None:
            done.set()

    def _watch(self, what: str, timeout_s: float) -> None:
        """Start the watchdog: at ``timeout_s`` the run is marked timed out and killed."""
        self._timed_out = threading.Event()

        def expire() -> None:
            self._timed_out.set()
            logging.getLogger(type(self).__module__).warning(
                "%s hit its %.0fs limit; killing the container", what, timeout_s
            )
            self.kill()

        self._watchdog = SPARE.after(timeout_s, expire, "sandbox-watchdog")

    def lines(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Iterator[str]:
        """The run's stdout, one line at a time, until it closes.

        Raises :class:`~orchestrator.core.errors.OutputLimitExceeded` on a line
        longer than ``max_line_bytes`` (the caller kills the container).
        """
        for line in read_lines(self._chunks(), max_line_bytes):
            yield line.decode("utf-8", "replace")

    def _ended(self, name: str, status: int | None, stderr: str) -> ContainerExit:
        """Record the end: the last lines of the runner's log copied into the worker's, the tail kept."""
        logger = logging.getLogger(type(self).__module__)
        for line in stderr.splitlines()[-50:]:
            logger.info("[%s] %s", name, line[:2000])
        self.exit = ContainerExit(status, self._timed_out.is_set(), stderr[-4000:])
        return self.exit


class RunningContainer(StreamedRun):
    """A started run container; iterate :meth:`lines`, then read :attr:`exit`."""

    def __init__(
        self, client: docker.DockerClient, spec: ContainerSpec, payload: bytes, runtime: Runtime = RUNC
    ) -> None:
        self._client = client
        self.spec = spec
        self.exit = None
        # Only the end of the runner's log: the agent can write gigabytes there.
        self._stderr = TailBuffer()
        spec.workspace.mkdir(parents=True, exist_ok=True)
        try:
            self._container = client.containers.create(
                stdin_open=True,
                **hardened_create_args(spec, prepare_folder(spec.workspace), engine_security_opt(client), runtime),
            )
            self._sock = client.api.attach_socket(self.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            self._container.start()
        except DockerException as exc:
            self._remove()
            raise SandboxError(f"cannot start the agent container: {exc}") from exc
        self._watch(f"run container {spec.name}", spec.timeout_s)
        raw = getattr(self._sock, "_sock", self._sock)
        try:
            raw.sendall(payload + b"\n")
            if spec.fence_s > 0:
                # stdin stays open for the run: its end is the worker's death, which the
                # runner then answers by stopping everything (agent_runner/fence.py).
                self._beat(raw.sendall, spec.fence_s)
            else:
                raw.shutdown(socket.SHUT_WR)
        except OSError as exc:
            # The container may have died before reading its input; the exit
            # status will tell the caller what happened.
            log.warning("could not write the run input to %s: %s", spec.name, exc)

    def keep(self, process: KeepEvent) -> None:
        """Nothing to keep: a cold container ends with its run."""
        log.debug("%s ends with its run: process %d is not kept", self.spec.name, process.pid)

    def kill(self) -> None:
        # Stop reading first: a caller that stopped at an output limit no
        # longer drains the attach stream, and Docker does not finish a kill
        # while the container's output is blocked on it (the kill call hung
        # for its whole 60 s timeout).  Shutting the socket also ends lines().
        raw = getattr(self._sock, "_sock", self._sock)
        try:
            raw.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._container.kill()
        except DockerException:
            pass

    def _chunks(self) -> Iterator[bytes]:
        """stdout frames as they come; stderr frames go to the bounded tail."""
        try:
            # docker's stubs leave frames_iter unannotated: (stream, bytes) pairs without a tty.
            for stream, data in frames_iter(self._sock, tty=False):  # type: ignore[no-untyped-call]
                if stream == STDOUT:
                    yield data
                elif stream == STDERR:
                    self._stderr.write(data)
        except (OSError, DockerException) as exc:
            log.warning("lost the output stream of %s: %s", self.spec.name, exc)

    def finish(self) -> ContainerExit:
        self._watchdog.cancel()
        self._stop_beats()
        status: int | None = None
        try:
            status = int(self._container.wait(timeout=30).get("StatusCode", -1))
        except Exception as exc:  # noqa: BLE001 - any failure here means "unknown"
            log.warning("could not read the exit status of %s: %s", self.spec.name, exc)
        stderr = self._stderr.text()
        if self._stderr.dropped:
            log.info("[%s] (log: %d earlier bytes not kept)", self.spec.name, self._stderr.dropped)
        ended = self._ended(self.spec.name, status, stderr)
        self._remove()
        return ended

    def _remove(self) -> None:
        container = getattr(self, "_container", None)
        if container is None:
            return
        try:
            container.remove(force=True)
        except NotFound:
            pass
        except DockerException as exc:
            log.warning("could not remove container %s: %s", self.spec.name, exc)

    def _close(self) -> None:
        self._stop_beats()
        try:
            self._sock.close()
        except Exception as exc:  # noqa: BLE001 - the run is over; a socket that will not close is only logged
            log.warning("could not close the attach socket of %s: %s", self.spec.name, exc)


class DockerSandbox:
    """Starts run containers on the local Docker engine."""

    def __init__(self, settings: Settings, client: docker.DockerClient | None = None) -> None:
        self.settings = settings
        self.client = client or docker_client(settings)

    def expected_container(self, group_folder: str) -> str | None:
        return None  # every run gets a container of its own, made when it starts

    def start(self, spec: ContainerSpec, payload: bytes) -> RunningContainer:
        return RunningContainer(self.client, spec, payload, engine_runtime(self.client, self.settings))

    def remove_run(self, run_id: str) -> int:
        """Remove this installation's container(s) of run ``run_id`` (a dead worker's run,
        before its group runs again); returns how many."""
        return self._remove([f"{LABEL_RUN}={run_id}"], lambda c: False)

    def remove_orphans(self, live_runs: set[str]) -> int:
        """Remove this installation's run containers whose run is not in ``live_runs``."""

        def keep(c: Container) -> bool:
            # A warm container idles out by itself; a run may be using it right now.
            return c.labels.get(LABEL_RUN) in live_runs or (c.labels.get(LABEL_WARM) == "1" and c.status == "running")

        return self._remove([], keep)

    def _remove(self, extra_labels: list[str], keep: Callable[[Container], bool]) -> int:
        """Force-remove this installation's containers with ``extra_labels`` that ``keep`` spares."""
        removed = 0
        labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={self.settings.install_id}", *extra_labels]
        for c in list_containers(self.client, all=True, filters={"label": labels}):
            if keep(c):
                continue
            try:
                c.remove(force=True)
                removed += 1
            except NotFound:
                pass
        return removed
