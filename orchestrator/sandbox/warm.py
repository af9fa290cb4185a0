"""Warm sessions: a group's container stays up between runs.

A cold run pays for a container start and an interpreter start each time.
With ``ORCHESTRATOR_WARM_IDLE_S`` > 0 a group's container is started in the
runner's serve mode (``agent_runner/serve.py``) with the same hardening and
the group's workspace; the runner binds its socket in the workspace
(``.orchestrator/agent.sock``).  A run connects to it (any worker process on
this host can: the container is found by its labels, not held by a
process), writes the input line and reads event lines.  The workspace is
the agent's, so the socket is reached as hostile_fs reaches anything there:
no symlink followed, a socket or nothing.  After each run everything the run
left running is killed (``WarmRun._clean_up``).

* idle: the runner exits after the idle timeout and Docker removes it
  (auto-remove); nothing on the host has to remember it;
* crashed or stale (its image changed, or anything it is created with: the
  runtime, a security option, a limit, a mount; :func:`config_hash`): replaced
  before the run, transparently;
* a run that times out or is cancelled kills the container: the next run
  starts a fresh one;
* ``orchestrator groups reset JID`` stops it and forgets the group's model
  session;
* too many: a host keeps at most ``warm_cap`` warm containers (the
  ``ORCHESTRATOR_WARM_MAX`` setting, else sized by the host's memory); a new
  one first stops the least recently used idle ones past the cap, and so does
  the heartbeat's tending.  A container is "used" when a run is handed to it
  (a host-only marker's mtime) and is never stopped while a run is on it;
* a group placed on another host (``orchestrator/store/placement.py``: moved,
  or taken over while this host was away): this host stops it
  (:meth:`WarmPool.tend`, from the host heartbeat's counting thread).  A
  container carries its host's id (``orchestrator.host``) and a host runs
  only on its own: hosts may share a Docker engine.

The run's model gateway socket, if any, is bound in the group's gateway
folder, host-only and mounted read-only at ``/run/gateway``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import docker
import msgspec
from docker.errors import DockerException, NotFound
from docker.models.containers import Container

from agent_runner.protocol import KeepEvent, ProtocolError, ResultEvent, parse_event
from orchestrator.core.errors import HostileEntry, ImageBuildError, SandboxError
from orchestrator.core.settings import Settings
from orchestrator.core.sizes import memory_bytes
from orchestrator.sandbox.bounded_io import DEFAULT_MAX_LINE_BYTES, TailBuffer
from orchestrator.sandbox.containers import (
    GATEWAY_MOUNT,
    LABEL_GROUP,
    LABEL_INSTALL,
    LABEL_MANAGED,
    LABEL_RUN,
    LABEL_WARM,
    WORKSPACE_MOUNT,
    ContainerExit,
    ContainerSpec,
    StreamedRun,
    container_user,
    engine_security_opt,
    hardened_create_args,
    image_id,
    labels_of,
    list_containers,
    name_of,
    prepare_folder,
)
from orchestrator.sandbox.hostile_fs import SocketIdentity, connect_unix_named, remove_entry
from orchestrator.sandbox.image import VARIANTS, image_name
from orchestrator.sandbox.runtime import RUNC, Runtime, engine_runtime
from orchestrator.sandbox.standby import (
    LABEL_STANDBY,
    SOCKET_NAME,
    Slot,
    StandbyPool,
    standby_key,
    standby_root,
)
from orchestrator.sandbox.standby import eligible as standby_eligible
from orchestrator.sandbox.standby import unavailable_reason as standby_unavailable
from orchestrator.store.db import Database
from orchestrator.store.hosts import gone_for
from orchestrator.store.placement import moved_away

log = logging.getLogger(__name__)

# How a run's container was had (orchestrator_container_start_seconds{mode}).
StartMode = Literal["cold", "warm", "standby"]

LABEL_WARM_CONFIG = "orchestrator.warm-config"
# The host (ORCHESTRATOR_HOST_ID) whose container it is: hosts may share a Docker
# engine (compose's scaled workers), and each serves its own groups' runs.
LABEL_HOST = "orchestrator.host"
# The warm runner's socket, relative to the workspace (where the runner binds it).
RUNNER_SOCKET = ".orchestrator/agent.sock"
STARTUP_TIMEOUT_S = 20.0
CONNECT_ATTEMPTS = 2
# Bumped when the mounts of a warm container change: older ones are replaced.
WARM_LAYOUT = 3
# How often one process looks for dead hosts' containers on its engine (WarmPool.tend,
# every host heartbeat beat, calls it): host id -> when it last looked (monotonic).
REAP_EVERY_S = 15.0
_reaped_at: dict[str, float] = {}
# The runner's log lines a run's end reads back (Docker splits longer lines at 16 KiB).
LOG_TAIL_LINES = 200
# The cap sized by memory: an idle warm container may hold up to its memory
# limit (its /tmp is a tmpfs and its page cache counts too), so the cap lets
# them all together hold at most this share of the host's memory ...
WARM_MEMORY_SHARE = 0.5
# ... and never fewer than this (one per pool child of a small worker) nor more.
MIN_WARM, MAX_AUTO_WARM = 2, 256


def host_memory_bytes() -> int:
    """This machine's physical memory (a worker in a container sees its host's too:
    agent containers are its siblings on the host's engine)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def warm_cap(settings: Settings, memory: int | None = None) -> int:
    """The most warm containers this host keeps: ``ORCHESTRATOR_WARM_MAX``, else as
    many as fit in ``WARM_MEMORY_SHARE`` of ``memory`` (the host's) at the
    installation's container memory limit."""
    if settings.warm_max:
        return settings.warm_max
    total = host_memory_bytes() if memory is None else memory
    fits = int(total * WARM_MEMORY_SHARE) // memory_bytes(settings.container_memory)
    return max(MIN_WARM, min(MAX_AUTO_WARM, fits))


