"""The agent plays the attacker against the host, with the real agent image,
the real Docker engine and the pipeline in-process (SQLite).  Everything a
container leaves behind is hostile: git configs, symlinks where the host
connects or binds, FIFOs and files swapped under the host's reads, processes
left running between warm runs.  Each test checks that nothing runs or is
read on the host, and that the next run still works.

Covered elsewhere: output floods (``test_output_bounds.py``), the gateway's
bounds (``tests/host/test_gateway.py``, ``test_gateway_flood.py``), the workspace
quota (``test_workspace_quota.py``) and every entry point of ``orchestrator/sandbox/hostile_fs.py``
(``tests/host/test_hostile_fs.py``, ``tests/host/test_context.py``).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from agent_runner.protocol import KeepEvent
from fakes.channel import RecordingChannel
from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.run.assembly import stored_input
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline, RunOutcome
from orchestrator.sandbox.containers import LABEL_INSTALL, LABEL_MANAGED
from orchestrator.sandbox.warm import kill_all_but, state_dir
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import get_messages_after
from tests.conftest import require_service

JID = "alpha@chat"


@dataclass
class Arena:
    settings: Settings
    db: Database
    pipeline: Pipeline
    base: Path

    @property
    def workspace(self) -> Path:
        return self.settings.groups_dir / "alpha"

    def ask(
        self, text: str, metadata: dict[str, object] | None = None, state: str = "succeeded"
    ) -> tuple[RunOutcome, list[StoredMessage]]:
        sent = ingest(
            self.db,
            self.settings,
            IncomingMessage(chat_jid=JID, sender="u", content=text, metadata=metadata),
            signal=None,
        ).message
        outcomes = self.pipeline.drain_group(JID)
        assert [o.run.state for o in outcomes] == [state], [o.run.error for o in outcomes]
        return outcomes[0], get_messages_after(JID, sent.seq, db=self.db)

    def containers(self) -> list:
        labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={self.settings.install_id}"]
        return docker.from_env().containers.list(all=True, filters={"label": labels})


def _arena(base: Path, agent_image: str, warm_idle_s: float, runtime: str = "runc") -> Iterator[Arena]:
    settings = Settings.load(
        data_dir=base / "data",
        agent_image=agent_image,
        run_timeout_s=60,
        max_attempts=1,
        warm_idle_s=warm_idle_s,
        sandbox_runtime=runtime,
        env_file=None,
    )
    settings.ensure_dirs()
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    db.migrate()
    add_group(db, chat_jid=JID, name="alpha", folder="alpha", requires_trigger=False)
    arena = Arena(settings, db, Pipeline(settings, db, ChannelRegistry([RecordingChannel()])), base)
    yield arena
    for c in arena.containers():
        c.remove(force=True)
    db.dispose()


@pytest.fixture
def cold(tmp_path_factory: pytest.TempPathFactory, agent_image: str) -> Iterator[Arena]:
    yield from _arena(tmp_path_factory.mktemp("hostile").resolve(), agent_image, 0)


@pytest.fixture
def warm(tmp_path_factory: pytest.TempPathFactory, agent_image: str) -> Iterator[Arena]:
    yield from _arena(tmp_path_factory.mktemp("hostile").resolve(), agent_image, 120)


@pytest.fixture
def gvisor(tmp_path_factory: pytest.TempPathFactory, agent_image: str) -> Iterator[Arena]:
    """Warm, under gVisor (registered by scripts/gvisor.sh)."""
    require_service("runsc" in (docker.from_env().info().get("Runtimes") or {}), "gVisor (scripts/gvisor.sh)")
    yield from _arena(tmp_path_factory.mktemp("hostile").resolve(), agent_image, 120, "runsc")


def _tool_outputs(outputs: list[StoredMessage]) -> list[str]:
    return [m.content for m in outputs if m.message_type == "tool_result"]


def _reply(outputs: list[StoredMessage]) -> str:
    return "\n".join(m.content for m in outputs if m.message_type == "assistant" and m.sender == "bot")


def _model_view(arena: Arena, outcome: RunOutcome) -> str:
    """The text of every message the run's recorded input showed the model."""
    raw = stored_input(arena.db, outcome.run.id)
    assert raw is not None
    return "\n".join(m["content"] for m in json.loads(raw)["messages"])


