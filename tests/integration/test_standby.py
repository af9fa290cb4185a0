"""Standby sandboxes with real Docker: a quiet group's first run is handed to a
container started ahead, with the group's workspace bound in after it
started (mount propagation); it then is that group's warm container, never
another's; the pool is refilled; the hardening is a cold container's; a group
that needs other limits is not served by one; a gone container's slot is
released, mounts and all."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
from prometheus_client import REGISTRY

from fakes.channel import RecordingChannel
from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline, RunOutcome
from orchestrator.sandbox import late_mounts
from orchestrator.sandbox.config import set_container_config
from orchestrator.sandbox.containers import list_containers
from orchestrator.sandbox.late_mounts import is_mount_point
from orchestrator.sandbox.standby import LABEL_STANDBY, Slot, standby_root
from orchestrator.sandbox.warm import WarmPool
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import get_messages_after
from tests.conftest import wait_until

ALPHA, BRAVO = "alpha@chat", "bravo@chat"


@dataclass
class Pool:
    settings: Settings
    db: Database
    pipeline: Pipeline
    warm: WarmPool

    def ask(self, jid: str, *lines: str) -> tuple[RunOutcome, list[str]]:
        sent = ingest(
            self.db,
            self.settings,
            IncomingMessage(chat_jid=jid, sender="u", content="\n".join(f"$ {line}" for line in lines)),
            signal=None,
        ).message
        [outcome] = self.pipeline.drain_group(jid)
        assert outcome.run.state == "succeeded", outcome.run.error
        outputs: list[StoredMessage] = get_messages_after(jid, sent.seq, db=self.db)
        return outcome, [m.content for m in outputs if m.message_type == "tool_result"]

    def waiting(self) -> list[docker.models.containers.Container]:
        """Standby containers still in the pool, ready (their runner's socket is bound)."""
        return [c for c, _ in self.warm.standby.ready()]

    def fill(self, n: int) -> list[str]:
        self.warm.tend(self.db)
        wait_until(lambda: len(self.waiting()) == n, 30, f"{n} standby container(s) ready")
        return sorted(str(c.id) for c in self.waiting())


@pytest.fixture
def pool(tmp_path_factory: pytest.TempPathFactory, agent_image: str) -> Iterator[Pool]:
    base = tmp_path_factory.mktemp("standby").resolve()
    settings = Settings.load(
        data_dir=base / "data",
        agent_image=agent_image,
        run_timeout_s=60,
        max_attempts=1,
        warm_idle_s=120,
        standby=1,
        env_file=None,
    )
    settings.ensure_dirs()
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    db.migrate()
    add_group(db, chat_jid=ALPHA, name="alpha", folder="alpha", requires_trigger=False)
    add_group(db, chat_jid=BRAVO, name="bravo", folder="bravo", requires_trigger=False)
    pipeline = Pipeline(settings, db, ChannelRegistry([RecordingChannel()]))
    p = Pool(settings, db, pipeline, WarmPool(settings, docker.from_env()))
    yield p
    p.warm.stop_all()
    db.dispose()
    root = str(standby_root(settings))
    with open("/proc/self/mountinfo") as fh:
        assert root not in fh.read(), "a standby mount outlived its pool"


def _starts(mode: str) -> float:
    return REGISTRY.get_sample_value("orchestrator_container_start_seconds_count", {"mode": mode}) or 0.0


def test_a_quiet_groups_first_run_takes_a_standby_container_and_keeps_it(pool: Pool) -> None:
    [standby] = pool.fill(1)
    token = uuid.uuid4().hex
    before = {mode: _starts(mode) for mode in ("cold", "warm", "standby")}
    outcome, [wrote, seen] = pool.ask(ALPHA, f"echo {token} > made-here.txt && id -u", "grep -c . /proc/self/mountinfo")
    assert outcome.run.container_id == standby  # the run went to the container started ahead
    # Its start counted as what it was: an adopted standby, not a cold start.
    assert {mode: _starts(mode) - n for mode, n in before.items()} == {"cold": 0, "warm": 0, "standby": 1}
    assert wrote.strip() == "1000"
    # What it wrote is in the group's own folder on the host, owned by the container's user.
    made = pool.settings.groups_dir / "alpha" / "made-here.txt"
    assert made.read_text().strip() == token and made.stat().st_uid == 1000
    again, _ = pool.ask(ALPHA, "cat made-here.txt")
    assert again.run.container_id == standby  # now alpha's warm container
    assert _starts("warm") - before["warm"] == 1
    # The pool is refilled with another; alpha's is no longer in it.
    [fresh] = pool.fill(1)
    assert fresh != standby
    assert int(seen.strip()) > 0


def test_a_standby_is_hardened_like_any_agent_container_and_sees_only_its_group(pool: Pool) -> None:
    pool.settings = pool.settings.replace(standby=2)
    pool.warm = WarmPool(pool.settings, docker.from_env())
    pool.pipeline.settings = pool.settings
    pool.fill(2)
    secret = uuid.uuid4().hex
    bravo = pool.settings.groups_dir / "bravo"
    bravo.mkdir(parents=True, exist_ok=True)
    (bravo / "secret.txt").write_text(f"bravo-only-{secret}\n")
    _, [first] = pool.ask(BRAVO, "cat secret.txt")
    assert secret in first
    data = pool.settings.data_dir
    outcome, outputs = pool.ask(
        ALPHA,
        "cat /proc/self/mountinfo",
        f"cat /workspace/../bravo/secret.txt {data}/groups/bravo/secret.txt; true",
        "touch /run/gateway/planted 2>&1; true",
        "head -c 200000 /dev/zero > /run/standby/big; rm -f /run/standby/big; true",
        "cat /proc/net/dev",
        "grep -E '^(Seccomp|NoNewPrivs|CapEff)' /proc/self/status",
        r"grep -rIs --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev bravo-only- / ; echo grep-done",
    )
    mounts, _, gateway, sockets, dev, status_lines, grep = outputs
    assert secret not in "\n".join(outputs) and "grep-done" in grep
    # Exactly alpha's folder at /workspace, bound in after the container started; bravo's nowhere.
    workspace = [line for line in mounts.splitlines() if line.split()[4] == "/workspace"]
    assert workspace and workspace[-1].split()[3].endswith("/groups/alpha"), mounts
    assert "/groups/bravo" not in mounts
    assert "Read-only file system" in gateway  # the gateway folder, read-only from its first moment
    assert "No space left on device" in sockets  # the socket folder is a tiny tmpfs, not the host's disk
    assert {line.split(":")[0].strip() for line in dev.splitlines() if ":" in line} == {"lo"}, dev
    status = dict(line.split(":\t") for line in status_lines.splitlines() if ":\t" in line)
    assert status["Seccomp"].strip() == "2" and status["NoNewPrivs"].strip() == "1"
    assert int(status["CapEff"].strip(), 16) == 0
    # Docker's own view: a standby is created as hardened as a cold container.
    inspected = docker.from_env().api.inspect_container(outcome.run.container_id)
    host = inspected["HostConfig"]
    assert inspected["Config"]["User"] == "1000:1000" and host["NetworkMode"] == "none"
    assert host["CapDrop"] == ["ALL"] and host["ReadonlyRootfs"] is True
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["Memory"] == 512 * 1024**2 and host["PidsLimit"] == pool.settings.sandbox.container_pids
    assert inspected["Config"]["Labels"].get(LABEL_STANDBY)
    # Alpha's and bravo's are two containers: a standby serves one group only.
    assert outcome.run.container_id != pool.ask(BRAVO, "true")[0].run.container_id


def test_a_group_with_its_own_limits_starts_its_own_container(pool: Pool) -> None:
    [standby] = pool.fill(1)
    set_container_config(pool.db, pool.settings, ALPHA, {"memory": "256m"})
    outcome, _ = pool.ask(ALPHA, "true")
    assert outcome.run.container_id != standby
    assert [str(c.id) for c in pool.waiting()] == [standby]  # still in the pool, for a group it fits


def test_a_gone_standbys_slot_is_released_mounts_and_all(pool: Pool) -> None:
    [standby] = pool.fill(1)
    outcome, _ = pool.ask(ALPHA, "echo kept > kept.txt")
    slot = Slot(standby_root(pool.settings) / docker.from_env().containers.get(standby).labels[LABEL_STANDBY])
    assert is_mount_point(slot.workspace) and is_mount_point(slot.gateway)
    docker.from_env().containers.get(standby).kill()
    wait_until(
        lambda: not list_containers(docker.from_env(), all=True, filters={"id": standby}),
        20,
        "the killed container to be removed",
    )
    again, [kept] = pool.ask(ALPHA, "cat kept.txt")
    assert again.run.container_id != standby and kept.strip() == "kept"  # the group's files stayed
    assert not slot.root.exists() and not is_mount_point(slot.workspace)
    assert (pool.settings.groups_dir / "alpha" / "kept.txt").exists()


def test_standby_is_off_where_folders_cannot_be_bound() -> None:
    """The probe itself, as an unprivileged user (a copy of the module: it needs only
    the standard library, and neither this checkout nor pytest's temporary folders are
    that user's to read)."""
    probe = "import sys; from pathlib import Path; import late_mounts; print(late_mounts.unavailable_reason(Path(sys.argv[1])))"
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin") or sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o777)
        shutil.copy(late_mounts.__file__, Path(tmp) / "late_mounts.py")

        def run(**kw: object) -> str:
            return subprocess.run(
                [python, "-c", probe, f"{tmp}/probe"],
                capture_output=True,
                text=True,
                cwd=tmp,
                timeout=60,
                check=True,
                **kw,
            ).stdout.strip()  # type: ignore[call-overload]

        assert "not root" in run(user=65534)
        assert run() == "None"  # as root here: it can


def test_a_worker_whose_binds_the_engine_cannot_see_turns_standby_off(pool: Pool) -> None:
    """A worker in a mount namespace of its own (as in a container) binds where no
    container sees it: the check from the container's side catches it, and the run
    would otherwise meet an empty workspace."""
    pool.fill(1)
    script = (
        "import sys, docker; from pathlib import Path\n"
        "from orchestrator.core.errors import SandboxError\n"
        "from orchestrator.core.settings import Settings\n"
        "from orchestrator.sandbox import standby\n"
        "from orchestrator.sandbox.warm import WarmPool\n"
        "settings = Settings.load(data_dir=Path(sys.argv[1]), agent_image=sys.argv[2], warm_idle_s=120, standby=1,"
        " env_file=None)\n"
        "pool = WarmPool(settings, docker.from_env())\n"
        "container, slot = pool.standby.take('alpha')\n"
        "ws = settings.groups_dir / 'alpha'; ws.mkdir(parents=True, exist_ok=True)\n"
        "gw = settings.data_dir / 'gateway' / 'alpha'; gw.mkdir(parents=True, exist_ok=True)\n"
        "try:\n"
        "    pool.standby.attach(container, slot, ws, gw)\n"
        "    print('ATTACHED')\n"
        "except SandboxError as exc:\n"
        "    print('REFUSED', exc, '|', standby.unavailable_reason(settings, pool.client))\n"
    )
    out = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            sys.executable,
            "-c",
            script,
            str(pool.settings.data_dir),
            pool.settings.sandbox.agent_image,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("REFUSED") and "not seen inside it" in out.stdout, out.stdout
    assert out.stdout.count("not seen inside it") == 2  # and standby is off in that process from then on


def test_an_adopted_standby_reaches_the_model_through_the_groups_gateway(pool: Pool) -> None:
    """A model run in a standby container: the gateway socket the host binds in the group's
    gateway folder is seen at /run/gateway through the late read-only bind."""
    from fakes.anthropic_api import FakeAnthropic, message

    [standby] = pool.fill(1)
    fake = FakeAnthropic(
        message(
            [{"type": "tool_use", "id": "toolu_sb_1", "name": "bash", "input": {"command": "echo via-standby"}}],
            "tool_use",
            n=1,
        ),
        message([{"type": "text", "text": "done"}], "end_turn", n=2),
    )
    with fake.serve() as base_url:
        pool.pipeline.settings = pool.settings.replace(
            **{"model": "anthropic:claude-fake-1", "anthropic_base_url": base_url, "anthropic_api_key": "sk-standby-1"}
        )
        outcome, [output] = pool.ask(ALPHA, "please")
    assert outcome.run.container_id == standby
    assert "via-standby" in output and len(fake.calls) == 2
    assert all(c.headers.get("x-api-key") == "sk-standby-1" for c in fake.calls)  # the key stayed on the host


def test_a_dead_hosts_warm_and_standby_containers_are_removed_by_a_live_host(pool: Pool) -> None:
    """A worker SIGKILLed for good left its standby and warm containers running forever:
    no other host tended them.  Any live host on the same engine removes them once the
    dead host has not beaten for ORCHESTRATOR_DEAD_HOST_S, and not before."""
    from datetime import timedelta

    from sqlalchemy import update

    from orchestrator.sandbox.warm import tending as warm_tending
    from orchestrator.store import hosts
    from orchestrator.store.tables import HostRow

    pool.fill(1)
    pool.ask(ALPHA, "echo hi")  # alpha takes the standby container: now its warm one
    pool.fill(1)  # and the pool is refilled
    dead_host = pool.settings.fleet.effective_host_id
    mine = {
        str(c.id)
        for c in list_containers(
            pool.warm.client,
            all=True,
            filters={"label": [f"orchestrator.install={pool.settings.install_id}", f"orchestrator.host={dead_host}"]},
        )
    }
    assert len(mine) == 2, mine
    hosts.register(pool.db, host_id=dead_host, instance="gone", version="test", concurrency=1)

    def silent_for(seconds: float) -> None:
        with pool.db.write() as session:
            session.execute(
                update(HostRow)
                .where(HostRow.host_id == dead_host)
                .values(heartbeat_at=hosts.database_now(pool.db) - timedelta(seconds=seconds))
            )
        warm_tending._reaped_at.clear()  # looked at again at once, not REAP_EVERY_S later

    live = Settings.load(
        data_dir=pool.settings.data_dir,
        agent_image=pool.settings.sandbox.agent_image,
        warm_idle_s=120,
        standby=0,
        host_id="live-host",
        dead_host_s=60,
        env_file=None,
    )
    other = WarmPool(live, pool.warm.client)
    silent_for(30)  # dead to the fleet (past the 9 s window), not yet for its containers
    assert other.remove_dead_hosts_containers(pool.db) == 0
    silent_for(90)
    assert other.remove_dead_hosts_containers(pool.db) == 2
    left = {
        str(c.id)
        for c in list_containers(
            pool.warm.client, all=True, filters={"label": [f"orchestrator.install={pool.settings.install_id}"]}
        )
    }
    assert not left & mine, left & mine
    assert not pool.warm.standby.containers(any_host=True, running_only=False)
