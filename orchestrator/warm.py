"""Warm sessions: a group's container stays up between runs.

A cold run pays for a container start and an interpreter start each time.
With ``ORCHESTRATOR_WARM_IDLE_S`` > 0 a group's container is started in the
runner's serve mode (``agent_runner/serve.py``) with the same hardening, the
group's workspace, and the group's *session folder* mounted at
``/run/orchestrator``.  A run connects to the runner's socket in that folder
(any worker process on this host can: the container is found by its labels,
not held by a process), writes the input line and reads event lines.

* idle: the runner exits after the idle timeout and Docker removes it
  (auto-remove); nothing on the host has to remember it;
* crashed or stale (its image or limits changed): replaced before the run,
  transparently;
* a run that times out or is cancelled kills the container: the next run
  starts a fresh one;
* ``orchestrator groups reset JID`` stops it and forgets the group's model
  session.

The run's model gateway socket, if any, is bound in the same session folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

import docker
from docker.errors import DockerException, NotFound
from sqlalchemy import update

from .db import Database
from .errors import SandboxError
from .groups import get_group
from .sandbox import (
    LABEL_GROUP,
    LABEL_INSTALL,
    LABEL_MANAGED,
    LABEL_RUN,
    LABEL_WARM,
    RUN_DIR_MOUNT,
    ContainerExit,
    ContainerSpec,
    docker_client,
    hardened_create_args,
    prepare_folder,
)
from .settings import Settings
from .tables import GroupRow

log = logging.getLogger(__name__)

LABEL_WARM_CONFIG = "orchestrator.warm-config"
AGENT_SOCKET = "agent.sock"
STARTUP_TIMEOUT_S = 20.0
CONNECT_ATTEMPTS = 2


def session_dir(settings: Settings, folder: str) -> Path:
    return settings.data_dir / "sessions" / folder


def _config_hash(client: docker.DockerClient, spec: ContainerSpec, idle_s: float) -> str:
    # The image id, not its tag: a rebuilt runner must not be served by an old container.
    try:
        image_id = client.images.get(spec.image).id
    except DockerException:
        image_id = spec.image
    doc = {
        "image": image_id, "memory": spec.memory, "cpus": spec.cpus, "pids": spec.pids, "idle": idle_s,
        "workspace": str(spec.workspace), "rw": spec.extra_mounts, "ro": spec.readonly_mounts,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def _connect(path: Path) -> socket.socket:
    """Connect to a unix socket whose path may be longer than sun_path allows."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    encoded = os.fsencode(path)
    if len(encoded) <= 107:
        sock.connect(str(path))
        return sock
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sock.connect(f"/proc/self/fd/{fd}/{path.name}")
    finally:
        os.close(fd)
    return sock


class WarmPool:
    """Finds, starts and replaces the warm containers of this installation."""

    def __init__(self, settings: Settings, client: docker.DockerClient) -> None:
        self.settings = settings
        self.client = client

    def _labels(self, folder: str) -> list[str]:
        return [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={self.settings.install_id}",
                f"{LABEL_WARM}=1", f"{LABEL_GROUP}={folder}"]

    def find(self, folder: str) -> list[docker.models.containers.Container]:
        return self.client.containers.list(all=True, filters={"label": self._labels(folder)})

    def stop(self, folder: str) -> int:
        """Stop and remove a group's warm container(s); returns how many."""
        stopped = 0
        for c in self.find(folder):
            with contextlib.suppress(NotFound, DockerException):
                c.remove(force=True)
                stopped += 1
        return stopped

    def stop_all(self) -> int:
        labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={self.settings.install_id}", f"{LABEL_WARM}=1"]
        stopped = 0
        for c in self.client.containers.list(all=True, filters={"label": labels}):
            with contextlib.suppress(NotFound, DockerException):
                c.remove(force=True)
                stopped += 1
        return stopped

    def start(self, spec: ContainerSpec, payload: bytes) -> WarmRun:
        idle = self.settings.warm_idle_s
        folder_path = session_dir(self.settings, spec.group_folder)
        config = _config_hash(self.client, spec, idle)
        last_error: Exception | None = None
        for _ in range(CONNECT_ATTEMPTS):
            container, cold = self._ensure(spec, folder_path, config, idle)
            try:
                sock = _connect(folder_path / AGENT_SOCKET)
            except OSError as exc:
                # Died between runs (or mid-idle-exit): replace it, transparently.
                log.info("warm container of %s did not answer (%s); replacing it", spec.group_folder, exc)
                last_error = exc
                with contextlib.suppress(NotFound, DockerException):
                    container.remove(force=True)
                continue
            return WarmRun(container, sock, spec, payload, cold=cold)
        raise SandboxError(f"cannot reach a warm agent container for {spec.group_folder}: {last_error}")

    def _ensure(
        self, spec: ContainerSpec, folder: Path, config: str, idle: float
    ) -> tuple[docker.models.containers.Container, bool]:
        for c in self.find(spec.group_folder):
            if c.status == "running" and c.labels.get(LABEL_WARM_CONFIG) == config:
                return c, False
            log.info("replacing warm container %s (%s)", c.name, c.status)
            with contextlib.suppress(NotFound, DockerException):
                c.remove(force=True)
        # Created here, not by Docker (which would make it root's and unwritable).
        spec.workspace.mkdir(parents=True, exist_ok=True)
        user = prepare_folder(spec.workspace)
        folder.mkdir(parents=True, exist_ok=True)
        prepare_folder(folder)
        with contextlib.suppress(FileNotFoundError):
            (folder / AGENT_SOCKET).unlink()
        args = hardened_create_args(spec, user)
        args["volumes"][str(folder)] = {"bind": RUN_DIR_MOUNT, "mode": "rw"}
        args["labels"] = {**args["labels"], LABEL_WARM: "1", LABEL_WARM_CONFIG: config}
        args["labels"].pop(LABEL_RUN, None)
        args["name"] = f"orch-warm-{spec.group_folder}-{os.urandom(3).hex()}"
        try:
            container = self.client.containers.create(
                command=["--serve", f"{RUN_DIR_MOUNT}/{AGENT_SOCKET}", "--idle-timeout", f"{idle:g}"],
                auto_remove=True, **args,
            )
            container.start()
        except DockerException as exc:
            raise SandboxError(f"cannot start a warm agent container: {exc}") from exc
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not (folder / AGENT_SOCKET).exists():
            if time.monotonic() > deadline:
                with contextlib.suppress(NotFound, DockerException):
                    container.remove(force=True)
                raise SandboxError(f"the warm agent container for {spec.group_folder} never opened its socket")
            time.sleep(0.01)
        container.reload()
        return container, True