# -- git ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["cold", "warm", "gvisor"])
def test_a_planted_git_config_never_runs_on_the_host(mode: str, request: pytest.FixtureRequest) -> None:
    """The reproduced escape: the agent makes its workspace a repository whose
    config runs a command on ``git status`` (fsmonitor) and on hashing a file
    (a clean filter).  The host used to run ``git status`` there for a notice."""
    arena: Arena = request.getfixturevalue(mode)
    marker = arena.base / "escaped-through-git"
    plant = (
        f"$ git init -q . && git config core.fsmonitor 'touch {marker}' && "
        f"git config filter.x.clean 'touch {marker}; cat' && echo '* filter=x' > .gitattributes && "
        "echo x > f && echo planted"
    )
    _, outputs = arena.ask(plant)
    assert "planted" in _tool_outputs(outputs)[0]
    for _ in range(2):
        _, outputs = arena.ask("/system")
        system = _reply(outputs)
        # The notice still exists: computed inside the sandbox now.
        assert "Note: the workspace has 2 uncommitted change(s): .gitattributes, f." in system, system
        assert not marker.exists(), "a command from the workspace's git config ran on the host"


# -- processes left behind in a warm container -------------------------------------------


def _processes(arena: Arena) -> str:
    _, outputs = arena.ask("$ for p in /proc/[0-9]*; do echo \"$(basename $p) $(tr '\\0' ' ' < $p/cmdline)\"; done")
    return _tool_outputs(outputs)[0]


@pytest.mark.parametrize("killer", ["pidfd", "docker-exec"])
def test_background_processes_do_not_survive_into_the_next_warm_run(
    warm: Arena, killer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if killer == "docker-exec":
        # What a worker that cannot see the container's processes (its own pid namespace) does.
        monkeypatch.setattr("orchestrator.sandbox.warm.cleanup.kill_all_but", lambda pid, cid, spare=None: None)
    _, outputs = warm.ask(
        "$ setsid sleep 1001 >/dev/null 2>&1 </dev/null & "
        "nohup sh -c 'while :; do sleep 1; done; echo 1002' >/dev/null 2>&1 </dev/null & "
        "setsid sh -c 'trap \"\" TERM HUP; exec sleep 1003' >/dev/null 2>&1 </dev/null & sleep 0.3; echo started"
    )
    assert "started" in _tool_outputs(outputs)[0]
    first = warm.containers()
    listing = _processes(warm)
    assert [c.id for c in warm.containers()] == [c.id for c in first]  # the same warm container
    for leftover in ("sleep 1001", "1002", "sleep 1003"):
        assert leftover not in listing, listing
    assert "agent_runner --serve" in listing  # the runner itself lives on
    # ... and nothing is left as a zombie eating the pids limit either
    _, outputs = warm.ask("$ grep -l '^State:.*Z' /proc/[0-9]*/status | wc -l")
    assert _tool_outputs(outputs)[0].strip().splitlines()[-1] == "0"


def test_a_container_whose_last_run_was_cut_off_is_replaced(warm: Arena) -> None:
    warm.ask("$ echo one")
    [container] = warm.containers()
    # A worker died mid-run: its "in progress" marker stays, and a process the
    # run started may still be running in the container.
    container.exec_run(["/bin/bash", "-c", "setsid sleep 1004 >/dev/null 2>&1 </dev/null &"])
    (state_dir(warm.settings, "alpha") / f"{container.id[:12]}.dirty").touch()
    listing = _processes(warm)
    [replacement] = warm.containers()
    assert replacement.id != container.id
    assert "sleep 1004" not in listing


def test_the_process_killer_refuses_a_pid_outside_the_container() -> None:
    # Our own pid namespace (a stale runner pid reused by a host process) or a
    # process of another cgroup: nothing is killed, the caller falls back.
    assert kill_all_but(os.getpid(), "0123456789ab") is None
    assert kill_all_but(1, "0123456789ab") is None
    assert kill_all_but(2**22 + 7, "0123456789ab") is None  # no such process


# PID 1 of a container that stands in for the runner: a child it keeps (as the runner keeps a
# Claude Code CLI), and a shell whose own child is a grandchild; each named by pid and start.
KEEPER = """
import subprocess, time
def named(pid):
    return f"{pid}:{open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[19]}"
kept = subprocess.Popen(["sleep", "1010"])
shell = subprocess.Popen(["sh", "-c", "sleep 1011 & echo $! > /tmp/grandchild; wait"])
while True:
    try:
        grandchild = int(open("/tmp/grandchild").read())
        break
    except (OSError, ValueError):
        time.sleep(0.01)
print("named", named(kept.pid), named(grandchild), flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("named", ["the child", "the child started at another time", "another pid started then"])
# A pid and a start time name one process: each half alone names none of these.
def test_the_process_killer_spares_only_the_process_the_runner_named(agent_image: str, named: str) -> None:
    client = docker.from_env()
    container = client.containers.run(
        agent_image, entrypoint=["python3", "-c", KEEPER], detach=True, network_disabled=True, user="1000"
    )
    try:
        deadline = time.monotonic() + 30
        while "named" not in (logs := container.logs().decode()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child, grandchild = (tuple(map(int, n.split(":"))) for n in logs.split()[1:3])
        spare = {
            "the child": KeepEvent(pid=child[0], started=child[1]),
            "the child started at another time": KeepEvent(pid=child[0], started=child[1] + 1),
            "another pid started then": KeepEvent(pid=child[0] + 1000, started=child[1]),
        }[named]
        container.reload()
        assert kill_all_but(int(container.attrs["State"]["Pid"]), str(container.id), spare=spare) is True
        left = [" ".join(row[-1:]) for row in container.top()["Processes"]]
        assert ("sleep 1010" in left) == (named == "the child"), left
        assert not [p for p in left if p in ("sleep 1011", "sh -c sleep 1011 & echo $! > /tmp/grandchild; wait")]
    finally:
        container.remove(force=True)


# -- the runner itself ---------------------------------------------------------------------

# Run as the agent: each attack on the runner (PID 1, same uid) prints "<name> ok <what it got>"
# or "<name> refused <errno>".  The descriptors it steals, it writes forged events into: a
# reply, and the runner's word to keep a process of the agent's (an orphan, the runner's child).
RUNNER_ATTACKS = r"""
import ctypes, json, os, platform, subprocess, time

libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": {"process_vm_readv": 310, "pidfd_open": 434, "pidfd_getfd": 438},
      "aarch64": {"process_vm_readv": 270, "pidfd_open": 434, "pidfd_getfd": 438}}[platform.machine()]
