"""gVisor (runsc) as the agent's runtime, with real Docker and the real image.

``scripts/gvisor.sh --test-runtimes`` (run by ``.ci/run``) registers ``runsc`` the
way the product needs it, and two wrong ways the probe must refuse: without
cgroups (Docker's limits are then not enforced) and without host unix sockets
(warm sessions and the model gateway then cannot work).  Runs go through the
pipeline in-process (SQLite), cold and warm, and the agent meets gVisor's kernel,
its memory limit and its pid cap from inside.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from fakes.channel import RecordingChannel
from orchestrator.core.errors import SandboxError
from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline, RunOutcome
from orchestrator.sandbox import runtime as runtimes
from orchestrator.sandbox import standby
from orchestrator.sandbox.containers import LABEL_INSTALL, LABEL_MANAGED
from orchestrator.sandbox.warm import WarmPool
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import get_messages_after
from tests.conftest import require_service

JID = "gvisor@chat"


def runtimes_registered(*names: str) -> bool:
    try:
        have = docker.from_env().info().get("Runtimes") or {}
    except docker.errors.DockerException:
        return False
    return all(n in have for n in names)


@pytest.fixture(scope="module")
def gvisor() -> None:
    require_service(runtimes_registered("runsc"), "gVisor registered with Docker as `runsc` (scripts/gvisor.sh)")


@dataclass
class Sandboxed:
    settings: Settings
    db: Database
    pipeline: Pipeline

    def ask(self, *lines: str) -> tuple[RunOutcome, list[str]]:
        sent = ingest(
            self.db,
            self.settings,
            IncomingMessage(chat_jid=JID, sender="u", content="\n".join(f"$ {line}" for line in lines)),
            signal=None,
        ).message
        [outcome] = self.pipeline.drain_group(JID)
        outputs: list[StoredMessage] = get_messages_after(JID, sent.seq, db=self.db)
        return outcome, [m.content for m in outputs if m.message_type == "tool_result"]


def _sandboxed(base: Path, agent_image: str, **overrides: object) -> Iterator[Sandboxed]:
    settings = Settings.load(
        data_dir=base / "data",
        agent_image=agent_image,
        run_timeout_s=90,
        max_attempts=1,
        env_file=None,
        **{"sandbox_runtime": "runsc", **overrides},
    )
    settings.ensure_dirs()
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    db.migrate()
    add_group(db, chat_jid=JID, name="gvisor", folder="gvisor", requires_trigger=False)
    yield Sandboxed(settings, db, Pipeline(settings, db, ChannelRegistry([RecordingChannel()])))
    client = docker.from_env()
    WarmPool(settings, client).stop_all()
    labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={settings.install_id}"]
    for c in client.containers.list(all=True, filters={"label": labels}):
        c.remove(force=True)
    db.dispose()


@pytest.fixture(params=["cold", "warm"])
def sandboxed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, agent_image: str, gvisor: None
) -> Iterator[Sandboxed]:
    warm_idle_s = 0 if request.param == "cold" else 120
    yield from _sandboxed(tmp_path_factory.mktemp("gvisor").resolve(), agent_image, warm_idle_s=warm_idle_s)


def test_the_probe_passes_runsc_and_refuses_it_without_cgroups_or_host_sockets(agent_image: str, gvisor: None) -> None:
    client = docker.from_env()
    assert runtimes.gvisor_problem(client, agent_image) is None
    # runc is not gVisor: the sandbox would report the host's kernel.
    assert "host's kernel" in (runtimes.gvisor_problem(client, agent_image, runtime="runc") or "")
    require_service(
        runtimes_registered("runsc-nocgroups", "runsc-nouds"),
        "the probe's wrong runtimes (scripts/gvisor.sh --test-runtimes)",
    )
    assert "memory limit is not enforced" in (
        runtimes.gvisor_problem(client, agent_image, runtime="runsc-nocgroups") or ""
    )
    assert "--host-uds=all" in (runtimes.gvisor_problem(client, agent_image, runtime="runsc-nouds") or "")
    # The pid cap on its own: held under runsc, not without cgroups (64 sleeping processes).
    assert runtimes.pid_cap_problem(client, agent_image) is None
    assert "pid cap is not enforced" in (runtimes.pid_cap_problem(client, agent_image, runtime="runsc-nocgroups") or "")
    assert "no runtime named" in (runtimes.gvisor_problem(client, agent_image, runtime="runsc-absent") or "")


def test_runsc_is_refused_with_its_reason_and_auto_falls_back_to_runc(
    tmp_path: Path, agent_image: str, gvisor: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A runsc that fails its probe stops the process (never runs without its limits);
    auto says why it takes runc.  Shown with runsc's no-cgroups twin."""
    require_service(
        runtimes_registered("runsc-nocgroups"), "the probe's wrong runtimes (scripts/gvisor.sh --test-runtimes)"
    )
    client = docker.from_env()
    strict = Settings.load(data_dir=tmp_path / "a", agent_image=agent_image, sandbox_runtime="runsc", env_file=None)
    with pytest.raises(SandboxError, match="memory limit is not enforced"):
        runtimes.engine_runtime(client, strict, gvisor="runsc-nocgroups")
    auto = Settings.load(data_dir=tmp_path / "b", agent_image=agent_image, sandbox_runtime="auto", env_file=None)
    with caplog.at_level(logging.WARNING, logger=runtimes.__name__):
        chosen = runtimes.engine_runtime(client, auto, gvisor="runsc-nocgroups")
    assert chosen.name == "runc" and not chosen.gvisor
    assert "memory limit is not enforced" in caplog.text