class WarmRun:
    """One run on a warm container; the same surface as ``sandbox.RunningContainer``."""

    def __init__(
        self, container: docker.models.containers.Container, sock: socket.socket, spec: ContainerSpec,
        payload: bytes, *, cold: bool,
    ) -> None:
        self._container = container
        self._sock = sock
        self.spec = spec
        self.cold = cold
        self.exit: ContainerExit | None = None
        self._started = datetime.now(UTC)
        self._timed_out = threading.Event()
        self._killed = False
        self._watchdog = threading.Timer(spec.timeout_s, self._on_timeout)
        self._watchdog.daemon = True
        self._watchdog.start()
        try:
            sock.sendall(payload + b"\n")
        except OSError as exc:
            log.warning("could not hand the run to %s: %s", container.name, exc)

    @property
    def id(self) -> str:
        return str(self._container.id)

    def _on_timeout(self) -> None:
        self._timed_out.set()
        log.warning("warm run in %s hit its %.0fs limit; killing the container", self._container.name,
                    self.spec.timeout_s)
        self.kill()

    def kill(self) -> None:
        self._killed = True
        with contextlib.suppress(DockerException):
            self._container.kill()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def lines(self) -> Iterator[str]:
        buf = b""
        try:
            while chunk := self._sock.recv(65536):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    yield line.decode("utf-8", "replace")
        except OSError as exc:
            log.warning("lost the warm run's stream from %s: %s", self._container.name, exc)
        if buf.strip():
            yield buf.decode("utf-8", "replace")

    def finish(self) -> ContainerExit:
        """The run's "exit": 0 while the runner lives on (the pipeline judges the
        events), else the container's own exit status."""
        self._watchdog.cancel()
        stderr = ""
        with contextlib.suppress(DockerException):
            stderr = self._container.logs(stdout=False, stderr=True, since=self._started).decode("utf-8", "replace")
        try:
            self._container.reload()
            alive = self._container.status == "running"
        except DockerException:
            alive = False
        status: int | None = 0
        if self._killed or not alive:
            try:
                status = int(self._container.wait(timeout=10).get("StatusCode", -1))
            except Exception:  # noqa: BLE001 - already gone (auto-remove)
                status = 137 if self._killed else -1
            with contextlib.suppress(DockerException):
                self._container.remove(force=True)
        for line in stderr.splitlines()[-50:]:
            log.info("[%s] %s", self._container.name, line)
        self.exit = ContainerExit(status, self._timed_out.is_set(), stderr[-4000:])
        return self.exit

    def __enter__(self) -> WarmRun:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.exit is None:
            self.kill()
            self.finish()
        with contextlib.suppress(OSError):
            self._sock.close()


def reset_session(db: Database, settings: Settings, chat_jid: str, client: docker.DockerClient | None = None) -> int:
    """Start the group afresh: forget its model session, stop its warm container.

    Returns how many containers were stopped.
    """
    group = get_group(db, chat_jid)
    with db.write() as session:
        session.execute(update(GroupRow).where(GroupRow.chat_jid == chat_jid).values(session_id=None))
    return WarmPool(settings, client or docker_client(settings)).stop(group.folder)
