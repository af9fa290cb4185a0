"""The workspace quota against a real agent container (the pipeline
in-process, SQLite, the offline model running each ``$ command``).

Volume mode (root with loop devices): an agent that tries to fill the disk
(``fallocate -l 3G`` or ``dd`` of 3000 MiB) hits ``No space left on device``
inside the sandbox at its 64m quota, the data dir's filesystem keeps its free
space, and the group's next run works; cold and warm containers both see the
volume.  Checked mode: a run cannot be stopped from writing, but the next run
of a workspace over its quota fails at once, not retried, with a host
message naming usage and quota.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fakes.channel import RecordingChannel, attach_recorder
from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline, RunOutcome
from orchestrator.sandbox import quota
from orchestrator.sandbox.late_mounts import mount_entries
from orchestrator.sandbox.warm import WarmPool
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after
from tests.quota_support import _no_volume_left_mounted, loops_under, mounts_under, require_volumes  # noqa: F401

JID = "main@local"
MiB = 1024**2
ATTACK = "$ fallocate -l 3G big || dd if=/dev/zero of=big bs=1M count=3000"


@dataclass
class Group:
    pipeline: Pipeline
    db: Database
    rec: RecordingChannel

    @property
    def settings(self) -> Settings:
        return self.pipeline.settings

    @property
    def workspace(self) -> Path:
        return self.settings.groups_dir / "main"

    def ask(self, text: str) -> tuple[RunOutcome, list[StoredMessage]]:
        sent = ingest(
            self.db, self.settings, IncomingMessage(chat_jid=JID, sender="u", content=text), signal=None
        ).message
        outcomes = self.pipeline.drain_group(JID)
        assert len(outcomes) == 1, outcomes
        return outcomes[0], get_messages_after(JID, sent.seq, db=self.db)


def _group(tmp_path: Path, agent_image: str, **fields: object) -> Iterator[Group]:
    settings = Settings.load(
        data_dir=tmp_path / "data",
        agent_image=agent_image,
        run_timeout_s=60,
        env_file=None,
        **fields,
    )
    settings.ensure_dirs()
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    db.migrate()
    ensure_main_group(db)
    rec = attach_recorder(db, JID)
    pipeline = Pipeline(settings, db, ChannelRegistry([rec]))
    try:
        yield Group(pipeline, db, rec)
    finally:
        if isinstance(pipeline.sandbox, WarmPool):  # a cold pipeline has no warm containers
            pipeline.sandbox.stop_all()
        db.dispose()
        quota.unmount_all(settings)
        from tests.quota_support import release_everything

        left = release_everything(tmp_path)
        assert left == ([], []), f"mounts or loop devices left behind: {left}"


@pytest.fixture(params=["cold", "warm"])
def volume_group(request: pytest.FixtureRequest, tmp_path: Path, agent_image: str) -> Iterator[Group]:
    require_volumes()
    warm = 60.0 if request.param == "warm" else 0.0
    yield from _group(tmp_path, agent_image, workspace_quota="64m", warm_idle_s=warm)


@pytest.fixture
def checked_group(tmp_path: Path, agent_image: str) -> Iterator[Group]:
    yield from _group(tmp_path, agent_image, workspace_quota="16m", workspace_quota_mode="checked", max_attempts=3)


def _tool_output(outputs: list[StoredMessage]) -> str:
    return "\n".join(m.content for m in outputs if m.message_type == "tool_result")


def test_filling_the_disk_stops_at_the_quota_inside_the_sandbox(volume_group: Group) -> None:
    g = volume_group
    g.workspace.mkdir(parents=True, exist_ok=True)
    (g.workspace / "before.txt").write_text("from before the quota\n")
    free_before = shutil.disk_usage(g.settings.data_dir).free

    started = time.monotonic()
    outcome, outputs = g.ask(ATTACK)
    took = time.monotonic() - started
    free_after = shutil.disk_usage(g.settings.data_dir).free
    image = quota.volumes_dir(g.settings) / "main.img"
    print(
        f"\nattack run: {took:.2f}s; data dir free before {free_before / MiB:.0f} MiB, "
        f"after {free_after / MiB:.0f} MiB (down {(free_before - free_after) / MiB:.0f} MiB); "
        f"image allocated {image.stat().st_blocks * 512 / MiB:.1f} MiB of {image.stat().st_size / MiB:.0f} MiB"
    )

    assert outcome.run.state == "succeeded", outcome.run.error  # the agent saw the error; the host is fine
    output = _tool_output(outputs)
    assert "No space left on device" in output, output
    # The disk lost at most the quota (other processes write too: a generous margin, far below 3 GiB).
    assert image.stat().st_blocks * 512 <= 64 * MiB
    assert free_before - free_after < 512 * MiB
    # The workspace is the volume, also as the container saw it, with what it held before.
    assert len([e for e in mount_entries() if e.mount_point == str(g.workspace)]) == 1
    assert (g.workspace / "before.txt").read_text() == "from before the quota\n"
    assert (g.workspace / "big").stat().st_size <= 64 * MiB

    # The group's next run works, can clean up, and the space comes back to the data dir (discard).
    outcome, outputs = g.ask("$ cat before.txt && rm -f big && df -k /workspace | tail -1 && echo next-run-ok")
    assert outcome.run.state == "succeeded", outcome.run.error
    output = _tool_output(outputs)
    assert "from before the quota" in output and "next-run-ok" in output
    size_k = int(output.split("next-run-ok")[0].strip().splitlines()[-1].split()[1])
    assert 48 * 1024 < size_k <= 64 * 1024, output  # the container's /workspace is the 64m volume
    deadline = time.monotonic() + 10
    while image.stat().st_blocks * 512 > 16 * MiB and time.monotonic() < deadline:
        time.sleep(0.2)
    assert image.stat().st_blocks * 512 <= 16 * MiB


def test_the_checked_mode_refuses_the_run_after_the_workspace_went_over(checked_group: Group) -> None:
    g = checked_group
    # Checked mode cannot stop a run from writing ...
    outcome, _ = g.ask("$ head -c 20000000 /dev/urandom > big && echo wrote")
    assert outcome.run.state == "succeeded", outcome.run.error
    assert quota.measure(g.workspace).bytes > 16 * MiB
    # ... but the next run is refused before any container starts, at once, not retried.
    outcome, outputs = g.ask("$ echo should-not-run")
    assert outcome.run.state == "failed" and outcome.run.attempts == 1, outcome.run
    assert "workspace quota exceeded" in (outcome.run.error or "")
    hosts = [m for m in outputs if m.message_type == "host"]
    assert len(hosts) == 1 and "19.1 MiB of its 16.0 MiB quota" in hosts[0].content, hosts
    assert any(r.startswith("🏠") and "workspace quota exceeded" in r for r in g.rec.rendered)
    assert "should-not-run" not in _tool_output(outputs)
    assert outcome.run.container_id is None
    # Freed on the host, the group runs again.
    (g.workspace / "big").unlink()
    outcome, outputs = g.ask("$ echo runs-again")
    assert outcome.run.state == "succeeded" and "runs-again" in _tool_output(outputs)


def test_turning_the_quota_on_moves_the_files_and_replaces_a_warm_container(tmp_path: Path, agent_image: str) -> None:
    require_volumes()
    groups = _group(tmp_path, agent_image, warm_idle_s=60.0)  # no quota yet
    g = next(groups)
    try:
        outcome, _ = g.ask("$ echo early > early.txt && echo written")
        assert outcome.run.state == "succeeded", outcome.run.error
        warm_before = outcome.run.container_id
        # A worker with the quota on takes the group's next run: the warm container
        # still holds the plain folder, so it is replaced, and the file moves along.
        settings = g.settings.replace(**{"workspace_quota": "64m"})
        on = Group(Pipeline(settings, g.db, ChannelRegistry([g.rec])), g.db, g.rec)
        outcome, outputs = on.ask("$ cat early.txt && df -k /workspace | tail -1 && echo later > later.txt")
        assert outcome.run.state == "succeeded", outcome.run.error
        assert outcome.run.container_id and outcome.run.container_id != warm_before
        output = _tool_output(outputs)
        assert "early" in output
        assert 48 * 1024 < int(output.strip().splitlines()[-1].split()[1]) <= 64 * 1024, output
        assert (g.workspace / "later.txt").read_text() == "later\n"
        assert len([e for e in mount_entries() if e.mount_point == str(g.workspace)]) == 1
    finally:
        next(groups, None)


# The original run is spared (its workspace holds the marker); the replay's scratch copy
# lacks it, so the replayed command is the attack.
ATTACK_UNLESS_MARKED = (
    "$ test -f marker && echo spared || fallocate -l 3G big || dd if=/dev/zero of=big bs=1M count=3000"
)


@pytest.mark.parametrize("volume_group", ["cold"], indirect=True)
def test_a_replay_cannot_fill_the_disk_through_its_scratch_copy(volume_group: Group) -> None:
    """A replay runs on a scratch copy of the workspace (orchestrator/run/replay.py): that
    copy is a volume of the group's quota too, so the replayed agent's attempt to fill the
    disk ends in "No space left on device" inside the sandbox; the data dir keeps its free
    space, the group's workspace is untouched, and the scratch volume is gone after."""
    from orchestrator.run.replay import create_replay, execute_replay
    from orchestrator.run.run_diff import run_outputs

    g = volume_group
    g.workspace.mkdir(parents=True, exist_ok=True)
    (g.workspace / "marker").write_text("spare the original\n")
    outcome, outputs = g.ask(ATTACK_UNLESS_MARKED)
    assert outcome.run.state == "succeeded" and "spared" in _tool_output(outputs), _tool_output(outputs)
    (g.workspace / "marker").unlink()
    free_before = shutil.disk_usage(g.settings.data_dir).free

    replay = create_replay(g.db, g.settings, outcome.run.id, "offline")
    done = execute_replay(g.db, g.settings, g.pipeline.sandbox, replay.id)
    said = "\n".join(o.content for o in run_outputs(g.db, done) if o.message_type == "tool_result")
    assert "No space left on device" in said, (done.state, done.error, said)
    assert shutil.disk_usage(g.settings.data_dir).free > free_before - 80 * MiB  # not the 3 GiB asked
    assert sorted(p.name for p in g.workspace.iterdir()) == []  # the group's own workspace: untouched
    assert not [p for p in g.settings.runs_dir.iterdir() if p.name.startswith(replay.id)]
    assert not mounts_under(g.settings.runs_dir)
    assert not [p for p in quota.volumes_dir(g.settings).iterdir() if p.name.startswith(quota.SCRATCH_PREFIX)]
