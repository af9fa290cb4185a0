"""Warm sessions with real Docker: one container serves a group's runs until
it idles out; crashed, stale or timed-out containers are replaced; the
sweeper leaves a live one alone; reset stops it; a host keeps at most its cap,
stopping the least recently used idle ones."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from bench.common import DockerCalls
from fakes.channel import RecordingChannel
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.sandbox.containers import (
    LABEL_GROUP,
    LABEL_INSTALL,
    LABEL_MANAGED,
    LABEL_WARM,
    DockerSandbox,
    list_containers,
)
from orchestrator.sandbox.sessions import reset_session
from orchestrator.sandbox.warm import WarmPool, state_dir
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, ensure_main_group, get_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import list_runs
from tests.conftest import wait_until

JID = "main@local"


@pytest.fixture
def warm(tmp_path: Path, agent_image: str) -> Iterator[Pipeline]:
    settings = Settings.load(
        data_dir=tmp_path / "data",
        agent_image=agent_image,
        run_timeout_s=20,
        warm_idle_s=60,
        env_file=None,
    )
    settings.ensure_dirs()
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    db.migrate()
    ensure_main_group(db)
    pipeline = Pipeline(settings, db, ChannelRegistry([RecordingChannel()]))
    yield pipeline
    pipeline.sandbox.stop_all()
    db.dispose()


def _warm_containers(p: Pipeline) -> list:
    """This test's installation's warm containers (another test process may have its own)."""
    labels = [f"{LABEL_MANAGED}=1", f"{LABEL_WARM}=1", f"{LABEL_INSTALL}={p.settings.install_id}"]
    return list_containers(docker.from_env(), all=True, filters={"label": labels})


def _run(p: Pipeline, text: str, state: str = "succeeded", jid: str = JID) -> str:
    ingest(p.db, p.settings, IncomingMessage(chat_jid=jid, sender="u", content=text), signal=None)
    outcomes = p.drain_group(jid)
    assert [o.run.state for o in outcomes] == [state], [o.run.error for o in outcomes]
    return outcomes[0].run.container_id or ""


def _last_output(p: Pipeline) -> str:
    return [m.content for m in get_messages_after(JID, 0, db=p.db) if m.message_type == "tool_result"][-1]


def test_one_container_serves_a_groups_runs(warm: Pipeline) -> None:
    first = _run(warm, "$ echo $$ > /tmp/pid && echo one > kept.txt")
    second = _run(warm, "$ cat /tmp/pid kept.txt; echo two")
    assert first and first == second  # the same container took the second run
    assert _last_output(warm).splitlines()[-2:] == ["one", "two"]  # /tmp and the workspace persist
    assert len(_warm_containers(warm)) == 1
    # the sweeper's orphan removal leaves a live warm container alone
    assert DockerSandbox(warm.settings).remove_orphans(set()) == 0
    assert _run(warm, "$ echo three") == first


def test_a_warm_run_asks_docker_nothing_until_its_image_is_rebuilt(warm: Pipeline) -> None:
    """The group's next run goes to the container this process handed its last run to,
    with no Docker API call (counted on a real client: every request it sends); once the
    image's tag names another image, the heartbeat's tending stops the container."""
    client = docker.from_env()
    # A tag of this test's own, moved below: the shared one stays where it is.
    tag = f"orch-test-warm-{uuid.uuid4().hex[:8]}:latest"
    client.images.get(warm.settings.sandbox.agent_image).tag(tag)
    try:
        settings = warm.settings.replace(**{"agent_image": tag, "standby": 0})
        calls = DockerCalls(client)
        pool = WarmPool(settings, client)
        p = Pipeline(settings, warm.db, ChannelRegistry([RecordingChannel()]), sandbox=pool)
        first = _run(p, "$ echo one")
        assert "POST containers/create" in calls.take()  # the first run starts the container
        assert _run(p, "$ echo two") == first
        assert calls.take() == []
        assert _last_output(p).strip() == "two"

        assert pool.tend(warm.db) == 1  # its image is still the tag's
        client.images.get(settings.sandbox.base_image).tag(tag)  # "rebuilt"
        assert pool.tend(warm.db) == 0 and _warm_containers(warm) == []
    finally:
        client.images.remove(tag)


def test_a_dead_warm_container_is_replaced(warm: Pipeline) -> None:
    first = _run(warm, "$ echo one")
    docker.from_env().containers.get(first).kill()
    # The run's row is written running on the container this process knew (no write more when
    # it is the one); given another, the row names the one the run had.
    assert warm.sandbox.expected_container(get_group(warm.db, JID).folder) == first
    second = _run(warm, "$ echo after-crash")
    assert second != first and _last_output(warm).strip() == "after-crash"
    assert list_runs(warm.db, limit=1)[0].container_id == second


def test_a_timed_out_run_kills_its_container_and_the_next_starts_fresh(warm: Pipeline) -> None:
    warm.settings = warm.settings.replace(**{"run_timeout_s": 3.0})
    # Hangs the first time only: the offline model merges the unanswered
    # message into the next one and runs it again.
    first = _run(warm, "$ test -f .slept || { touch .slept; sleep 60; }", state="timed_out")
    wait_until(lambda: all(c.id != first for c in _warm_containers(warm)), 15, "the killed container to go")
    second = _run(warm, "still there?")
    assert second and second != first


def test_a_changed_configuration_replaces_the_container(warm: Pipeline) -> None:
    first = _run(warm, "$ echo one")
    warm.settings = warm.settings.replace(**{"container_memory": "256m"})
    assert _run(warm, "$ echo two") != first
    assert len(_warm_containers(warm)) == 1


def test_idle_containers_exit_and_reset_stops_one(warm: Pipeline) -> None:
    warm.settings = warm.settings.replace(**{"warm_idle_s": 2.0})
    _run(warm, "$ echo idle-soon")
    wait_until(lambda: _warm_containers(warm) == [], 20, "the idle container to exit")
    warm.settings = warm.settings.replace(**{"warm_idle_s": 60.0})
    _run(warm, "$ echo again")
    assert get_group(warm.db, JID).session_id
    stopped = reset_session(warm.db, warm.settings, JID)
    assert stopped == 1 and _warm_containers(warm) == []
    assert get_group(warm.db, JID).session_id is None


def test_a_host_keeps_at_most_its_cap_stopping_the_least_recently_used(warm: Pipeline) -> None:
    warm.settings = warm.settings.replace(**{"warm_max": 2})
    jids = {name: f"{name}@g" for name in ("one", "two", "three")}
    for name, jid in jids.items():
        add_group(warm.db, chat_jid=jid, name=name, folder=name, requires_trigger=False)

    def folders() -> list[str]:
        return sorted(c.labels[LABEL_GROUP] for c in _warm_containers(warm))

    first = {name: _run(warm, "$ echo hi", jid=jid) for name, jid in jids.items()}
    assert folders() == ["three", "two"]  # "one", used longest ago, made room for "three"
    assert _run(warm, "$ echo again", jid=jids["two"]) == first["two"]  # kept: reused, and now the newest
    assert _run(warm, "$ echo back", jid=jids["one"]) != first["one"]
    assert folders() == ["one", "two"]  # "three" was the least recently used now

    # A container with a run on it is never stopped to make room, even the least recently used:
    # with "two" busy (its run marker, as a worker holds it mid-run) and "one" idle, "three" takes "one"'s place.
    [busy] = [c for c in _warm_containers(warm) if c.labels[LABEL_GROUP] == "two"]
    marker = state_dir(warm.settings, "two") / f"{busy.id[:12]}.dirty"
    marker.touch()
    assert _run(warm, "$ echo three", jid=jids["three"]) != first["three"]
    assert folders() == ["three", "two"]
    marker.unlink()

    # A lowered cap is kept by the heartbeat's tending: the least recently used idle one goes.
    warm.settings = warm.settings.replace(**{"warm_max": 1})
    pool = WarmPool(warm.settings, docker.from_env())
    assert pool.tend(warm.db) == 1 and folders() == ["three"]