PTRACE_ATTACH, PTRACE_DETACH, WALL = 16, 17, 0x40000000


def checked(result):
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def attack(name, fn):
    try:
        print(name, "ok", fn(), flush=True)
    except OSError as exc:
        print(name, "refused", exc.errno, flush=True)


def first_mapping():
    with open("/proc/1/maps") as maps:
        return int(maps.readline().split("-")[0], 16)


def mem_read():
    with open("/proc/1/mem", "rb") as mem:
        mem.seek(first_mapping())
        return mem.read(4)


def mem_write():  # the same bytes written back: proof enough, harmless
    with open("/proc/1/mem", "r+b", buffering=0) as mem:
        at = first_mapping()
        mem.seek(at)
        head = mem.read(4)
        mem.seek(at)
        return mem.write(head)


def environ():
    with open("/proc/1/environ", "rb") as fh:
        return sorted(v.split(b"=")[0].decode() for v in fh.read().split(b"\0") if v)


def fds():
    return {n: os.readlink(f"/proc/1/fd/{n}") for n in os.listdir("/proc/1/fd")}


def stdout_write():
    with open("/proc/1/fd/1", "wb") as out:
        return out.write(b"written into the runner's stdout\n")


def ptrace_attach():
    checked(libc.ptrace(PTRACE_ATTACH, 1, None, None))
    os.waitpid(1, WALL)  # the runner stopped, in our hands
    checked(libc.ptrace(PTRACE_DETACH, 1, None, None))
    return "attached and detached"


def vm_readv():
    buf = ctypes.create_string_buffer(4)
    local = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 4)
    remote = (ctypes.c_void_p * 2)(0x10000, 4)  # any address: the permission check comes first
    try:
        remote[0] = first_mapping()
    except OSError:
        pass
    return checked(libc.syscall(NR["process_vm_readv"], 1, local, 1, remote, 1, 0))


subprocess.run(["sh", "-c", "setsid sleep 1012 >/dev/null 2>&1 </dev/null &"], check=True)


def orphan():
    for _ in range(300):  # until setsid has become the sleep
        for p in filter(str.isdigit, os.listdir("/proc")):
            try:
                if open(f"/proc/{p}/cmdline", "rb").read() == b"sleep\x001012\x00":
                    started = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[19])
                    return {"type": "keep", "pid": int(p), "started": started}
            except OSError:
                pass
        time.sleep(0.01)