def gateway_dir(settings: Settings, folder: str) -> Path:
    """Where a warm group's model gateway socket is bound: host-only, mounted read-only."""
    return settings.data_dir / "gateway" / folder


def state_dir(settings: Settings, folder: str) -> Path:
    """Host-only: what the host remembers about a group's warm containers (the
    "a run is in progress" markers)."""
    return settings.data_dir / "warm" / folder


def _used_marker(settings: Settings, folder: str, container_id: str) -> Path:
    """Its mtime is when a run was last handed to warm container ``container_id``."""
    return state_dir(settings, folder) / f"{container_id[:12]}.used"


def host_only_dir(path: Path) -> Path:
    """Create ``path`` as the host's own folder (mode 0755, never handed to the
    container's user, never mounted writable)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o755)
    return path


# What names one warm container rather than what it is: left out of its configuration.
# Everything else it is created with is in it (:func:`config_hash`), so an option added to
# the create arguments later is too, unlisted.
PER_CONTAINER_ARGS = frozenset({"name"})
PER_CONTAINER_LABELS = frozenset({LABEL_RUN, LABEL_WARM_CONFIG})
# The fields of a ContainerSpec that are one run's and never reach a warm container's
# create arguments: the runs it serves may differ in them.  Every other field must change
# the configuration (tests/host/test_warm_config.py holds both lists to that).
PER_RUN_SPEC_FIELDS = frozenset({"name", "run_id", "timeout_s", "fence_s"})


def warm_create_args(
    settings: Settings,
    spec: ContainerSpec,
    *,
    user: str,
    security_opt: list[str],
    runtime: Runtime,
    host_id: str,
    idle_s: float,
) -> dict[str, Any]:
    """``containers.create``'s keyword arguments for the group's warm container: the hardened
    ones every agent container gets (user, runtime, security options, capabilities, read-only
    root, limits, network, mounts), its gateway folder read-only, its serve command, its
    labels (with no run's, and not yet :data:`LABEL_WARM_CONFIG`)."""
    args: dict[str, Any] = dict(hardened_create_args(spec, user, security_opt, runtime))
    args["volumes"][str(gateway_dir(settings, spec.group_folder))] = {"bind": GATEWAY_MOUNT, "mode": "ro"}
    labels = {**args["labels"], LABEL_WARM: "1", LABEL_HOST: host_id}
    labels.pop(LABEL_RUN, None)
    args["labels"] = labels
    args["name"] = f"orch-warm-{spec.group_folder}-{os.urandom(3).hex()}"
    args["command"] = ["--serve", f"{WORKSPACE_MOUNT}/{RUNNER_SOCKET}", "--idle-timeout", f"{idle_s:g}"]
    args["auto_remove"] = True
    return args


def config_hash(image: str, args: dict[str, Any]) -> str:
    """The warm configuration a container created with ``args`` (:func:`warm_create_args`)
    serves; ``image``: the id of its image's tag.  All of ``args`` but what names the one
    container: a run needing anything else (another runtime, security option, limit, mount)
    is not handed to it, and the container is replaced."""
    doc = {key: value for key, value in args.items() if key not in PER_CONTAINER_ARGS}
    doc["labels"] = {k: v for k, v in args["labels"].items() if k not in PER_CONTAINER_LABELS}
    doc["image_id"] = image
    # Containers of an older layout (sockets in a writable session folder) are replaced.
    doc["layout"] = WARM_LAYOUT
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=repr).encode()).hexdigest()[:16]


@dataclass
class _Known:
    """What this process knows of the warm container it last handed a group's run to:
    the container as Docker last described it, the configuration it serves (computed
    with ``image``, the image id looked up at ``looked_up``, monotonic) and the socket
    its runner listens on (:data:`~orchestrator.sandbox.hostile_fs.SocketIdentity`)."""

    container: Container
    config: str
    image: str
    looked_up: float
    socket: SocketIdentity

    @property
    def stale(self) -> bool:
        """Its image was looked up too long ago to trust (a rebuilt tag: :data:`KNOWN_TTL_S`)."""
        return time.monotonic() - self.looked_up > KNOWN_TTL_S


