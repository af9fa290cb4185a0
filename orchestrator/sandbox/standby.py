"""Standby sandboxes: hardened containers started before a group needs one.

A quiet group's first run used to pay for a container start (about 400 ms
here).  A host keeps ``ORCHESTRATOR_STANDBY`` containers started ahead,
belonging to no group, each with the hardening of any agent container (no
network, uid 1000, every capability dropped, read-only root, the
installation's default limits).  When a group with no warm container needs
a run, the warm pool (``warm/``) takes one, binds the group's workspace and
gateway folder into it (:mod:`late_mounts`), and hands it the run; from then
on it is that group's warm container and never serves another group.  The
heartbeat's tending starts replacements.

How a folder reaches a running container: each standby has a *slot*,
``data/standby/<slot>/``, the host's own (root, 0755, never mounted whole):

* ``workspace/`` (empty, root's) is bound at ``/workspace`` with ``rslave``
  propagation, ``gateway/`` read-only at ``/run/gateway`` the same way; the
  group's folders are bound *onto* them at adoption and the binds propagate
  into the container (``data/standby`` is a shared mount for that).  A bind
  on one slot's folder never reaches another slot's container: propagation
  follows the path, and no slot's path is inside another's.
* ``sockets/`` is a 64 KiB tmpfs owned by uid 1000, bound at
  ``/run/standby``: the runner's socket lives there (``--serve
  /run/standby/agent.sock --standby``), so the host can hand it a run before
  it has any workspace.  After adoption the agent can write there too, and
  it is hostile like the workspace: reached only by ``hostile_fs.connect_unix``
  and never walked, only unmounted.
* ``taken`` (host-only) names the group once the slot is adopted.

Only groups that would get exactly such a container are served: the default
image and limits, no extra mounts; any other group starts its own warm
container as before.  Where this process cannot bind folders (not root, or
no mount API), standby is off, said once in the log, and quiet groups start
cold.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import docker
from docker.errors import DockerException, NotFound
from docker.models.containers import Container

from orchestrator.core.errors import SandboxError
from orchestrator.core.settings import Settings
from orchestrator.sandbox import late_mounts
from orchestrator.sandbox.containers import (
    CONTAINER_UID,
    GATEWAY_MOUNT,
    LABEL_INSTALL,
    LABEL_MANAGED,
    LABEL_RUN,
    LABEL_WARM,
    WORKSPACE_MOUNT,
    ContainerSpec,
    engine_security_opt,
    hardened_create_args,
    image_id,
    labels_of,
    list_containers,
)
from orchestrator.sandbox.runtime import engine_runtime

log = logging.getLogger(__name__)

# The slot a standby container uses (its value); present on standby containers only.
LABEL_STANDBY = "orchestrator.standby"
# What a standby container was made for (image id, limits): only a match is taken.
LABEL_STANDBY_KEY = "orchestrator.standby-key"
SOCKET_MOUNT = "/run/standby"
SOCKET_NAME = "agent.sock"
SOCKET_TMPFS_SIZE = "64k"
# An unadopted standby exits after this long (and is replaced): one left by a
# host that is gone for good does not live forever.
STANDBY_WAIT_S = 3600.0
# A slot folder with no container is released only when older than this: its
# container may be being created right now (by another host on this data dir).
SLOT_GRACE_S = 60.0
# Bumped when a standby's mounts change: older ones are replaced.
STANDBY_LAYOUT = 1
TAKEN = "taken"

# Per data dir: why this process cannot make late mounts (None: it can), probed once.
_probed: dict[Path, str | None] = {}


def standby_root(settings: Settings) -> Path:
    return settings.data_dir / "standby"


@dataclass(frozen=True)
class Slot:
    """A standby container's folders on the host (see the module docstring)."""

    root: Path

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    @property
    def gateway(self) -> Path:
        return self.root / "gateway"

    @property
    def sockets(self) -> Path:
        return self.root / "sockets"

    def taken_by(self) -> str | None:
        """The group folder that adopted this slot (None: still in the pool)."""
        try:
            return (self.root / TAKEN).read_text(encoding="utf-8").strip() or None
        except OSError:
            return None


def unavailable_reason(settings: Settings, client: docker.DockerClient) -> str | None:
    """Why standby sandboxes are off here, or None when they are on."""
    if settings.sandbox.standby <= 0:
        return "ORCHESTRATOR_STANDBY=0"
    if settings.sandbox.warm_idle_s <= 0:
        return "warm sessions are off (ORCHESTRATOR_WARM_IDLE_S=0), and an adopted standby is a warm container"
    root = standby_root(settings)
    if root not in _probed:
        if engine_runtime(client, settings).gvisor:
            # gVisor's gofer serves a bind mount as it was at the container's start: a folder
            # bound over it later is not seen inside (docs/sandbox.md, "gVisor").
            _probed[root] = "under gVisor (runsc) a folder bound into a running container is not seen inside it"
        else:
            _probed[root] = late_mounts.unavailable_reason(settings.data_dir / "warm")
        if _probed[root] is not None:
            log.warning("standby sandboxes: off (%s); a quiet group's first run starts a container", _probed[root])
    return _probed[root]