def test_the_agent_meets_gvisors_kernel(sandboxed: Sandboxed) -> None:
    outcome, outputs = sandboxed.ask("uname -r", "id -u", "echo hi > f && cat f && git init -q . && git status -s")
    assert outcome.run.state == "succeeded", outcome.run.error
    assert outputs[0].strip() != os.uname().release, "the agent saw the host's kernel"
    assert outputs[0].strip() == "4.4.0", outputs
    assert outputs[1].strip() == "1000"
    assert "hi" in outputs[2] and "?? f" in outputs[2]
    # A second run: warm, it reuses the container through the socket gVisor lets cross.
    outcome, outputs = sandboxed.ask("cat f")
    assert outcome.run.state == "succeeded" and outputs == ["hi\n"] or outputs[0].strip() == "hi", outputs


def test_a_memory_hog_is_stopped(tmp_path_factory: pytest.TempPathFactory, agent_image: str, gvisor: None) -> None:
    for box in _sandboxed(
        tmp_path_factory.mktemp("gvisor").resolve(), agent_image, warm_idle_s=0, container_memory="128m"
    ):
        # Once: a failed run's message is shown again with the next one, which replays it.
        hog = "python3 -c 'b = [bytearray(16 << 20) for _ in range(64)]; print(\"survived\")'"
        outcome, _ = box.ask(f"[ -e tried ] || {{ touch tried; {hog}; }}")
        assert outcome.run.state == "failed", "a run past its memory limit was not stopped"
        outcome, outputs = box.ask("echo after")
        assert outcome.run.state == "succeeded" and outputs[-1].strip() == "after", outcome.run.error


def test_a_fork_bomb_is_stopped(tmp_path_factory: pytest.TempPathFactory, agent_image: str, gvisor: None) -> None:
    """Past the pid cap gVisor's sandbox is killed (each process inside costs host
    threads, which the engine's cap counts) or a fork is refused; either way the bomb
    ends and the next run works."""
    for box in _sandboxed(tmp_path_factory.mktemp("gvisor").resolve(), agent_image, warm_idle_s=0, container_pids=32):
        forever = "python3 -c 'import os; [os.fork() for _ in iter(int, 1)]'"
        bomb = f"[ -e tried ] || {{ touch tried; {forever}; }}; echo bomb-ended"
        outcome, outputs = box.ask(bomb)
        assert outcome.run.state == "failed" or all("bomb-ended" in o for o in outputs), (outcome.run, outputs)
        outcome, outputs = box.ask("echo after")
        assert outcome.run.state == "succeeded" and outputs[-1].strip() == "after", outcome.run.error


def test_standby_is_off_under_gvisor_and_says_why(tmp_path: Path, agent_image: str, gvisor: None) -> None:
    settings = Settings.load(
        data_dir=tmp_path / "data",
        agent_image=agent_image,
        sandbox_runtime="runsc",
        warm_idle_s=120,
        standby=1,
        env_file=None,
    )
    reason = standby.unavailable_reason(settings, docker.from_env())
    assert reason is not None and "gVisor" in reason
