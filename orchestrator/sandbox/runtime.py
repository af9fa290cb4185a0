"""Which OCI runtime runs agent containers: runc, or gVisor's runsc (a second wall).

``ORCHESTRATOR_SANDBOX_RUNTIME``:

* ``runc`` (the default): the engine's runc, named explicitly so that an engine whose
  default runtime is something else still runs the agent the way the docs say.
* ``runsc``: gVisor.  The agent's system calls meet gVisor's user-space kernel, not the
  host's.  Before the first container, a probe proves it on this engine: the sandbox
  reports gVisor's kernel, a program past its memory limit is killed, a process past
  the pid cap is refused or its sandbox killed, and a unix socket crosses the bind
  mount both ways (warm sessions and the model gateway need that: ``runsc
  --host-uds=all``).  A probe that fails stops the process with the reason
  (:class:`~orchestrator.core.errors.SandboxError`): runsc is never used without them.
* ``auto``: runsc when the engine has a runtime of that name and the probe passes,
  else runc, with a log line saying which and why.

What gVisor cannot do here (docs/sandbox.md, "gVisor"): a folder bound into a running
container later is not seen inside it, so standby sandboxes are off under runsc (a log
line says so, ``standby.unavailable_reason``); and each process inside costs several
host threads (the ptrace platform traces every task), so the host's pid cap is scaled
(:func:`host_pids`) and, past it, the whole sandbox is killed rather than a fork refused.

``scripts/gvisor.sh`` installs runsc and registers it with the engine the documented
way (``runsc install``, then SIGHUP: the engine reloads runtimes without a restart).
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import docker
from docker.errors import DockerException

from orchestrator.core.errors import SandboxError
from orchestrator.core.settings import Settings

log = logging.getLogger(__name__)

GVISOR = "runsc"
# Host threads a gVisor sandbox holds before the agent starts anything (the sentry, the
# gofer, their Go runtimes: 38 measured on the ptrace platform), and per process inside
# (the ptrace platform's stub and tracer threads: about 6 measured).  bench/gvisor.py.
GVISOR_BASE_PIDS = 64
GVISOR_PIDS_PER_PROCESS = 8
PROBE_MEMORY = "64m"
PROBE_TIMEOUT_S = 60.0
_SOCKET_NAME = "probe.sock"
_PROBE_PROGRAM = r"""
import os, socket, subprocess, sys
if sys.argv[1] == "pids":
    children = []
    try:
        for _ in range(int(sys.argv[2])):
            children.append(subprocess.Popen(["sleep", "30"]))
        print("pids-unbounded", len(children), flush=True)
    except OSError:
        print("pids-refused", len(children), flush=True)
    sys.exit(0)
print("kernel", os.uname().release, flush=True)
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("/probe/host.sock")
    print("uds-open", s.recv(16).decode(), flush=True)
except OSError as exc:
    print("uds-open-failed", exc, flush=True)
hog = []
for i in range(1, 41):
    hog.append(bytearray(8 * 1024 * 1024))
print("memory-unbounded", flush=True)
"""


@dataclass(frozen=True)
class Runtime:
    """The runtime agent containers get, and what it changes."""

    name: str  # the engine's name for it
    gvisor: bool

    def host_pids(self, pids: int) -> int:
        """The engine's pid cap for a container whose agent may run ``pids`` processes."""
        return GVISOR_BASE_PIDS + pids * GVISOR_PIDS_PER_PROCESS if self.gvisor else pids


RUNC = Runtime("runc", False)
# Per engine (its API's address) and setting: chosen (and probed) once per process.
_chosen: dict[tuple[str, str, str], Runtime] = {}
_lock = threading.Lock()


def engine_runtime(client: docker.DockerClient, settings: Settings, gvisor: str = GVISOR) -> Runtime:
    """The runtime for agent containers on this engine under ``settings`` (``gvisor``:
    the engine's name for runsc)."""
    wanted = settings.sandbox.runtime
    if wanted == "runc":
        return RUNC
    key = (str(getattr(client.api, "base_url", "")), wanted, gvisor)
    with _lock:
        if key not in _chosen:
            _chosen[key] = _choose(client, settings, gvisor)
        return _chosen[key]


def _choose(client: docker.DockerClient, settings: Settings, gvisor: str) -> Runtime:
    wanted = settings.sandbox.runtime
    problem = gvisor_problem(client, settings.sandbox.agent_image, runtime=gvisor)
    if problem is None:
        log.info("agent containers run under gVisor (%s): its probe passed on this engine", gvisor)
        return Runtime(gvisor, True)
    if wanted == "runsc":
        raise SandboxError(f"ORCHESTRATOR_SANDBOX_RUNTIME=runsc, but gVisor cannot be used here: {problem}")
    log.warning("agent containers run under runc, not gVisor: %s", problem)
    return RUNC