def standby_key(client: docker.DockerClient, settings: Settings) -> str:
    """What a standby container is made with; a group whose run needs the same is served."""
    doc = {
        "image": image_id(client, settings.sandbox.agent_image),
        "memory": settings.sandbox.container_memory,
        "cpus": settings.sandbox.container_cpus,
        "pids": settings.sandbox.container_pids,
        "idle": settings.sandbox.warm_idle_s,
        "layout": STANDBY_LAYOUT,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def eligible(settings: Settings, spec: ContainerSpec) -> bool:
    """Whether ``spec`` asks for exactly what a standby container has."""
    return (
        spec.image == settings.sandbox.agent_image
        and spec.memory == settings.sandbox.container_memory
        and spec.cpus == settings.sandbox.container_cpus
        and spec.pids == settings.sandbox.container_pids
        and not spec.extra_mounts
        and not spec.readonly_mounts
    )


class StandbyPool:
    """This host's standby containers: started ahead, taken once, released when gone."""

    def __init__(self, settings: Settings, client: docker.DockerClient, host_id: str, host_label: str) -> None:
        self.settings = settings
        self.client = client
        self.host_id = host_id
        self.host_label = host_label  # warm.LABEL_HOST (not imported: warm imports this module)

    def _labels(self, *, any_host: bool = False) -> list[str]:
        labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={self.settings.install_id}", LABEL_STANDBY]
        return labels if any_host else [*labels, f"{self.host_label}={self.host_id}"]

    def containers(self, *, any_host: bool = False, running_only: bool = True) -> list[Container]:
        filters: dict[str, str | list[str] | bool] = {"label": self._labels(any_host=any_host)}
        if running_only:
            filters["status"] = "running"
        return list_containers(self.client, all=not running_only, filters=filters)

    def slot_of(self, container: Container) -> Slot | None:
        name = labels_of(container).get(LABEL_STANDBY, "")
        if not name or "/" in name or name.startswith("."):
            return None
        return Slot(standby_root(self.settings) / name)

    def ready(self, key: str | None = None) -> list[tuple[Container, Slot]]:
        """This host's standby containers in the pool whose runner listens (its socket
        is bound; before a group takes one nothing but the runner runs in it), of
        ``key`` if given, oldest first."""
        out = []
        for c in sorted(self.containers(), key=lambda c: c.attrs.get("Created", "")):
            slot = self.slot_of(c)
            if slot is None or slot.taken_by() is not None or (key and c.labels.get(LABEL_STANDBY_KEY) != key):
                continue
            if os.path.lexists(slot.sockets / SOCKET_NAME):
                out.append((c, slot))
        return out

    def take(self, folder: str) -> tuple[Container, Slot] | None:
        """A ready standby container of the current key, now ``folder``'s (its slot
        marked taken), or None.  The caller holds the warm pool's lock."""
        for c, slot in self.ready(standby_key(self.client, self.settings))[:1]:
            (slot.root / TAKEN).write_text(folder + "\n", encoding="utf-8")
            return c, slot
        return None

    def attach(self, container: Container, slot: Slot, workspace: Path, gateway: Path) -> None:
        """Bind the group's workspace and gateway folder into the taken slot: they
        appear at ``/workspace`` and (read-only) ``/run/gateway`` in its container.

        Then checked from the container's side (its root as the kernel shows it,
        ``/proc/<pid>/root``: the image's read-only root, nothing the agent can
        plant a link in): a worker in another mount namespace than the engine's
        binds where no container sees it, and a run would meet an empty
        workspace.  Where it is not seen, or cannot be checked, standby goes off
        for this process and raises :class:`SandboxError`."""
        late_mounts.bind(workspace, slot.workspace)
        late_mounts.bind(gateway, slot.gateway, read_only=True)
        try:
            pid = int(container.attrs["State"]["Pid"])
            inside = os.stat(f"/proc/{pid}/root{WORKSPACE_MOUNT}")
            seen = (inside.st_dev, inside.st_ino) == (os.stat(workspace).st_dev, os.stat(workspace).st_ino)
        except (KeyError, ValueError, OSError):
            seen = False
        if not seen:
            reason = (
                "a folder bound after a container started is not seen inside it (this worker and the "
                "Docker engine do not share mounts, or its processes are not visible here)"
            )
            _probed[standby_root(self.settings)] = reason
            log.warning("standby sandboxes: off (%s); a quiet group's first run starts a container", reason)
            raise SandboxError(reason)

    def release(self, slot: Slot) -> None:
        """Unmount everything of a slot whose container is gone, and remove its
        folders; never walks into them (a bind may still be on one)."""
        for target in (slot.workspace, slot.gateway, slot.sockets):
            try:
                late_mounts.detach(target)
            except OSError as exc:
                log.warning("could not unmount %s: %s", target, exc)
        for entry in (slot.workspace, slot.gateway, slot.sockets):
            with contextlib.suppress(OSError):
                entry.rmdir()  # an empty folder only: never a tree that may still be a group's
        with contextlib.suppress(OSError):
            (slot.root / TAKEN).unlink()
        with contextlib.suppress(OSError):
            slot.root.rmdir()

    def prune(self, want: int) -> int:
        """Release the slots whose container is gone and remove standby containers made
        for another key (a rebuilt image, new limits) or past ``want``; returns how
        many to start so that ``want`` wait in the pool.  The caller holds the warm
        pool's lock (a container being taken is never pruned) and starts them after."""
        root = standby_root(self.settings)
        everyone = self.containers(any_host=True, running_only=False)
        live = {c.labels.get(LABEL_STANDBY) for c in everyone if c.status in ("created", "running")}
        for c in everyone:
            if c.status not in ("created", "running"):
                with contextlib.suppress(DockerException):
                    c.remove(force=True)
        if root.is_dir():
            for entry in root.iterdir():
                if entry.name.startswith(".") or entry.name in live or not entry.is_dir():
                    continue
                with contextlib.suppress(OSError):
                    if time.time() - entry.stat().st_mtime < SLOT_GRACE_S:
                        continue
                self.release(Slot(entry))
        key = standby_key(self.client, self.settings)
        waiting = 0
        for c in self.containers():
            slot = self.slot_of(c)
            if slot is None or slot.taken_by() is not None:
                continue
            if c.labels.get(LABEL_STANDBY_KEY) != key or waiting >= want:
                self.discard(c)
                continue
            waiting += 1
        return want - waiting

    def discard(self, container: Container) -> None:
        """Remove a standby container and release its slot."""
        with contextlib.suppress(NotFound, DockerException):
            container.remove(force=True)
        slot = self.slot_of(container)
        if slot is not None:
            self.release(slot)

    def start(self, key: str) -> Container:
        """Start one standby container in a new slot."""
        root = standby_root(self.settings)
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o755)
        late_mounts.make_shared(root)
        slot = Slot(root / os.urandom(6).hex())
        for folder in (slot.root, slot.workspace, slot.gateway, slot.sockets):
            folder.mkdir(mode=0o755)
        late_mounts.tmpfs(slot.sockets, size=SOCKET_TMPFS_SIZE, uid=CONTAINER_UID)
        spec = ContainerSpec(
            image=self.settings.sandbox.agent_image,
            name=f"orch-standby-{slot.name}",
            workspace=slot.workspace,
            run_id="",
            group_folder="",
            memory=self.settings.sandbox.container_memory,
            cpus=self.settings.sandbox.container_cpus,
            pids=self.settings.sandbox.container_pids,
            install_id=self.settings.install_id,
        )
        args = hardened_create_args(
            spec,
            f"{CONTAINER_UID}:{CONTAINER_UID}",
            engine_security_opt(self.client),
            engine_runtime(self.client, self.settings),
        )
        args["volumes"] = {
            str(slot.workspace): {"bind": WORKSPACE_MOUNT, "mode": "rw,rslave"},
            str(slot.gateway): {"bind": GATEWAY_MOUNT, "mode": "ro,rslave"},
            str(slot.sockets): {"bind": SOCKET_MOUNT, "mode": "rw"},
        }
        args["labels"] = {
            **args["labels"],
            LABEL_WARM: "1",
            self.host_label: self.host_id,
            LABEL_STANDBY: slot.name,
            LABEL_STANDBY_KEY: key,
        }
        args["labels"].pop(LABEL_RUN, None)
        try:
            container = self.client.containers.create(
                command=[
                    "--serve",
                    f"{SOCKET_MOUNT}/{SOCKET_NAME}",
                    "--standby",
                    f"{STANDBY_WAIT_S:g}",
                    "--idle-timeout",
                    f"{self.settings.sandbox.warm_idle_s:g}",
                ],
                auto_remove=True,
                **args,
            )
        except DockerException as exc:
            self.release(slot)
            raise SandboxError(f"cannot create a standby container: {exc}") from exc
        try:
            container.start()
        except DockerException as exc:
            self.discard(container)
            raise SandboxError(f"cannot start a standby container: {exc}") from exc
        return container

    def stop_all(self) -> int:
        """Remove every standby container of this installation (any host) and release every slot."""
        found = self.containers(any_host=True, running_only=False)
        for c in found:
            self.discard(c)
        root = standby_root(self.settings)
        if root.is_dir():
            for entry in root.iterdir():
                if entry.is_dir() and not entry.name.startswith("."):
                    self.release(Slot(entry))
            with contextlib.suppress(OSError):
                late_mounts.detach(root)
        return len(found)