def steal_fds():
    # Copies of the runner's descriptors; into its connection to the host, forged events.
    pidfd = checked(libc.syscall(NR["pidfd_open"], 1, 0))
    stolen, errors = [], set()
    for n in range(64):
        fd = libc.syscall(NR["pidfd_getfd"], pidfd, n, 0)
        if fd < 0:
            errors.add(ctypes.get_errno())
            continue
        target = os.readlink(f"/proc/self/fd/{fd}")
        stolen.append(f"{n}:{target}")
        if target.startswith("socket:"):
            forged = {"type": "assistant", "text": "FORGED by the agent through the runner's socket"}
            try:
                os.write(fd, (json.dumps(forged) + "\n" + json.dumps(orphan()) + "\n").encode())
            except OSError:
                pass
        os.close(fd)
    os.close(pidfd)
    if not stolen:
        raise OSError(min(errors - {9}) if errors - {9} else 9, "none")
    return stolen


def inherited():
    mine = sorted(int(n) for n in os.listdir("/proc/self/fd"))
    return [f"{n}:{os.readlink(f'/proc/self/fd/{n}')}" for n in mine if n > 2 and os.path.exists(f"/proc/self/fd/{n}")]


for name, fn in [("mem_read", mem_read), ("mem_write", mem_write), ("environ", environ), ("fds", fds),
                 ("stdout_write", stdout_write), ("ptrace_attach", ptrace_attach), ("vm_readv", vm_readv),
                 ("steal_fds", steal_fds), ("inherited", inherited), ("orphan", orphan)]:
    attack(name, fn)
