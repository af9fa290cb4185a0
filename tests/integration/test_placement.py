"""Placement with two real worker processes of two hosts (``ORCHESTRATOR_HOST_ID``) on the
fleet backend (PostgreSQL + Redis; stickiness on the embedded one too), real agent
containers, warm sessions on.

* stickiness: three groups, four messages each (each sent once the last is answered,
  so every one is a fresh signal): every run of a group is on one host, its place;
  each group has one warm container, on that host; ``groups move`` sends the next run
  to the other host and the old host stops its warm container; ``worker --drain``
  stops a host and its group is answered by the other one;
* failover: a group placed on a host whose worker is SIGKILLed is answered by the
  other host, once, with the workspace it left (a file written before the kill,
  read after), although its signal went to the dead host's queue.

No beat runs: what brings a stranded group back is the workers' recovery watch
(``store.placement.stranded``).  Each test prints a ``PLACEMENT:`` line (pytest -s).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator

import docker
import pytest

from orchestrator.cli.supervisor import worker_argv
from orchestrator.root import Orchestrator
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.sandbox import quota
from orchestrator.sandbox.containers import LABEL_GROUP, LABEL_INSTALL, LABEL_WARM
from orchestrator.sandbox.warm import LABEL_HOST
from orchestrator.store import hosts
from orchestrator.store.groups import add_group, get_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import FINAL_STATES, list_runs
from orchestrator.store.volume_holds import holder
from tests.conftest import wait_until
from tests.quota_support import release_everything, require_volumes

from .conftest import BIN, Stack

HOSTS = ("place-a", "place-b")


@pytest.fixture
def fleet(stack: Stack) -> Iterator[tuple[Stack, Orchestrator]]:
    """Two workers, one per host, warm sessions on; a root whose signals follow the placement."""
    stack.env["ORCHESTRATOR_WARM_IDLE_S"] = "30"  # leftovers idle out soon after the test
    for host in HOSTS:
        _worker(stack, host)
    root = Orchestrator(stack.settings)
    try:
        wait_until(lambda: all(_up(stack, h) for h in HOSTS), 90, "both hosts up", stack.worker_logs)
        yield stack, root
    finally:
        root.close()
        for c in _warm(stack):
            c.remove(force=True)


def _worker(stack: Stack, host: str) -> subprocess.Popen[bytes]:
    """A worker of ``host`` in its own session (a SIGKILL takes its pool too)."""
    log = stack.settings.data_dir.parent / f"worker-{host}-{len(stack.procs)}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            worker_argv(2, name=f"{host}@%h"),
            env=stack.env | {"ORCHESTRATOR_HOST_ID": host},
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=stack.settings.data_dir.parent,
            start_new_session=True,
        )
    stack.procs.append(proc)
    stack.logs.append(log)
    return proc


def _up(stack: Stack, host: str) -> bool:
    h = hosts.get_host(stack.db, host)
    return h is not None and h.alive and h.state == "up"


def _warm(stack: Stack, folder: str | None = None) -> list[object]:
    labels = [f"{LABEL_INSTALL}={stack.settings.install_id}", f"{LABEL_WARM}=1"]
    labels += [f"{LABEL_GROUP}={folder}"] if folder else []
    for _ in range(10):
        try:
            return docker.from_env().containers.list(filters={"label": labels, "status": "running"})
        except docker.errors.NotFound:  # one went (an idle exit, a replacement) between listing and inspecting
            continue
    raise AssertionError("the warm containers kept changing while listed")


def _warm_hosts(stack: Stack, folder: str) -> list[str]:
    return sorted(c.labels.get(LABEL_HOST, "") for c in _warm(stack, folder))  # type: ignore[attr-defined]


def _send(stack: Stack, root: Orchestrator, jid: str, text: str) -> int:
    return ingest(
        stack.db, stack.settings, IncomingMessage(chat_jid=jid, sender="u", content=text), signal=root.signals.group
    ).message.seq


def _replies(stack: Stack, jid: str, after: int) -> list[str]:
    return [m.content for m in get_messages_after(jid, after, db=stack.db) if m.sender == "bot"]


def _answered(stack: Stack, jid: str, seq: int, timeout: float = 90) -> str:
    wait_until(lambda: bool(_replies(stack, jid, seq)), timeout, f"the answer in {jid}", stack.worker_logs)
    return _replies(stack, jid, seq)[0]


def _run_hosts(stack: Stack, jid: str) -> list[str]:
    """The host of every run of ``jid``, oldest first, once they all ended (a reply is
    stored before its run is)."""
    wait_until(
        lambda: all(r.state in FINAL_STATES for r in list_runs(stack.db, chat_jid=jid, limit=100)),
        30,
        f"the runs of {jid} to end",
        stack.worker_logs,
    )
    runs = list(reversed(list_runs(stack.db, chat_jid=jid, limit=100)))
    assert all(r.state == "succeeded" for r in runs), [(r.state, r.error) for r in runs]
    return [hosts.owner_host(r.owner) or "" for r in runs]


def _other(host: str) -> str:
    return HOSTS[1 - HOSTS.index(host)]


# Both stacks: per-host queues on the embedded filesystem:// broker too (two host ids
# on one machine share its data dir, as hosts share theirs on shared storage).
@pytest.mark.parametrize("stack", ["embedded", "fleet"], indirect=True)
def test_a_groups_runs_stay_on_its_host_until_it_is_moved_or_its_host_drains(
    fleet: tuple[Stack, Orchestrator],
) -> None:
    stack, root = fleet
    groups = [f"p{i}@x" for i in range(3)]
    for i, jid in enumerate(groups):
        add_group(stack.db, chat_jid=jid, name=jid, folder=f"p{i}", requires_trigger=False)
    t0 = time.monotonic()
    for n in range(4):
        seqs = {jid: _send(stack, root, jid, f"$ echo round-{n}") for jid in groups}
        for jid, seq in seqs.items():
            assert f"round-{n}" in _answered(stack, jid, seq)
    stuck = time.monotonic() - t0
    places = {jid: get_group(stack.db, jid).placed_host for jid in groups}
    for jid in groups:
        ran = _run_hosts(stack, jid)
        assert len(ran) == 4 and set(ran) == {places[jid]}, (jid, ran, stack.worker_logs())
        # One warm container for the group, on its host.
        assert _warm_hosts(stack, jid.split("@")[0]) == [places[jid]]

    # groups move: the next run on the other host; the old one stops its warm container.
    jid, folder = groups[0], "p0"
    old = places[jid]
    new = _other(old)
    moved = stack.cli("groups", "move", jid, new)
    assert moved.returncode == 0 and f"{jid} placed on {new} (was {old})" in moved.stdout, moved.stderr
    seq = _send(stack, root, jid, "$ echo moved")
    assert "moved" in _answered(stack, jid, seq)
    assert _run_hosts(stack, jid)[-1] == new and get_group(stack.db, jid).placed_host == new
    wait_until(
        lambda: _warm_hosts(stack, folder) == [new],
        20,
        f"{old}'s warm container of {folder} stopped",
        stack.worker_logs,
    )

    # worker --drain on the group's new host: it stops, and the other host answers the group.
    drained = subprocess.run(
        [str(BIN / "orchestrator"), "worker", "--drain", "--wait", "60"],
        env=stack.env | {"ORCHESTRATOR_HOST_ID": new},
        capture_output=True,
        text=True,
        timeout=90,
        cwd=stack.settings.data_dir.parent,
    )
    assert drained.returncode == 0 and f"host {new}: stopped" in drained.stdout, drained.stderr
    assert stack.procs[HOSTS.index(new)].wait(timeout=30) == 0
    assert not _up(stack, new)
    seq = _send(stack, root, jid, "$ echo after-drain")
    assert "after-drain" in _answered(stack, jid, seq)
    assert _run_hosts(stack, jid)[-1] == old and get_group(stack.db, jid).placed_host == old
    print(
        f"PLACEMENT: 3 groups x 4 messages in {stuck:.1f} s, every group's runs on one host "
        f"({sorted(places.values())}); moved, then drained, in {time.monotonic() - t0 - stuck:.1f} s"
    )


@pytest.fixture(params=["volumes-off", "volumes-on"])
def volumes(request: pytest.FixtureRequest, stack: Stack) -> Iterator[bool]:
    """Workspace volumes off (a plain folder) or on (a loop-mounted ext4 image, the default
    as root with loop devices), set before ``fleet`` starts the workers; on, everything
    mounted is released afterwards."""
    on = request.param == "volumes-on"
    if not on:
        yield False
        return
    require_volumes()
    stack.env["ORCHESTRATOR_WORKSPACE_QUOTA"] = "64m"
    try:
        yield True
    finally:
        quota.unmount_all(stack.settings.replace(workspace_quota="64m"))
        release_everything(stack.settings.data_dir)


@pytest.mark.parametrize("stack", ["fleet"], indirect=True)
def test_a_killed_hosts_group_is_answered_once_by_the_other_host_with_its_workspace(
    volumes: bool,
    fleet: tuple[Stack, Orchestrator],
) -> None:
    """With volumes on, the survivor takes the dead host's mount over once the host is dead
    for its leases (both are of this machine: one kernel), not after ORCHESTRATOR_DEAD_HOST_S."""
    stack, root = fleet
    jid = "f@x"
    add_group(stack.db, chat_jid=jid, name="f", folder="f", requires_trigger=False)
    victim, survivor = HOSTS
    assert stack.cli("groups", "move", jid, victim).returncode == 0
    marker = f"kept-{uuid.uuid4().hex[:8]}"
    seq = _send(stack, root, jid, f"$ echo {marker} > note.txt")
    assert "exit 0" in _answered(stack, jid, seq)
    assert _run_hosts(stack, jid) == [victim]
    proc = stack.procs[HOSTS.index(victim)]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    t0 = time.monotonic()
    # At once, while the dead host still looks alive: the signal goes to its queue, where nobody
    # takes it; the survivor's recovery watch signals the group again once the host is dead.
    seq = _send(stack, root, jid, "$ cat note.txt")
    answer = _answered(stack, jid, seq, timeout=60)
    elapsed = time.monotonic() - t0
    time.sleep(3)  # nothing more comes
    assert marker in answer
    assert len(_replies(stack, jid, seq)) == 1
    assert _run_hosts(stack, jid) == [victim, survivor]
    assert get_group(stack.db, jid).placed_host == survivor
    assert "placed on place-a, which takes no groups now" in stack.worker_logs()
    if volumes:
        vol = quota.Volume.of(stack.settings, "f")
        assert vol.mounted() == "ours" and len(quota.loop_devices_of(vol.image)) == 1  # one mount, taken over
        assert holder(stack.db, "f") == survivor
        assert "took over the volumes of f from host place-a" in stack.worker_logs()
        assert elapsed < 15, f"answered {elapsed:.1f} s after the kill"
    print(
        f"PLACEMENT: a SIGKILLed host's group answered by the other host {elapsed:.1f} s after the kill "
        f"(the dead host's window is {hosts.ALIVE_WINDOW_S:.0f} s), workspace intact, once, "
        f"volumes {'on' if volumes else 'off'}"
    )


# Volumes on, the default install's way: with them off the paused holder's path is the same
# but for the hold (the SIGKILL test above runs both).
@pytest.mark.parametrize("volumes", ["volumes-on"], indirect=True)
@pytest.mark.parametrize("stack", ["fleet"], indirect=True)
def test_a_paused_hosts_silent_command_is_answered_once_by_the_other_host(
    volumes: bool,
    fleet: tuple[Stack, Orchestrator],
) -> None:
    """The holder SIGSTOPped 3 s into a silent 15 s command that then writes a marker naming its
    container (what a VM stall looks like): its sandbox fences itself before the command writes,
    the other host redoes the command and answers once, and after SIGCONT the old host neither
    writes nor delivers anything for the group (the marker has one writer)."""
    stack, root = fleet
    jid = "s@x"
    add_group(stack.db, chat_jid=jid, name="s", folder="s", requires_trigger=False)
    victim, survivor = HOSTS
    assert stack.cli("groups", "move", jid, victim).returncode == 0
    seq = _send(stack, root, jid, "$ sleep 15; hostname >> marker.txt; echo wrote")
    wait_until(
        lambda: any(r.state == "running" for r in list_runs(stack.db, chat_jid=jid, limit=10)),
        60,
        "the silent command to start",
        stack.worker_logs,
    )
    time.sleep(3)
    proc = stack.procs[HOSTS.index(victim)]
    os.killpg(proc.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        answer = _answered(stack, jid, seq, timeout=90)
        elapsed = time.monotonic() - t0 + 3
    finally:
        os.killpg(proc.pid, signal.SIGCONT)
    assert "wrote" in answer
    time.sleep(12)  # the old host is back: it must write and deliver nothing for the group
    assert len(_replies(stack, jid, seq)) == 1
    marker = (stack.settings.groups_dir / "s" / "marker.txt").read_text().split()
    assert len(marker) == 1, marker  # one writer: the old host's container never wrote
    runs = list(reversed(list_runs(stack.db, chat_jid=jid, limit=10)))
    answered = [r for r in runs if r.state == "succeeded"]
    assert [hosts.owner_host(r.owner) for r in answered] == [survivor], [(r.state, r.owner) for r in runs]
    assert all(hosts.owner_host(r.owner) == victim for r in runs if r.state != "succeeded")
    if volumes:
        assert holder(stack.db, "s") == survivor
        assert len(quota.loop_devices_of(quota.Volume.of(stack.settings, "s").image)) == 1
    print(
        f"PLACEMENT: a SIGSTOPped host's silent 15 s command answered once by the other host "
        f"{elapsed:.1f} s after it started, one writer, volumes {'on' if volumes else 'off'}"
    )