# Per process: (data dir, host id, group folder) -> the group's warm container as this
# process last reached it.  The next run of the group reaches it with no Docker API call
# (WarmPool._start_known); anything that could make it wrong sends the run back to Docker:
# another configuration, a run cut off on it, a socket that refuses or is not the same one,
# and a rebuilt image: the host heartbeat's tending removes the idle containers of an image
# their tag no longer names (WarmPool.tend), and a process looks the tag up again at least
# every KNOWN_TTL_S (one without a heartbeat, a group it serves without a pause).
_known: dict[tuple[str, str, str], _Known] = {}
KNOWN_TTL_S = 300.0


class Adoption(msgspec.Struct, frozen=True):
    """A standby container taken by a group (``data/warm/<folder>/adopted.json``):
    which container, in which slot, and the warm configuration it serves."""

    container: str
    slot: str
    config: str


def _adoption_file(settings: Settings, folder: str) -> Path:
    return state_dir(settings, folder) / "adopted.json"


class WarmPool:
    """Finds, starts and replaces the warm containers of this installation."""

    def __init__(self, settings: Settings, client: docker.DockerClient) -> None:
        self.settings = settings
        self.client = client
        self.standby = StandbyPool(settings, client, self.host_id, LABEL_HOST)

    def _labels(self, folder: str | None = None, *, any_host: bool = False) -> list[str]:
        labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={self.settings.install_id}", f"{LABEL_WARM}=1"]
        if not any_host:
            labels.append(f"{LABEL_HOST}={self.host_id}")
        return labels + ([f"{LABEL_GROUP}={folder}"] if folder is not None else [])

    @property
    def host_id(self) -> str:
        return self.settings.effective_host_id

    def _adoption(self, folder: str) -> Adoption | None:
        try:
            return msgspec.json.decode(_adoption_file(self.settings, folder).read_bytes(), type=Adoption)
        except (OSError, msgspec.DecodeError):
            return None

    def _folder_of(self, container: Container) -> str | None:
        """The group a warm container serves: its label, or for a standby one the
        group that took it (None: a standby still in the pool)."""
        labels = labels_of(container)
        if labels.get(LABEL_STANDBY):
            slot = self.standby.slot_of(container)
            return slot.taken_by() if slot is not None else None
        return labels.get(LABEL_GROUP) or None

    def find(self, folder: str, *, any_host: bool = False) -> list[Container]:
        """The group's warm containers of this host (``any_host``: of every host on this
        engine): those started for it, and the standby container it took, if any."""
        found = list_containers(self.client, all=True, filters={"label": self._labels(folder, any_host=any_host)})
        adoption = self._adoption(folder)
        if adoption is not None:
            try:
                c = self.client.containers.get(adoption.container)
            except (NotFound, DockerException):
                c = None
            if c is None or c.status not in ("created", "running"):
                # Gone (idle exit, auto-removed): its slot and the record go too.
                self.standby.release(Slot(standby_root(self.settings) / adoption.slot))
                with contextlib.suppress(FileNotFoundError):
                    _adoption_file(self.settings, folder).unlink()
            elif (
                c.labels.get(LABEL_STANDBY) == adoption.slot
                and c.labels.get(LABEL_INSTALL) == self.settings.install_id
                and (any_host or c.labels.get(LABEL_HOST) == self.host_id)
            ):
                found.append(c)
        return found

    def _config_of(self, container: Container, folder: str) -> str | None:
        if container.labels.get(LABEL_STANDBY):
            adoption = self._adoption(folder)
            return adoption.config if adoption is not None and adoption.container == container.id else None
        return container.labels.get(LABEL_WARM_CONFIG)

    def discard(self, container: Container) -> None:
        """Remove a warm container and forget its run marker (and, for a standby
        one, release its slot and the group's record of it)."""
        folder = self._folder_of(container)
        for key, known in list(_known.items()):
            if known.container.id == container.id:
                _known.pop(key, None)
        with contextlib.suppress(NotFound, DockerException):
            container.remove(force=True)
        if folder:
            for marker in (_dirty_marker, _used_marker):
                with contextlib.suppress(FileNotFoundError):
                    marker(self.settings, folder, str(container.id)).unlink()
        slot = self.standby.slot_of(container)
        if slot is not None:
            self.standby.release(slot)
            adoption = self._adoption(folder) if folder else None
            if folder and adoption is not None and adoption.container == container.id:
                with contextlib.suppress(FileNotFoundError):
                    _adoption_file(self.settings, folder).unlink()

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """This host's worker processes one at a time: claiming a container for a
        run and choosing the ones to stop never overlap, so a container being
        claimed is never stopped as idle."""
        path = host_only_dir(self.settings.data_dir / "warm") / f".{self.host_id}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _busy(self, container: Container) -> bool:
        """A run is on it (its dirty marker)."""
        folder = self._folder_of(container) or ""
        return _dirty_marker(self.settings, folder, str(container.id)).exists()

    def _last_used(self, container: Container) -> float:
        folder = self._folder_of(container) or ""
        try:
            return _used_marker(self.settings, folder, str(container.id)).stat().st_mtime
        except OSError:
            return 0.0  # never handed a run (a start that failed): the first to go

    def _make_room(self, keep: int, running: list[Container]) -> int:
        """Stop the least recently used idle containers of ``running`` (this host's)
        until at most ``keep`` are left; a container with a run on it is never
        stopped.  Call with the lock held.  Returns how many were stopped."""
        excess = len(running) - keep
        if excess <= 0:
            return 0
        victims = sorted((c for c in running if not self._busy(c)), key=self._last_used)[:excess]
        for c in victims:
            log.info(
                "stopping warm container %s, the least recently used: this host keeps at most %d", name_of(c), keep
            )
            self.discard(c)
        return len(victims)

    def stop(self, folder: str) -> int:
        """Stop and remove a group's warm container(s), whichever host's on this engine; returns how many."""
        found = self.find(folder, any_host=True)
        for c in found:
            self.discard(c)
        return len(found)

    def stop_all(self) -> int:
        found = list_containers(self.client, all=True, filters={"label": self._labels(any_host=True)})
        for c in found:
            self.discard(c)
        return len(found) + self.standby.stop_all()

    def stop_host(self) -> int:
        """Remove every warm container of this host, busy or not (the host is cut off: none of
        its runs can be answered for); returns how many."""
        found = list_containers(self.client, all=True, filters={"label": self._labels()})
        for c in found:
            self.discard(c)
        return len(found)

    def group_running(self, folder: str) -> bool:
        """Whether a container of this installation (warm or cold, any host's) runs for the
        group on this engine."""
        labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={self.settings.install_id}", f"{LABEL_GROUP}={folder}"]
        return bool(list_containers(self.client, filters={"label": labels, "status": "running"}, sparse=True))

    def stop_idle(self) -> int:
        """Stop this host's warm containers that have no run on them, and its standby
        ones: what the host's worker does as it stops, so a stopped installation
        (`up` ended, `compose down`) leaves no agent container behind.  A warm
        container is a cache: the next run starts one.  Returns how many."""
        with self._lock():
            idle = [
                c
                for c in list_containers(self.client, all=True, filters={"label": self._labels()})
                if not self._busy(c)
            ]
            for c in idle:
                self.discard(c)
        return len(idle)

    def _running(self) -> list[Container]:
        """This host's running warm containers that serve a group (standby ones still
        in the pool are not warm containers yet)."""
        # Sparse: one request however many there are (the heartbeat asks every beat).
        running = list_containers(self.client, filters={"label": self._labels(), "status": "running"}, sparse=True)
        return [c for c in running if self._folder_of(c) is not None]

    def count_running(self) -> int:
        """This host's running warm containers of this installation (the host's heartbeat reports it)."""
        return len(self._running())

    def tend(self, db: Database) -> int:
        """Stop this host's warm containers of groups placed on another host now
        (``store/placement.py``: moved, or taken over while this host was away) whose
        lease no process of this host holds and that no run of ours is using, and the
        least recently used idle ones past the cap (a lowered ``ORCHESTRATOR_WARM_MAX``,
        or more started at once than the cap while all were busy); then keep the
        standby pool full.  Returns how many of this host's warm containers run after
        that.  The host heartbeat's counting thread calls it every beat, so a group
        that moved leaves no idle container behind on its old host; one Docker list,
        and a database read only when there are warm containers."""
        self.remove_dead_hosts_containers(db)
        running = self._running()
        folders = sorted({self._folder_of(c) or "" for c in running} - {""})
        gone = set(moved_away(db, self.host_id, folders))
        stopped = 0
        left = []
        for c in running:
            folder = self._folder_of(c) or ""
            if folder not in gone or self._busy(c):
                left.append(c)
                continue  # still placed here, or a run of this host is on it right now
            log.info(
                "group folder %s is placed on another host now: stopping its warm container %s here", folder, name_of(c)
            )
            self.discard(c)
            stopped += 1
        stale = self._of_old_images(left)
        if stale:
            with self._lock():
                for c in stale:
                    if self._busy(c):
                        continue  # stopped at a later beat, once its run is over
                    log.info("stopping warm container %s: its image was rebuilt since it started", name_of(c))
                    self.discard(c)
                    left.remove(c)
                    stopped += 1
        if len(left) > warm_cap(self.settings):
            with self._lock():
                stopped += self._make_room(warm_cap(self.settings), left)
        if standby_unavailable(self.settings, self.client) is None:
            try:
                with self._lock():
                    missing = self.standby.prune(self.settings.standby)
                # Started without the lock: a claim never waits for a container start.
                for _ in range(missing):
                    self.standby.start(standby_key(self.client, self.settings))
            except (SandboxError, DockerException, OSError) as exc:
                log.warning("could not refill the standby sandboxes: %s", exc)
        return len(running) - stopped

    def _of_old_images(self, running: list[Container]) -> list[Container]:
        """Those of ``running`` (listed sparse) whose image is not what the agent image's
        tag, or a variant's, names now (rebuilt since they started).  None when no tag
        can be read (an engine that does not answer says nothing of the kind)."""
        if not running:
            return []
        current = set()
        for variant in (None, *VARIANTS):
            with contextlib.suppress(DockerException, ImageBuildError):
                current.add(str(self.client.images.get(image_name(self.settings, variant)).id))
        if not current:
            return []
        return [c for c in running if c.attrs.get("ImageID") not in (None, *current)]

    def remove_dead_hosts_containers(self, db: Database) -> int:
        """Remove the warm and standby containers on this engine of hosts that have not
        beaten for ``ORCHESTRATOR_DEAD_HOST_S`` (a worker SIGKILLed for good
        leaves them running: its groups moved, and nobody else tends them).  Looked at at
        most every :data:`REAP_EVERY_S` per process: one Docker list, and a database read
        only when another host's containers are there.  Returns how many were removed."""
        after = self.settings.dead_host_s
        now = time.monotonic()
        if after <= 0 or now - _reaped_at.get(self.host_id, -REAP_EVERY_S) < REAP_EVERY_S:
            return 0
        _reaped_at[self.host_id] = now
        labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={self.settings.install_id}", LABEL_HOST]
        foreign = [
            c
            for c in list_containers(self.client, all=True, filters={"label": labels}, sparse=True)
            if labels_of(c).get(LABEL_HOST) not in (None, self.host_id)
        ]
        gone = gone_for(db, {labels_of(c)[LABEL_HOST] for c in foreign}, after)
        removed = 0
        for c in foreign:
            host = labels_of(c)[LABEL_HOST]
            if host in gone:
                log.warning(
                    "removing container %s of host %s, which has not beaten for %.0fs or more", name_of(c), host, after
                )
                self.discard(c)
                removed += 1
        return removed

    def _known_key(self, folder: str) -> tuple[str, str, str]:
        return (str(self.settings.data_dir), self.host_id, folder)

    def _start_known(self, spec: ContainerSpec, payload: bytes, idle: float) -> WarmRun | None:
        """The run, on the container this process last handed the group's run to, when it
        is still the one, with no Docker API call; None: ask Docker (:meth:`start`).

        Still the one: the same configuration (its image looked up at most
        :data:`KNOWN_TTL_S` ago), no run cut off on it (its dirty marker, as
        :meth:`_claim` checks), and its runner's socket the very one reached last time
        (device, inode and change time, read from the descriptor the connection goes
        through): a new runner binds a new socket, and a dead one's refuses.  A host-side
        check of the file system the host already shares with the container, so it holds
        under gVisor as under runc (no look into the container's processes)."""
        key = self._known_key(spec.group_folder)
        known = _known.pop(key, None)  # put back once the run is handed over
        if known is None:
            return None
        if known.stale or self._config(known.image, spec, idle) != known.config:
            return None
        container = known.container
        dirty = _dirty_marker(self.settings, spec.group_folder, str(container.id))
        with self._lock():
            if dirty.exists():
                return None  # a run on it was cut off: Docker's path replaces it
            self._mark_in_use(spec.group_folder, container)
        folder, relative = self._socket_of(container, spec)
        try:
            sock, _ = connect_unix_named(folder, relative, expect=known.socket)
        except (OSError, HostileEntry) as exc:
            # Gone, or another runner listens there now: no run was handed to it, so it is
            # not in use; Docker's path finds out what is there.
            log.info("warm container %s did not answer as before (%s); asking Docker", container.name, exc)
            with contextlib.suppress(FileNotFoundError):
                dirty.unlink()
            return None
        _known[key] = known
        return WarmRun(container, sock, spec, payload, start_mode="warm", dirty_marker=dirty, pool=self)

    def expected_container(self, group_folder: str) -> str | None:
        """The warm container this process last handed the group's run to, if it still
        counts it as known (:meth:`_start_known` checks it when the run starts)."""
        known = _known.get(self._known_key(group_folder))
        if known is None or known.stale:
            return None
        return str(known.container.id)

    def start(self, spec: ContainerSpec, payload: bytes) -> WarmRun:
        idle = self.settings.warm_idle_s
        known = self._start_known(spec, payload, idle)
        if known is not None:
            return known
        image, looked_up = image_id(self.client, spec.image), time.monotonic()
        config = self._config(image, spec, idle)
        last_error: Exception | None = None
        for _ in range(CONNECT_ATTEMPTS):
            taken: tuple[Container, Slot] | None = None
            with self._lock():
                container = self._claim(spec, config)
                if container is None:
                    # Room for the new one first: the cap counts it.
                    self._make_room(warm_cap(self.settings) - 1, self._running())
                    taken = self._take_standby(spec, config)
            mode: StartMode = "warm" if container is not None else "standby"
            if taken is not None:
                container, slot = taken
                try:
                    self._attach(spec, container, slot)
                except (OSError, SandboxError) as exc:
                    log.warning(
                        "could not bind %s into standby container %s (%s); starting one for it",
                        spec.group_folder,
                        container.name,
                        exc,
                    )
                    self.discard(container)
                    container = None
            if container is None:
                container = self._create(spec, config, idle)
                mode = "cold"
            dirty = _dirty_marker(self.settings, spec.group_folder, str(container.id))
            try:
                sock, socket_id = self._connect(container, spec, retry_s=0.0 if mode == "warm" else STARTUP_TIMEOUT_S)
            except (OSError, HostileEntry) as exc:
                # Died between runs (or mid-idle-exit), or its socket is gone: replace it, transparently.
                log.info("warm container of %s did not answer (%s); replacing it", spec.group_folder, exc)
                last_error = exc
                self.discard(container)
                continue
            _known[self._known_key(spec.group_folder)] = _Known(container, config, image, looked_up, socket_id)
            return WarmRun(container, sock, spec, payload, start_mode=mode, dirty_marker=dirty, pool=self)
        raise SandboxError(f"cannot reach a warm agent container for {spec.group_folder}: {last_error}")

    def _create_args(self, spec: ContainerSpec, idle: float) -> dict[str, Any]:
        """The group's warm container's create arguments on this engine, this host, now
        (the engine's answers are asked once per process)."""
        return warm_create_args(
            self.settings,
            spec,
            user=container_user(),
            security_opt=engine_security_opt(self.client),
            runtime=engine_runtime(self.client, self.settings),
            host_id=self.host_id,
            idle_s=idle,
        )

    def _config(self, image: str, spec: ContainerSpec, idle: float) -> str:
        """The warm configuration a run of ``spec`` needs (:func:`config_hash`)."""
        return config_hash(image, self._create_args(spec, idle))

    def _take_standby(self, spec: ContainerSpec, config: str) -> tuple[Container, Slot] | None:
        """A standby container for the group, recorded as its warm container and
        marked in use, or None (none ready, standby off, or the group needs other
        limits or mounts than a standby has).  Call with the lock held."""
        if standby_unavailable(self.settings, self.client) is not None or not standby_eligible(self.settings, spec):
            return None
        try:
            taken = self.standby.take(spec.group_folder)
        except DockerException as exc:
            log.warning("could not list the standby sandboxes: %s", exc)
            return None
        if taken is None:
            return None
        container, slot = taken
        host_only_dir(state_dir(self.settings, spec.group_folder))
        record = Adoption(container=str(container.id), slot=slot.name, config=config)
        _adoption_file(self.settings, spec.group_folder).write_bytes(msgspec.json.encode(record))
        self._mark_in_use(spec.group_folder, container)
        return taken

    def _attach(self, spec: ContainerSpec, container: Container, slot: Slot) -> None:
        """The group's folders into the standby container it took: the workspace
        (handed to the container's user, as for any container) and its gateway folder."""
        spec.workspace.mkdir(parents=True, exist_ok=True)
        prepare_folder(spec.workspace)
        gateway = host_only_dir(gateway_dir(self.settings, spec.group_folder))
        self.standby.attach(container, slot, spec.workspace, gateway)

    def _socket_of(self, container: Container, spec: ContainerSpec) -> tuple[Path, str]:
        """Where the runner's socket is: in the workspace, or for a standby container in its
        slot's socket folder (both hostile: see :func:`_connect_runner`)."""
        slot = self.standby.slot_of(container)
        if slot is not None:
            return slot.sockets, SOCKET_NAME
        return spec.workspace, RUNNER_SOCKET

    def _connect(
        self, container: Container, spec: ContainerSpec, *, retry_s: float
    ) -> tuple[socket.socket, SocketIdentity]:
        """A connection to the runner's socket, and which socket it reached."""
        folder, relative = self._socket_of(container, spec)
        return _connect_runner(folder, relative, retry_s=retry_s)

    def _mark_in_use(self, folder: str, container: Container) -> None:
        """A run is on ``container`` from now until WarmRun has cleaned up after it
        (the dirty marker), and it was used now (the LRU order)."""
        host_only_dir(state_dir(self.settings, folder))
        _dirty_marker(self.settings, folder, str(container.id)).touch()
        _used_marker(self.settings, folder, str(container.id)).touch()

    def _claim(self, spec: ContainerSpec, config: str) -> Container | None:
        """The group's running warm container of this configuration, marked in use;
        any other of the group's (stopped, stale, or never cleaned up after a run)
        is removed.  Call with the lock held."""
        claimed = None
        for c in self.find(spec.group_folder):
            if claimed is None and c.status == "running" and self._config_of(c, spec.group_folder) == config:
                if not _dirty_marker(self.settings, spec.group_folder, str(c.id)).exists():
                    claimed = c
                    continue
                # A run on it never finished cleanly (a worker died mid-run):
                # what that run started may still be running. Never reuse it.
                log.info("warm container %s was not cleaned up after its last run; replacing it", c.name)
            else:
                log.info("replacing warm container %s (%s)", c.name, c.status)
            self.discard(c)
        if claimed is not None:
            self._mark_in_use(spec.group_folder, claimed)
        return claimed

    def _create(self, spec: ContainerSpec, config: str, idle: float) -> Container:
        """A new warm container for the group, started and marked in use."""
        # Created here, not by Docker (which would make it root's and unwritable).
        spec.workspace.mkdir(parents=True, exist_ok=True)
        prepare_folder(spec.workspace)  # the user it runs as: container_user()
        # Whatever an agent left where the new runner will bind (a symlink, a
        # folder): gone before the container starts, so the first connection
        # can only reach the new runner's socket.
        remove_entry(spec.workspace, RUNNER_SOCKET)
        host_only_dir(gateway_dir(self.settings, spec.group_folder))
        # The very arguments its configuration was computed from.
        args = self._create_args(spec, idle)
        args["labels"][LABEL_WARM_CONFIG] = config
        try:
            container = self.client.containers.create(**args)
        except DockerException as exc:
            raise SandboxError(f"cannot create a warm agent container: {exc}") from exc
        # In use before it runs: another process making room never takes it for idle.
        self._mark_in_use(spec.group_folder, container)
        try:
            container.start()
            container.reload()
        except DockerException as exc:
            self.discard(container)
            raise SandboxError(f"cannot start a warm agent container: {exc}") from exc
        return container


