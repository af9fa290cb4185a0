"""Placement on both databases (``orchestrator/store/placement.py``): which queue a
group's drain signal goes to (its host's while that host is up and beating, by the
database's clock; the shared one for a dead, draining, stopped or unknown host), who
becomes a group's place (the lease taker when the group has no live place; a move
sticks), ``groups move`` on the command line and over the API, the groups stranded on
a host that takes no groups (signalled again by the recovery watch), the warm
containers left on a host the group moved away from, and ``worker --drain``.

The worker-process version (two real workers, real containers) is
``tests/integration/test_placement.py``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from agent_runner.protocol import AssistantEvent, ResultEvent
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.errors import HostUnavailable, UnknownGroup
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.http.endpoint import CLIENT_HEADER
from orchestrator.root import Orchestrator
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.queue import AGENT_QUEUE, Signals, host_queue, make_celery
from orchestrator.run.recovery import RecoveryWatch
from orchestrator.store import hosts, leases
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, get_group
from orchestrator.store.placement import live_hosts, move, moved_away, placed_on, stranded
from orchestrator.store.tables import GroupRow, HostRow
from tests.conftest import TEST_ENV

JID = "g@x"


def _register(db: Database, host_id: str, **kw: object) -> None:
    hosts.register(db, host_id=host_id, instance=f"{host_id}:1", version="t", concurrency=2, **kw)  # type: ignore[arg-type]


def _silence(db: Database, host_id: str, seconds: float = hosts.ALIVE_WINDOW_S + 5) -> None:
    """Its last beat ``seconds`` ago by the database's clock."""
    then = hosts.database_now(db) - timedelta(seconds=seconds)
    with db.write() as session:
        session.execute(update(HostRow).where(HostRow.host_id == host_id).values(heartbeat_at=then))


def _set(db: Database, jid: str = JID, **values: object) -> None:
    with db.write() as session:
        session.execute(update(GroupRow).where(GroupRow.chat_jid == jid).values(**values))


def _say(db: Database, settings: Settings, jid: str = JID) -> None:
    ingest(db, settings, IncomingMessage(chat_jid=jid, sender="u", content="hi"), signal=None)


@pytest.fixture
def group(db: Database) -> str:
    add_group(db, chat_jid=JID, name="g", folder="g", requires_trigger=False)
    return JID


# -- the queue names ----------------------------------------------------------------


def test_a_hosts_queue_is_its_id_made_safe_and_never_shared() -> None:
    assert host_queue("host-a") == "agent.host-a"
    dotted, underscored = host_queue("node1.example.com"), host_queue("node1_example_com")
    assert dotted.startswith("agent.node1_example_com-") and dotted != underscored == "agent.node1_example_com"
    for q in (dotted, host_queue("a:b/c d"), host_queue("ü" * 200)):
        rest = q.removeprefix(f"{AGENT_QUEUE}.")
        # No dot after the prefix: the filesystem broker finds a queue's files by ".<queue>.msg".
        assert rest != q and "." not in rest and len(rest) <= 91 and rest.replace("-", "").replace("_", "").isalnum()
    assert host_queue("a:b") != host_queue("a/b")


# -- where a signal goes ------------------------------------------------------------------


def test_a_group_is_signalled_on_its_hosts_queue_only_while_that_host_takes_groups(
    db: Database,
    group: str,
) -> None:
    assert placed_on(db, group) is None  # no place yet: the shared queue
    _register(db, "host-a")
    _register(db, "host-b")
    assert move(db, group, "host-a").previous_host is None
    assert placed_on(db, group) == "host-a" and get_group(db, group).placed_host == "host-a"
    # Silent for longer than the window, by the database's clock: dead, the shared queue.
    _silence(db, "host-a")
    assert placed_on(db, group) is None
    _silence(db, "host-a", hosts.ALIVE_WINDOW_S - 2)
    assert placed_on(db, group) == "host-a"  # a beat inside the window
    # Draining (a warm shutdown): it finishes its runs but takes no group.
    assert hosts.heartbeat(db, "host-a", "host-a:1", warm_containers=0, draining=True)
    assert placed_on(db, group) is None
    _register(db, "host-a")  # a new worker of the host: up again
    assert placed_on(db, group) == "host-a"
    assert hosts.mark_stopped(db, "host-a", "host-a:1")
    assert placed_on(db, group) is None
    # A host no worker ever registered.
    _set(db, placed_host="ghost")
    assert placed_on(db, group) is None and get_group(db, group).placed_host == "ghost"
    assert placed_on(db, "nobody@x") is None
    assert live_hosts(db) == ["host-b"]