"""


def test_the_agent_cannot_reach_into_the_runner(warm: Arena) -> None:
    """Same uid, no Yama: without the runner's ``PR_SET_DUMPABLE`` 0 the agent reads and
    writes the runner's memory through ``/proc/1/mem`` (so could forge any event on its
    connection to the host), reads its environment and writes into its stdout.  All in one run,
    which must still work."""
    warm.workspace.mkdir(parents=True, exist_ok=True)
    (warm.workspace / "attacks.py").write_text(RUNNER_ATTACKS)
    _, outputs = warm.ask("$ python3 attacks.py\n$ echo still working")
    attacks, normal = _tool_outputs(outputs)
    got = {line.split()[0]: line.split(maxsplit=1)[1] for line in attacks.splitlines() if line.strip()}
    for name in ("mem_read", "mem_write", "environ", "fds", "stdout_write"):
        assert got[name] == f"refused {errno.EACCES}", (name, attacks)
    for name in ("ptrace_attach", "vm_readv", "steal_fds"):
        assert got[name] == f"refused {errno.EPERM}", (name, attacks)
    assert got["inherited"] == "ok []", attacks  # the agent holds none of the runner's descriptors
    assert got["orphan"].startswith("ok {'type': 'keep'"), attacks  # the one it would have kept
    assert not any("FORGED" in m.content for m in outputs)
    assert "still working" in normal
    assert "sleep 1012" not in _processes(warm)  # nothing forged is kept between runs


# -- sockets -----------------------------------------------------------------------------


def test_a_symlink_at_the_runner_socket_does_not_redirect_the_host(warm: Arena) -> None:
    """The runner's socket lives in the workspace, which the agent writes: a
    symlink there would send the next run's input (the conversation) to any
    socket on the host.  The host sees a symlink, not a socket, and replaces
    the container instead."""
    trap = warm.base / "trap.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(trap))
    server.listen(8)
    server.settimeout(0.2)
    caught: list[bytes] = []
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            caught.append(conn.recv(65536))
            conn.close()

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    try:
        _, outputs = warm.ask(
            f"$ rm -f .orchestrator/agent.sock; ln -sf {trap} .orchestrator/agent.sock; ls -la .orchestrator/"
        )
        assert "agent.sock ->" in _tool_outputs(outputs)[0]
        _, outputs = warm.ask("second run with a secret word: swordfish")
        assert "swordfish" in _reply(outputs)
    finally:
        stop.set()
        listener.join()
        server.close()
    assert caught == []


def test_the_gateway_folder_is_read_only_for_the_agent(cold: Arena) -> None:
    from fakes.anthropic_api import FakeAnthropic, message

    target = cold.base / "host-file"
    target.write_text("host")
    os.chmod(target, 0o600)
    probe = (
        f"ls -la /run/gateway; ln -s {target} /run/gateway/evil; rm -f /run/gateway/model.sock; "
        "touch /run/gateway/x; test -S /run/gateway/model.sock && echo socket-intact"
    )
    fake = FakeAnthropic(
        message([{"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": probe}}], "tool_use", n=1),
        message([{"type": "text", "text": "done"}], "end_turn", n=2),
    )
    with fake.serve() as base_url:
        cold.pipeline.settings = cold.settings.replace(
            **{
                "model": "anthropic:claude-fake-1",
                "anthropic_base_url": base_url,
                "anthropic_api_key": "k",
            }
        )
        _, outputs = cold.ask("probe the gateway folder")
    [out] = _tool_outputs(outputs)
    assert out.count("Read-only file system") >= 3, out
    assert "socket-intact" in out, out
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    assert len(fake.calls) == 2  # the model was reached through the gateway both times


def test_a_symlink_where_the_gateway_socket_used_to_be_is_ignored(warm: Arena) -> None:
    """In warm mode the gateway socket used to be bound (and chmod 0666) in
    a folder the container wrote: a planted symlink there made the host chmod
    any file.  Now nothing the agent can write is where a host socket is."""
    from fakes.anthropic_api import FakeAnthropic, message

    target = warm.base / "host-file"
    target.write_text("host")
    os.chmod(target, 0o600)
    _, outputs = warm.ask(f"$ ln -sf {target} .orchestrator/model.sock; ln -sf {target} /run/gateway/model.sock")
    assert "Read-only file system" in _tool_outputs(outputs)[0]
    fake = FakeAnthropic(message([{"type": "text", "text": "hello through the gateway"}], "end_turn", n=1))
    with fake.serve() as base_url:
        warm.pipeline.settings = warm.settings.replace(
            **{
                "model": "anthropic:claude-fake-1",
                "anthropic_base_url": base_url,
                "anthropic_api_key": "k",
            }
        )
        _, outputs = warm.ask("hi")
    assert "hello through the gateway" in _reply(outputs)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600


# -- files the host reads for context ----------------------------------------------------


def test_a_fifo_as_a_context_file_does_not_hang_the_run(cold: Arena) -> None:
    cold.ask("$ mkfifo pipe && ln -s /etc/shadow shadow && echo made")
    outcome, outputs = cold.ask(
        "look", {"context": [{"type": "file", "path": "pipe"}, {"type": "file", "path": "shadow"}]}
    )
    recorded = _model_view(cold, outcome)
    assert "<path>pipe</path>\n<error>[Error: is not a regular file (FIFO, socket or device)]" in recorded
    assert "<path>shadow</path>\n<error>[Error: a symlink (never followed)]" in recorded
    assert "root:" not in recorded


def test_a_file_swapped_for_a_symlink_by_a_live_process_never_leaks(warm: Arena) -> None:
    """A process inside the warm container swaps ``notes.txt`` between a
    regular file and a symlink to a host secret as fast as it can while the
    host expands the file as context, over and over."""
    secret = warm.base / "host-secret.txt"
    secret.write_text("TOPSECRET-" + "x" * 20)
    os.chmod(warm.base, 0o755)
    os.chmod(secret, 0o644)  # readable by the worker's user: only the reader's rules protect it
    warm.ask("$ echo harmless > plain && echo ready")
    [container] = warm.containers()
    swapper = (
        "import os\n"
        f"secret = {str(secret)!r}\n"
        "while True:\n"
        "    os.symlink(secret, 'new'); os.replace('new', 'notes.txt')\n"
        "    os.link('plain', 'new'); os.replace('new', 'notes.txt')\n"
    )
    # Started from outside the pipeline, as a process a cut-off run left behind would be.
    container.exec_run(["python3", "-c", swapper], workdir="/workspace", detach=True)
    time.sleep(0.5)
    seen = {"read": 0, "refused": 0}
    try:
        for _ in range(15):
            outcome, _ = warm.ask("what is in it?", {"context": [{"type": "file", "path": "notes.txt"}]})
            recorded = _model_view(warm, outcome)
            assert "TOPSECRET" not in recorded
            if "harmless" in recorded:
                seen["read"] += 1
            elif "a symlink (never followed)" in recorded:
                seen["refused"] += 1
            # the runs' clean-up killed the swapper: start it again for the next read
            [container] = warm.containers()
            container.exec_run(["python3", "-c", swapper], workdir="/workspace", detach=True)
            time.sleep(0.2)
    finally:
        for c in warm.containers():
            c.remove(force=True)
    # Each read either got the plain file or refused the symlink; never the secret.
    assert seen["read"] + seen["refused"] == 15, seen