def gvisor_problem(client: docker.DockerClient, image: str, pids: int = 16, runtime: str = GVISOR) -> str | None:
    """Why gVisor cannot run agent containers on this engine, or None when it can: a
    container under ``runtime`` must report gVisor's kernel, reach a host socket bound
    into it, be refused (or killed) past ``pids`` processes and be killed past its memory."""
    try:
        runtimes = client.info().get("Runtimes") or {}
    except DockerException as exc:
        return f"cannot reach the Docker engine: {exc}"
    if runtime not in runtimes:
        return f"the engine has no runtime named {runtime!r} (scripts/gvisor.sh registers it)"
    with tempfile.TemporaryDirectory(prefix="orchestrator-gvisor-") as tmp:
        folder = Path(tmp)
        os.chmod(folder, 0o755)
        listener = socket.socket(socket.AF_UNIX)
        try:
            listener.bind(str(folder / "host.sock"))
            os.chmod(folder / "host.sock", 0o777)
            listener.listen(1)
            threading.Thread(target=_answer_once, args=(listener,), daemon=True).start()
            memory = _run_probe(client, runtime, image, folder, pids, ["memory"])
        finally:
            listener.close()
        return _judge_memory(*memory) or pid_cap_problem(client, image, pids, runtime)


def pid_cap_problem(client: docker.DockerClient, image: str, pids: int = 16, runtime: str = GVISOR) -> str | None:
    """Why ``runtime`` does not hold a container to ``pids`` processes (None: past the cap a
    fork is refused, or the sandbox killed): the probe starts four times as many."""
    with tempfile.TemporaryDirectory(prefix="orchestrator-gvisor-") as tmp:
        return _judge_pids(*_run_probe(client, runtime, image, Path(tmp), pids, ["pids", str(pids * 4)]), pids)


def _answer_once(listener: socket.socket) -> None:
    listener.settimeout(PROBE_TIMEOUT_S)
    try:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(b"ok")
    except OSError:
        pass  # closed by the probe's end


def _run_probe(
    client: docker.DockerClient, runtime: str, image: str, folder: Path, pids: int, argv: list[str]
) -> tuple[int | None, list[str]]:
    """Run the probe program under ``runtime`` with ``argv``: its exit status and stdout lines."""
    container = None
    try:
        container = client.containers.create(
            image,
            entrypoint=["python3", "-c", _PROBE_PROGRAM, *argv],
            runtime=runtime,
            user="1000:1000",
            network_mode="none",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            read_only=True,
            mem_limit=PROBE_MEMORY,
            memswap_limit=PROBE_MEMORY,
            pids_limit=Runtime(runtime, True).host_pids(pids),
            volumes={str(folder): {"bind": "/probe", "mode": "ro"}},
            labels={"orchestrator.probe": "gvisor"},
        )
        container.start()
        status = int(container.wait(timeout=PROBE_TIMEOUT_S).get("StatusCode", -1))
        lines = container.logs(stdout=True, stderr=False).decode("utf-8", "replace").splitlines()
        return status, lines
    except Exception as exc:  # noqa: BLE001 - any failure of the probe is a reason not to use gVisor
        return None, [f"probe-error {exc}"]
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except DockerException:
                pass


def _said(lines: list[str]) -> dict[str, str]:
    return {line.split(" ", 1)[0]: line.partition(" ")[2] for line in lines}


def _judge_memory(status: int | None, lines: list[str]) -> str | None:
    """The first probe's verdict: gVisor's kernel, the host socket reached, killed past its memory."""
    said = _said(lines)
    if "probe-error" in said:
        return f"a container under runsc did not run: {said['probe-error'][:300]}"
    kernel = said.get("kernel")
    if kernel is None:
        return f"a container under runsc printed nothing (exit status {status})"
    if kernel == os.uname().release:
        return f"the sandbox reports the host's kernel ({kernel}): runsc is not gVisor here"
    if said.get("uds-open") != "ok":
        return (
            "a unix socket bound into the sandbox cannot be reached from inside "
            f"({said.get('uds-open-failed', 'no answer')}): register runsc with --host-uds=all"
        )
    if "memory-unbounded" in said or status == 0:
        return f"the memory limit is not enforced: 320 MB allocated past a {PROBE_MEMORY} limit"
    return None


def _judge_pids(status: int | None, lines: list[str], pids: int) -> str | None:
    """The second probe's verdict: past the pid cap, a fork is refused or the sandbox killed."""
    said = _said(lines)
    if "probe-error" in said:
        return f"a container under runsc did not run: {said['probe-error'][:300]}"
    if "pids-unbounded" in said:
        return f"the pid cap is not enforced: {said['pids-unbounded']} processes started past a cap of {pids}"
    if "pids-refused" not in said and status == 0:
        return f"the pid probe ended with status {status} and said nothing"
    return None