def test_signals_go_to_the_placed_hosts_queue_on_a_real_broker(db: Database, settings: Settings, group: str) -> None:
    """Through the embedded filesystem:// broker: the message file names its queue."""
    local = settings.replace(**{"broker_url": ""})  # the embedded broker under the data dir, whatever the database
    _register(db, "host-a")
    signals = Signals(lambda: make_celery(local), placement=lambda jid: placed_on(db, jid))
    out = local.broker_dir / "out"

    def queues() -> list[str]:
        return sorted(p.name.split(".", 1)[1].removesuffix(".msg") for p in out.glob("*.msg"))

    signals.group(group)
    assert queues() == ["agent"]
    move(db, group, "host-a")
    signals.group(group, countdown=5)
    assert queues() == ["agent", "agent.host-a"]
    _silence(db, "host-a")
    signals.group(group)
    assert queues() == ["agent", "agent", "agent.host-a"]
    assert Signals(lambda: make_celery(local)).queue_for(group) == AGENT_QUEUE  # no placement given

    def broken(_: str) -> str | None:
        raise ConnectionError("database away")

    assert Signals(lambda: make_celery(local), placement=broken).queue_for(group) == AGENT_QUEUE
    signals.app.control.purge()


def test_ingest_hands_the_placement_it_read_to_the_signal(db: Database, settings: Settings, group: str) -> None:
    """Ingest's routing read returns the placement: its signal makes no look-up of its own."""
    local = settings.replace(**{"broker_url": ""})
    looked_up: list[str] = []

    def placement(jid: str) -> str | None:
        looked_up.append(jid)
        return placed_on(db, jid)

    signals = Signals(lambda: make_celery(local), placement=placement)
    _register(db, "host-a")
    move(db, group, "host-a")
    ingest(db, settings, IncomingMessage(chat_jid=group, sender="u", content="hi"), signal=signals.group)
    assert [p.name.split(".", 1)[1] for p in (local.broker_dir / "out").glob("*.msg")] == ["agent.host-a.msg"]
    assert looked_up == []
    # Any other signal is called as always, with the chat id alone.
    add_group(db, chat_jid="h@x", name="h", folder="h", requires_trigger=False)
    recorded: list[str] = []
    ingest(db, settings, IncomingMessage(chat_jid="h@x", sender="u", content="hi"), signal=recorded.append)
    assert recorded == ["h@x"]
    signals.app.control.purge()


def test_the_roots_signals_follow_the_placement(db: Database, settings: Settings, group: str) -> None:
    root = Orchestrator(settings, migrate=False)
    try:
        _register(db, "host-a")
        assert root.signals.queue_for(group) == AGENT_QUEUE
        move(db, group, "host-a")
        assert root.signals.queue_for(group) == "agent.host-a"
    finally:
        root.close()


# -- who becomes the place ---------------------------------------------------------------


def test_the_lease_taker_becomes_the_place_of_a_group_without_a_live_one(db: Database, group: str) -> None:
    def take(host: str | None, place: bool = True) -> str | None:
        owner = hosts.process_owner(host or "history")
        assert leases.acquire(db, group, owner, 60, place=host if place else None)
        leases.release(db, group, owner)
        return get_group(db, group).placed_host

    assert take("host-a") == "host-a"  # no place yet (the host need not be registered)
    _register(db, "host-a")
    _register(db, "host-b")
    # host-a is up: a step on host-b (a stray signal on the shared queue) does not take its place.
    assert take("host-b") == "host-a"
    assert take("host-a") == "host-a"
    assert take("history", place=False) == "host-a"  # a lease without a place (history edits)
    _silence(db, "host-a")
    assert take("host-b") == "host-b"  # host-a is dead: the taker is the place
    assert hosts.heartbeat(db, "host-b", "host-b:1", warm_containers=0, draining=True)
    _register(db, "host-a")
    assert take("host-a") == "host-a"  # host-b drains
    # A move sticks: the old host's next step (a signal already in its queue) leaves it.
    _register(db, "host-b")
    move(db, group, "host-b")
    assert take("host-a") == "host-b"


