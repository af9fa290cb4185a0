"""The kernel's walls around an agent: seccomp, AppArmor, user namespaces (real Docker, real image).

Capabilities, the read-only root and no-new-privileges are
``test_sandbox_security.py``'s; this file checks what sits beneath them, as
the agent meets it from inside a run (cold, warm, and a standby container
with the workspace bound in after it started): Docker's default seccomp
filter is on (``Seccomp: 2``) and refuses what it exists to refuse to an
unprivileged process (``keyctl``, ``unshare`` of a user namespace, ``mount``),
where the same probe in the same image without the filter goes through, so
the probe can fail; the AppArmor profile is named exactly
when the engine confines with AppArmor; user-namespace remapping, when the
engine runs with it, maps the container's ids away from the host's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from fakes.channel import RecordingChannel
from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline, RunOutcome
from orchestrator.sandbox import containers
from orchestrator.sandbox.containers import LABEL_INSTALL, LABEL_MANAGED, engine_security_opt
from orchestrator.sandbox.warm import WarmPool
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import get_messages_after
from tests.conftest import wait_until

JID = "walls@chat"
# Each probe prints one line, "<name> ok" when the kernel let the call through, or
# "<name> refused <errno>".  keyctl and unshare(CLONE_NEWUSER) are what an unprivileged process
# may do on this kernel without seccomp; Docker's default profile refuses both.
PROBE = r"""
import ctypes, os, platform
libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": {"keyctl": 250, "unshare": 272, "mount": 165},
      "aarch64": {"keyctl": 219, "unshare": 97, "mount": 40}}[platform.machine()]
def call(name, *args):
    r = libc.syscall(NR[name], *args)
    print(name, "ok" if r >= 0 else f"refused {ctypes.get_errno()}", flush=True)
call("keyctl", 0, ctypes.c_long(-3), 0)            # KEYCTL_GET_KEYRING_ID of the session keyring
pid = os.fork()
if pid == 0:                                      # in a child: a user namespace would change ours
    call("unshare", 0x10000000)                     # CLONE_NEWUSER
    os._exit(0)
