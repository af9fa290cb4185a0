"""A group's warm container made under runc does not serve its runs once the host runs agents
under gVisor (issue 44, finding 3), with real Docker, the real image and runsc: the next run
gets a new container under runsc and the runc one is removed, in the same process (the pool's
in-process memory of the container, ``warm.known``) as in a new one (its configuration
label)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from fakes.channel import RecordingChannel
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.sandbox.containers import LABEL_INSTALL, LABEL_MANAGED
from orchestrator.sandbox.warm import WarmPool
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from tests.conftest import require_service
from tests.integration.test_gvisor import runtimes_registered

JID = "switch@g.us"


@pytest.fixture
def runc_settings(tmp_path: Path, agent_image: str) -> Iterator[Settings]:
    require_service(runtimes_registered("runsc"), "gVisor registered with Docker as `runsc` (scripts/gvisor.sh)")
    settings = Settings.load(
        data_dir=tmp_path / "data",
        agent_image=agent_image,
        run_timeout_s=90,
        max_attempts=1,
        warm_idle_s=120,
        standby=0,
        sandbox_runtime="runc",
        env_file=None,
    )
    settings.ensure_dirs()
    yield settings
    client = docker.from_env()
    WarmPool(settings, client).stop_all()
    for c in client.containers.list(
        all=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={settings.install_id}"]}
    ):
        c.remove(force=True)


def _run(p: Pipeline, text: str) -> str:
    ingest(p.db, p.settings, IncomingMessage(chat_jid=JID, sender="u", content=text), signal=None)
    [outcome] = p.drain_group(JID)
    assert outcome.run.state == "succeeded", outcome.run.error
    return outcome.run.container_id or ""


def _runtime(container_id: str) -> str | None:
    try:
        return str(docker.from_env().containers.get(container_id).attrs["HostConfig"]["Runtime"])
    except docker.errors.NotFound:
        return None


def test_switching_to_gvisor_replaces_the_groups_runc_container(runc_settings: Settings) -> None:
    db = Database(runc_settings.effective_database_url, lock_dir=runc_settings.data_dir)
    db.migrate()
    add_group(db, chat_jid=JID, name="switch", folder="switch", requires_trigger=False)
    try:
        runc = Pipeline(runc_settings, db, ChannelRegistry([RecordingChannel()]))
        first = _run(runc, "$ echo one")
        assert _run(runc, "$ echo two") == first and _runtime(first) == "runc"  # warm: kept
        gvisor = Pipeline(runc_settings.replace(sandbox_runtime="runsc"), db, ChannelRegistry([RecordingChannel()]))
        second = _run(gvisor, "$ echo three")
        assert second != first and _runtime(second) == "runsc"
        assert _runtime(first) is None  # the runc one is gone, not left beside it
    finally:
        db.dispose()