def test_a_pipeline_step_places_the_group_on_its_host(db: Database, settings: Settings, group: str) -> None:
    root = Orchestrator(
        settings.replace(**{"host_id": "host-p"}),
        migrate=False,
        sandbox=FakeSandbox(Script([AssistantEvent(text="done"), ResultEvent()])),
    )
    try:
        _say(db, settings)
        [outcome] = root.pipeline.drain_group(group)
        assert outcome.run.state == "succeeded" and hosts.owner_host(outcome.run.owner) == "host-p"
        assert get_group(db, group).placed_host == "host-p"
    finally:
        root.close()


# -- groups move ----------------------------------------------------------------------------


def test_move_places_a_group_on_a_live_host_only(db: Database, settings: Settings, group: str) -> None:
    _register(db, "host-a")
    _register(db, "host-b")
    _register(db, "host-c")
    _silence(db, "host-c")
    assert hosts.heartbeat(db, "host-b", "host-b:1", warm_containers=0, draining=True)
    for host in ("host-b", "host-c", "nowhere"):
        with pytest.raises(HostUnavailable) as refused:
            move(db, group, host)
        assert refused.value.live == ["host-a"] and f"{host!r} does not take groups" in str(refused.value)
        assert get_group(db, group).placed_host is None  # nothing changed
    with pytest.raises(UnknownGroup):
        move(db, "nobody@x", "host-a")
    moved = move(db, group, "host-a")
    assert (moved.host, moved.previous_host, moved.pending, moved.signalled) == ("host-a", None, False, False)
    _say(db, settings)
    _register(db, "host-b")
    moved = move(db, group, "host-b")
    assert (moved.previous_host, moved.pending) == ("host-a", True)
    assert get_group(db, group).placed_host == "host-b"