os.waitpid(pid, 0)
call("mount", b"none", b"/tmp", b"tmpfs", 0, None)
"""
STATUS = "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status; cat /proc/self/attr/current 2>/dev/null; echo"


@dataclass
class Walls:
    settings: Settings
    db: Database
    pipeline: Pipeline

    def ask(self, *lines: str) -> tuple[RunOutcome, list[str]]:
        # The offline model runs one "$ line" per command: the probe waits in the workspace.
        workspace = self.settings.groups_dir / "walls"
        workspace.mkdir(parents=True, exist_ok=True)
        (workspace / "probe.py").write_text(PROBE)
        sent = ingest(
            self.db,
            self.settings,
            IncomingMessage(chat_jid=JID, sender="u", content="\n".join(f"$ {line}" for line in lines)),
            signal=None,
        ).message
        [outcome] = self.pipeline.drain_group(JID)
        outputs: list[StoredMessage] = get_messages_after(JID, sent.seq, db=self.db)
        return outcome, [m.content for m in outputs if m.message_type == "tool_result"]


@pytest.fixture(params=["cold", "warm", "standby"])
def walls(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, agent_image: str
) -> Iterator[Walls]:
    base = tmp_path_factory.mktemp("walls").resolve()
    settings = Settings.load(
        data_dir=base / "data",
        agent_image=agent_image,
        run_timeout_s=60,
        max_attempts=1,
        warm_idle_s=0 if request.param == "cold" else 120,
        standby=1 if request.param == "standby" else 0,
        env_file=None,
    )
    settings.ensure_dirs()
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    db.migrate()
    add_group(db, chat_jid=JID, name="walls", folder="walls", requires_trigger=False)
    walls = Walls(settings, db, Pipeline(settings, db, ChannelRegistry([RecordingChannel()])))
    client = docker.from_env()
    labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={settings.install_id}"]
    pool = WarmPool(settings, client)
    if request.param == "standby":  # the run goes to a container started ahead, the workspace bound in later
        pool.tend(db)
        wait_until(lambda: pool.standby.ready() != [], 30, "a standby container ready")
    yield walls
    if request.param == "standby":  # the runs did go to it: taken by the group
        assert [pool.standby.slot_of(c).taken_by() for c in pool.standby.containers()] == ["walls"]
    pool.stop_all()
    for c in client.containers.list(all=True, filters={"label": labels}):
        c.remove(force=True)
    db.dispose()


def _lines(output: str) -> dict[str, str]:
    return {parts[0]: " ".join(parts[1:]) for parts in (line.split() for line in output.splitlines()) if parts}


def test_the_default_seccomp_filter_confines_the_agent(walls: Walls) -> None:
    outcome, [status, probed] = walls.ask(STATUS, "python3 /workspace/probe.py")
    assert outcome.run.state == "succeeded", outcome.run.error
    fields = dict(line.split(":\t") for line in status.splitlines() if ":\t" in line)
    assert fields["Seccomp"].strip() == "2", status  # a filter is installed
    assert fields["NoNewPrivs"].strip() == "1", status
    results = _lines(probed)
    for call in ("keyctl", "unshare", "mount"):
        assert results[call].startswith("refused"), (call, probed)


def test_the_probe_goes_through_without_the_filter(agent_image: str) -> None:
    """The same probe, same image, same user, every capability dropped, no-new-privileges: only
    the filter taken away.  keyctl and unshare(CLONE_NEWUSER) go through, so the refusals above
    are seccomp's, not the capabilities'."""
    client = docker.from_env()
    out = client.containers.run(
        agent_image,
        ["bash", "-c", f'{STATUS}\npython3 -c "$PROBE"'],
        entrypoint=[],
        user="1000:1000",
        environment={"PROBE": PROBE},
        network_mode="none",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges", "seccomp=unconfined"],
        read_only=True,
        tmpfs={"/tmp": "rw,nosuid,nodev,size=8m"},
        remove=True,
        stdout=True,
        stderr=True,
    ).decode()
    assert "Seccomp:\t0" in out, out
    results = _lines(out)
    assert results["keyctl"] == "ok", out
    if _unprivileged_userns_allowed():
        assert results["unshare"] == "ok", out
    assert results["mount"].startswith("refused")  # no CAP_SYS_ADMIN: that one is the capabilities'


def _unprivileged_userns_allowed() -> bool:
    flag, limit = Path("/proc/sys/kernel/unprivileged_userns_clone"), Path("/proc/sys/user/max_user_namespaces")
    return (not flag.exists() or flag.read_text().strip() != "0") and (not limit.exists() or int(limit.read_text()) > 0)


def test_apparmor_is_named_exactly_when_the_engine_confines_with_it(
    walls: Walls, caplog: pytest.LogCaptureFixture
) -> None:
    client = docker.from_env()
    engine = [str(o) for o in client.info().get("SecurityOptions") or []]
    containers._engine_security.clear()  # asked again, so its log line is seen
    with caplog.at_level(logging.INFO, logger="orchestrator.sandbox.containers"):
        outcome, [status] = walls.ask(STATUS)
        # Asked here too: a standby was created before the test, so its run asked nothing.
        opts = engine_security_opt(client)
    assert outcome.run.state == "succeeded", outcome.run.error
    if any(o.startswith("name=apparmor") for o in engine):
        assert opts == ["no-new-privileges", "apparmor=docker-default"]
        assert "docker-default (enforce)" in status, status  # the agent's own label, read from inside
    else:
        assert opts == ["no-new-privileges"]
        assert any("without an AppArmor profile" in r.getMessage() for r in caplog.records), caplog.text
        assert "docker-default" not in status, status


def test_the_agent_is_never_host_root_with_or_without_userns_remap(walls: Walls) -> None:
    engine = [str(o) for o in docker.from_env().info().get("SecurityOptions") or []]
    outcome, [uid_map, uid] = walls.ask("cat /proc/self/uid_map", "id -u")
    assert outcome.run.state == "succeeded", outcome.run.error
    inside, outside, _ = uid_map.split()
    if any(o.startswith("name=userns") for o in engine):
        assert inside == "0" and outside != "0", uid_map  # root in the container is nobody on the host
    else:
        # No remapping on this engine (docs/architecture.md, 'Kernel walls', says how to turn it on):
        # ids are the host's, so the agent itself must run as an unprivileged uid.
        assert (inside, outside) == ("0", "0"), uid_map
        assert uid.strip().isdigit() and uid.strip() != "0", uid