def _connect_runner(folder: Path, relative: str, *, retry_s: float) -> tuple[socket.socket, SocketIdentity]:
    """Connect to the warm runner's socket at ``relative`` in ``folder`` (the workspace,
    or a standby's socket folder).

    The socket lives in the agent's own workspace (so the agent cannot use it
    to fill any other disk than its quota'd one), which makes the entry
    hostile: it is reached with no symlink followed and only if it is a
    socket (``hostile_fs.connect_unix``).  ``retry_s``: a fresh runner may not
    listen yet (ECONNREFUSED, or no entry at all): keep trying that long.
    """
    deadline = time.monotonic() + retry_s
    while True:
        try:
            return connect_unix_named(folder, relative)
        except (ConnectionRefusedError, HostileEntry) as exc:
            if isinstance(exc, HostileEntry) and exc.reason != "no such file":
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def _dirty_marker(settings: Settings, folder: str, container_id: str) -> Path:
    """Exists while a run is in progress on the warm container ``container_id``."""
    return state_dir(settings, folder) / f"{container_id[:12]}.dirty"


class WarmRun(StreamedRun):
    """One run on a warm container; the same surface as ``sandbox.RunningContainer``."""

    def __init__(
        self,
        container: Container,
        sock: socket.socket,
        spec: ContainerSpec,
        payload: bytes,
        *,
        start_mode: StartMode,
        dirty_marker: Path,
        pool: WarmPool,
    ) -> None:
        self._container = container
        self._sock = sock
        self._dirty = dirty_marker
        self._pool = pool
        self.spec = spec
        # How it was had: a new container, a warm one reused, or a standby one adopted (a metric's label).
        self.start_mode = start_mode
        self.cold = start_mode != "warm"  # its runner just started (the run's trace says so)
        self.exit = None
        self._started = datetime.now(UTC)
        self._killed = False
        # The runner closed the stream (not a read error), and the last line it wrote.
        self._closed_by_runner = False
        self._last_line = ""
        self._spare: KeepEvent | None = None  # the runner's own process to keep (its CLI)
        self._watch(f"warm run in {container.name}", spec.timeout_s)
        try:
            sock.sendall(payload + b"\n")
            self._beat(sock.sendall, spec.fence_s)  # the connection stays open for the run
        except OSError as exc:
            log.warning("could not hand the run to %s: %s", container.name, exc)

    def kill(self) -> None:
        self._killed = True
        with contextlib.suppress(DockerException):
            self._container.kill()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def keep(self, process: KeepEvent) -> None:
        """Spare ``process`` at the clean-up, under runc only: under gVisor the agent can
        write into the runner's streams (``/proc/1/fd``), so the event may be its own."""
        if self._container.attrs.get("HostConfig", {}).get("Runtime") == RUNC.name:
            self._spare = process
        else:
            log.info("not sparing process %d of %s: not under runc", process.pid, self._container.name)

    def _chunks(self) -> Iterator[bytes]:
        """The run's output as it comes, until the runner closes the connection."""
        try:
            while chunk := self._sock.recv(65536):
                yield chunk
            self._closed_by_runner = True
        except OSError as exc:
            log.warning("lost the warm run's stream from %s: %s", self._container.name, exc)

    def lines(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Iterator[str]:
        for line in super().lines(max_line_bytes):
            if line.strip():
                self._last_line = line
            yield line

    def _answered(self) -> bool:
        """The runner ended the run with its result and closed the stream itself: it is
        back to waiting for the next run (a runner that died, or ended with an error,
        says nothing of the kind)."""
        if self._killed or not self._closed_by_runner or not self._last_line:
            return False
        try:
            return isinstance(parse_event(self._last_line), ResultEvent)
        except ProtocolError:
            return False

    def _log_tail(self) -> str:
        """The end of the runner's log since the run started, read in bounded memory
        (the agent can write to the runner's stderr at will)."""
        tail = TailBuffer()
        # OSError: requests' errors too (the container may vanish mid-read: auto-remove).
        with contextlib.suppress(DockerException, OSError):
            # follow=False: streaming would otherwise follow a live container's log forever.
            stream = self._container.logs(
                stdout=False,
                stderr=True,
                since=self._started,
                tail=LOG_TAIL_LINES,
                stream=True,
                follow=False,
            )
            try:
                for chunk in stream:
                    tail.write(chunk)
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()
        return tail.text()

    def finish(self) -> ContainerExit:
        """The run's "exit": 0 while the runner lives on (the pipeline judges the
        events), else the container's own exit status."""
        self._watchdog.cancel()
        self._stop_beats()
        if self._answered():
            # Alive, and a run that went well: no Docker API call, and its log stays in
            # Docker's (``docker logs``) rather than being copied into the worker's.
            return self._ended(str(self._container.name), 0, "")
        stderr = self._log_tail()
        try:
            self._container.reload()
            alive = self._container.status == "running"
        except DockerException:
            alive = False
        status: int | None = 0
        if self._killed or not alive:
            try:
                status = int(self._container.wait(timeout=10).get("StatusCode", -1))
            except NotFound:  # already gone (auto-remove)
                status = 137 if self._killed else -1
            except Exception as exc:  # noqa: BLE001 - any other failure here means "unknown" too
                log.warning("could not read the exit status of %s: %s", self._container.name, exc)
                status = 137 if self._killed else -1
            with contextlib.suppress(DockerException):
                self._container.remove(force=True)
        return self._ended(str(self._container.name), status, stderr)

    def _close(self) -> None:
        self._stop_beats()
        with contextlib.suppress(OSError):
            self._sock.close()
        self._clean_up()

    def _clean_up(self) -> None:
        """Kill everything the run left behind (background and ``setsid``
        processes) before the container may take another run; a container that
        cannot be cleaned is removed.  Runs after the replies were stored.

        Done by the host, not by the runner, which shares its uid with the
        agent and so cannot be trusted to do it.  Every process in the
        container's pid namespace but the runner is killed (through a pidfd,
        so a recycled pid is never hit); where this worker cannot see the
        container's processes (it runs in a pid namespace of its own) or may
        not read the runner's namespace (a host user that is not root: the
        runner is undumpable), a ``docker exec`` of ``kill -9 -1`` does it (all
        but PID 1, the runner).
        The runner reaps the zombies.  The runner's own kept process (``keep``: a
        Claude Code CLI with the group's session open) is spared when it is still that
        process (its pid and start time); ``docker exec`` spares nothing.
        """
        if self._killed:
            self._pool.discard(self._container)
            return
        try:
            runner_pid = int(self._container.attrs["State"]["Pid"])
            cleaned = kill_all_but(runner_pid, self.id, spare=self._spare)
            if cleaned is None:
                result = self._container.exec_run(["/bin/bash", "-c", "kill -9 -1 2>/dev/null; exit 0"], stdin=False)
                if result.exit_code != 0:
                    raise SandboxError(f"exit status {result.exit_code}")
            elif not cleaned:
                raise SandboxError("processes kept appearing (a fork bomb?)")
        except (DockerException, SandboxError, KeyError, ValueError) as exc:
            # Gone (idle exit, crash) or beyond cleaning: never reuse it.
            log.info("could not clean up warm container %s after a run (%s); removing it", self._container.name, exc)
            self._pool.discard(self._container)
            return
        with contextlib.suppress(FileNotFoundError):
            self._dirty.unlink()


def _stat(pid: str) -> tuple[str, int]:
    """A process's state and start time (clock ticks after boot)."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    return fields[0].decode(), int(fields[19])


def _spared(pid: str, spare: KeepEvent | None, stat: tuple[str, int]) -> bool:
    """Is ``pid`` the process ``spare`` names: started then, with that pid in the container
    (the last of ``NSpid``)?  A pid and a start time name one process since boot; its parent
    is not asked (any orphan of the agent's is the runner's child too)."""
    if spare is None or stat[1] != spare.started:
        return False
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("NSpid:"):
                return line.split()[-1] == str(spare.pid)
    return False


def kill_all_but(
    runner_pid: int, container_id: str, rounds: int = 20, *, spare: KeepEvent | None = None
) -> bool | None:
    """SIGKILL every process in the pid namespace of ``runner_pid`` (the
    runner of container ``container_id``) except the runner, and ``spare``
    (a process the runner named, by its pid in the container and its start).

    True when none is left (zombies aside), False when processes kept
    appearing for ``rounds`` rounds, None when this process cannot see the
    container's processes (or the pid is not that container's any more).
    """
    try:
        namespace = os.readlink(f"/proc/{runner_pid}/ns/pid")
        with open(f"/proc/{runner_pid}/cgroup") as fh:
            in_container = container_id in fh.read()
        # Never our own namespace: a stale pid must not make this kill the host's processes.
        if not in_container or namespace == os.readlink("/proc/self/ns/pid"):
            return None
    except OSError:
        return None
    for _ in range(rounds):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == runner_pid:
                continue
            try:
                fd = os.pidfd_open(int(entry))
            except OSError:
                continue
            try:
                # Checked after the pidfd is open: it names this very process.
                if os.readlink(f"/proc/{entry}/ns/pid") == namespace:
                    stat = _stat(entry)
                    if stat[0] != "Z" and not _spared(entry, spare, stat):
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                        found = True
            except OSError:
                pass
            finally:
                os.close(fd)
        if not found:
            return True
        time.sleep(0.002)
    return False