def _cli(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")} | TEST_ENV
    base |= {"ORCHESTRATOR_DATA_DIR": str(settings.data_dir), "ORCHESTRATOR_DATABASE_URL": settings.database_url}
    cli = str(Path(sys.executable).parent / "orchestrator")
    return subprocess.run([cli, *args], env=base | env, capture_output=True, text=True, timeout=120)


def test_groups_move_on_the_command_line(db: Database, settings: Settings, group: str) -> None:
    _register(db, "host-a")
    refused = _cli(settings, "groups", "move", group, "host-z")
    assert refused.returncode == 1 and "'host-z' does not take groups" in refused.stderr
    assert "hosts that do: host-a" in refused.stderr
    _say(db, settings)
    # Beaten again: host-a lives 9 s from its last beat, and a CLI start on a loaded CI machine
    # (three test processes on two cores) has taken most of that.
    _register(db, "host-a")
    done = _cli(settings, "groups", "move", group, "host-a")
    assert done.returncode == 0, done.stderr
    assert f"{group} placed on host-a" in done.stdout and "work is pending: signalled host-a" in done.stdout
    # The signal went to host-a's own queue (the embedded broker under the data dir, for the sqlite
    # run; PostgreSQL's settings name no broker here either).
    assert [p.name.split(".", 1)[1] for p in (settings.broker_dir / "out").glob("*.msg")] == ["agent.host-a.msg"]
    listed = _cli(settings, "groups", "list", "--json")
    assert [g["placed_host"] for g in json.loads(listed.stdout) if g["chat_jid"] == group] == ["host-a"]


def test_groups_move_over_the_api(db: Database, settings: Settings, group: str) -> None:
    _register(db, "host-a")
    with TestClient(create_app(Orchestrator(settings)), headers={CLIENT_HEADER: "tests"}) as client:
        r = client.post(f"/api/groups/{group}/move", json={"host": "host-z"})
        assert r.status_code == 409 and "hosts that do: host-a" in r.json()["detail"]
        assert client.post("/api/groups/nobody@x/move", json={"host": "host-a"}).status_code == 404
        assert client.post(f"/api/groups/{group}/move", json={"host": ""}).json()["field"] == "host"
        r = client.post(f"/api/groups/{group}/move", json={"host": "host-a"})
        assert r.status_code == 200, r.text
        assert r.json() == {
            "chat_jid": group,
            "host": "host-a",
            "previous_host": None,
            "pending": False,
            "signalled": False,
        }
        _say(db, settings)
        r = client.post(f"/api/groups/{group}/move", json={"host": "host-a"})
        assert (r.json()["pending"], r.json()["signalled"], r.json()["previous_host"]) == (True, True, "host-a")
        assert client.get(f"/api/groups/{group}").json()["placed_host"] == "host-a"


# -- stranded groups, moved-away warm containers --------------------------------------------


def test_groups_stranded_on_a_host_that_takes_no_groups_are_signalled_again(
    db: Database,
    settings: Settings,
    group: str,
) -> None:
    add_group(db, chat_jid="idle@x", name="idle", folder="idle", requires_trigger=False)
    _register(db, "host-a")
    move(db, group, "host-a")
    move(db, "idle@x", "host-a")
    _say(db, settings)
    assert stranded(db) == []  # host-a is up: its queue is consumed
    _silence(db, "host-a")
    assert stranded(db) == [(group, "host-a")]  # "idle@x" has nothing pending
    # A live holder (a worker running the group) will see the work itself.
    owner = hosts.process_owner("host-b")
    assert leases.acquire(db, group, owner, 60)
    assert stranded(db) == []
    leases.release(db, group, owner)
    clock = [0.0]
    signals: list[str] = []
    watch = RecoveryWatch(
        db, host_id="host-b", signal=signals.append, interval_s=1, resignal_s=30, monotonic=lambda: clock[0]
    )
    assert watch.check() == [group] == signals
    assert watch.check() == []  # not again so soon
    # Draining and stopped hosts take no groups either; the group is signalled once more later.
    _register(db, "host-a")
    assert hosts.heartbeat(db, "host-a", "host-a:1", warm_containers=0, draining=True)
    clock[0] = 31
    assert watch.check() == [group]
    # Once a host took it (and so became its place), it is no longer stranded.
    _register(db, "host-b")
    assert leases.acquire(db, group, owner, 60, place="host-b")
    leases.release(db, group, owner)
    clock[0] = 62
    assert watch.check() == [] and get_group(db, group).placed_host == "host-b"


def test_warm_containers_of_groups_placed_elsewhere_are_the_ones_to_stop(db: Database, group: str) -> None:
    add_group(db, chat_jid="h@x", name="h", folder="h", requires_trigger=False)
    add_group(db, chat_jid="n@x", name="n", folder="n", requires_trigger=False)
    _register(db, "host-a")
    _register(db, "host-b")
    move(db, group, "host-b")  # folder g: moved to host-b
    move(db, "h@x", "host-a")  # folder h: still here
    assert moved_away(db, "host-a", ["g", "h", "n", "unknown"]) == ["g"]  # n has no place: kept
    assert moved_away(db, "host-a", []) == []
    # A run of host-a holds g's lease right now (the move came mid-run): its container stays.
    owner = hosts.process_owner("host-a")
    assert leases.acquire(db, group, owner, 60)
    assert moved_away(db, "host-a", ["g"]) == []
    leases.release(db, group, owner)
    assert moved_away(db, "host-a", ["g"]) == ["g"]


# -- worker --drain -------------------------------------------------------------------------


def test_worker_drain_sends_this_hosts_worker_a_sigterm(db: Database, settings: Settings) -> None:
    # A stand-in for the worker's main process: SIGTERM ends it.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        hosts.register(
            db,
            host_id="host-d",
            instance="d:1",
            version="t",
            concurrency=1,
            pid=proc.pid,
            hostname=socket.gethostname(),
        )
        hosts.register(
            db, host_id="host-far", instance="f:1", version="t", concurrency=1, pid=proc.pid, hostname="another-machine"
        )
        far = _cli(settings, "worker", "--drain", ORCHESTRATOR_HOST_ID="host-far")
        assert far.returncode == 1 and "runs on another-machine, not on this machine" in far.stderr
        none = _cli(settings, "worker", "--drain", ORCHESTRATOR_HOST_ID="host-none")
        assert none.returncode == 1 and "no running worker of host 'host-none'" in none.stderr
        assert proc.poll() is None  # neither refusal signalled anything
        # Beaten again: alive 9 s from its last beat, and two CLI starts on a loaded machine take most of it.
        hosts.register(
            db,
            host_id="host-d",
            instance="d:1",
            version="t",
            concurrency=1,
            pid=proc.pid,
            hostname=socket.gethostname(),
        )
        done = _cli(settings, "worker", "--drain", "--wait", "30", ORCHESTRATOR_HOST_ID="host-d")
        assert done.returncode == 0, done.stderr
        assert f"worker pid {proc.pid} drains" in done.stdout and "host host-d: stopped" in done.stdout
        assert proc.wait(timeout=10) == -15
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
