"""What a run container can and cannot do, against the real Docker engine and
the real agent image (the pipeline in-process, SQLite; the offline model
runs each ``$ command`` line with the real bash tool).

Covered here: another group's workspace is out of reach, no network at all,
non-root on a read-only root with every capability gone, no API key anywhere
the agent can look, the pids limit holds a fork bomb, per-group limits and
timeouts reach the container, and allowlisted extra mounts are read-only
unless allowed otherwise.  Covered elsewhere (not repeated): the memory limit
(``test_failures.py::test_memory_hog_ends_the_run_with_a_host_message``),
the run watchdog (``test_pipeline.py::test_hung_command_is_killed_at_the_time_limit``,
``test_failures.py::test_hang_past_the_hard_limit_times_out``), the bash
tool's own timeout (``tests/container/test_offline_runner.py``), the key
outside the container's config and environment as Docker sees them
(``test_anthropic_sandbox.py::test_anthropic_tool_conversation_through_the_gateway``),
and every allowlist rule (``tests/host/test_mounts.py``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest

from fakes.channel import RecordingChannel
from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline, RunOutcome
from orchestrator.sandbox.config import set_container_config
from orchestrator.sandbox.containers import LABEL_INSTALL, LABEL_MANAGED
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, ensure_main_group
from orchestrator.store.message_log import get_messages_after

ALPHA, BRAVO = "alpha@chat", "bravo@chat"


@dataclass
class Box:
    settings: Settings
    db: Database
    pipeline: Pipeline
    base: Path

    def workspace(self, folder: str) -> Path:
        path = self.settings.groups_dir / folder
        path.mkdir(parents=True, exist_ok=True)
        return path

    def ask(self, jid: str, text: str) -> tuple[RunOutcome, list[StoredMessage]]:
        sent = ingest(
            self.db, self.settings, IncomingMessage(chat_jid=jid, sender="u", content=text), signal=None
        ).message
        outcomes = self.pipeline.drain_group(jid)
        assert len(outcomes) == 1, outcomes
        return outcomes[0], get_messages_after(jid, sent.seq, db=self.db)

    def containers(self) -> list[Any]:
        labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={self.settings.install_id}"]
        return docker.from_env().containers.list(all=True, filters={"label": labels})


@pytest.fixture
def box(tmp_path_factory: pytest.TempPathFactory, agent_image: str) -> Iterator[Box]:
    # A neutral folder name (pytest's tmp_path carries the test id, which the
    # mount rules might refuse as a blocked name).
    base = tmp_path_factory.mktemp("sbx").resolve()
    settings = Settings.load(
        data_dir=base / "data",
        agent_image=agent_image,
        run_timeout_s=60,
        max_attempts=1,
        mount_allowlist=base / "config" / "mount-allowlist.json",
        env_file=None,
    )
    settings.ensure_dirs()
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    db.migrate()
    ensure_main_group(db)
    add_group(db, chat_jid=ALPHA, name="alpha", folder="alpha", requires_trigger=False)
    add_group(db, chat_jid=BRAVO, name="bravo", folder="bravo", requires_trigger=False)
    b = Box(settings, db, Pipeline(settings, db, ChannelRegistry([RecordingChannel()])), base)
    yield b
    leftover = b.containers()
    for c in leftover:
        c.remove(force=True)
    db.dispose()
    assert leftover == [], "a run container outlived its run"


def _results(outputs: list[StoredMessage]) -> list[tuple[str, int]]:
    """(output, exit code) of each tool call, in order."""
    return [(m.content, int((m.metadata or {})["exit_code"])) for m in outputs if m.message_type == "tool_result"]


def _commands(*lines: str) -> str:
    return "\n".join(f"$ {line}" for line in lines)


# -- isolation between groups ------------------------------------------------------------


def test_a_group_cannot_read_or_list_another_groups_workspace(box: Box) -> None:
    token = uuid.uuid4().hex
    bravo = box.workspace("bravo")
    (bravo / "private").mkdir()
    (bravo / "private" / "notes.txt").write_text(f"bravo-only-{token}\n")
    (bravo / "top.txt").write_text(f"bravo-only-{token}\n")
    mine = uuid.uuid4().hex
    (box.workspace("alpha") / "mine.txt").write_text(f"alpha-visible-{mine}\n")
    data = box.settings.data_dir
    lines = [
        "cat /workspace/mine.txt",
        "ls -la / /workspace /workspace/.. /workspace/../..",
        "cat /workspace/../bravo/top.txt /workspace/../bravo/private/notes.txt",
        f"cat {data}/groups/bravo/top.txt {data}/groups/bravo/private/notes.txt",
        f"ls -laR {data} {data}/groups {data}/groups/bravo",
        "cat /workspace/../../bravo/top.txt /groups/bravo/top.txt /data/groups/bravo/top.txt",
        "ls -la /proc/1/root/ /proc/1/cwd/ /proc/1/cwd/..",
        "cat /proc/self/mountinfo",
        r"find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o \( -name bravo -o -name notes.txt"
        r" -o -name top.txt \) -print",
        "grep -rIs --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev bravo-only- / ; echo grep-done",
    ]
    outcome, outputs = box.ask(ALPHA, _commands(*lines))
    assert outcome.run.state == "succeeded", outcome.run.error
    results = _results(outputs)
    assert len(results) == len(lines), results
    everything = "\n".join(m.content for m in outputs)
    assert f"alpha-visible-{mine}" in results[0][0]  # the commands did run, in alpha's workspace
    assert "grep-done" in results[-1][0]
    assert token not in everything
    # Nothing of bravo's is even listed.
    assert "notes.txt" not in results[1][0] + results[4][0] + results[6][0] + results[8][0]
    for i in (2, 3, 5):
        assert results[i][1] != 0 and "No such file" in results[i][0], results[i]
    # The container holds exactly one folder of the groups dir: alpha's.
    mounts = results[7][0]
    assert "/groups/alpha" in mounts and "/groups/bravo" not in mounts
    assert not any(line.split()[3].rstrip("/").endswith("/groups") for line in mounts.splitlines() if line.strip())


# -- network -------------------------------------------------------------------------------

NET_PROBE = """
import socket, sys, time
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    t0 = time.monotonic()
    try:
        s = socket.create_connection((host, int(port)), timeout=5)
        print(f"{target} CONNECTED")
        s.close()
    except OSError as exc:
        print(f"{target} failed {type(exc).__name__} {exc.errno} {time.monotonic() - t0:.2f}s")
t0 = time.monotonic()
try:
    print("dns", socket.getaddrinfo("example.com", 80))
except OSError as exc:
    print(f"dns failed {type(exc).__name__} {time.monotonic() - t0:.2f}s")
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.sendto(b"x", ("1.1.1.1", 53))
    print("udp SENT")
except OSError as exc:
    print(f"udp failed {type(exc).__name__} {exc.errno}")
"""


class _Listener:
    """A TCP listener on the host that counts connections."""

    def __init__(self, host: str) -> None:
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.address = f"{host}:{self.sock.getsockname()[1]}"
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def _bridge_gateway() -> str | None:
    try:
        config = docker.from_env().networks.get("bridge").attrs["IPAM"]["Config"]
        return next((c["Gateway"] for c in config if "Gateway" in c), None)
    except Exception:  # noqa: BLE001 - no default bridge: nothing to probe there
        return None


def test_the_sandbox_has_no_network(box: Box) -> None:
    listeners = [_Listener("127.0.0.1")]
    gateway = _bridge_gateway()
    if gateway:
        try:
            listeners.append(_Listener(gateway))
        except OSError:
            pass
    (box.workspace("alpha") / "netprobe.py").write_text(NET_PROBE)
    targets = [lst.address for lst in listeners] + ["1.1.1.1:53", "8.8.8.8:443"]
    try:
        outcome, outputs = box.ask(
            ALPHA, _commands("cat /proc/net/dev", "python3 /workspace/netprobe.py " + " ".join(targets))
        )
    finally:
        for lst in listeners:
            lst.close()
    assert outcome.run.state == "succeeded", outcome.run.error
    (dev, _), (probe, code) = _results(outputs)
    interfaces = {line.split(":")[0].strip() for line in dev.splitlines() if ":" in line}
    assert interfaces == {"lo"}, dev
    assert code == 0, probe
    assert "CONNECTED" not in probe and "udp SENT" not in probe, probe
    for target in targets:
        line = next(ln for ln in probe.splitlines() if ln.startswith(target + " "))
        assert " failed " in line, line
        assert float(line.rsplit(" ", 1)[1].rstrip("s")) < 2.0, f"not an immediate failure: {line}"
    assert "dns failed" in probe, probe
    assert [lst.accepted for lst in listeners] == [0] * len(listeners)


# -- identity, filesystem, privileges -----------------------------------------------------


def test_non_root_on_a_read_only_root_without_capabilities(box: Box) -> None:
    inspected: list[dict[str, Any]] = []
    real_start = box.pipeline.sandbox.start
    client = docker.from_env()

    def start(spec: Any, payload: bytes) -> Any:
        running = real_start(spec, payload)
        inspected.append(client.api.inspect_container(running.id))
        return running

    box.pipeline.sandbox.start = start  # type: ignore[method-assign]
    set_container_config(box.db, box.settings, ALPHA, {"memory": "200m", "cpus": 0.5, "pids": 64})
    lines = [
        "id -u",
        "id -g",
        "touch /usr/x",
        "touch /x",
        "touch /etc/passwd",
        "mkdir /opt/new",
        "touch /tmp/ok && echo tmp-writable",
        "touch /workspace/ok && echo workspace-writable",
        "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status",
        "su -c true root </dev/null",
    ]
    outcome, outputs = box.ask(ALPHA, _commands(*lines))
    assert outcome.run.state == "succeeded", outcome.run.error
    results = _results(outputs)
    assert len(results) == len(lines), results
    uid, gid = results[0][0].strip(), results[1][0].strip()
    assert uid.isdigit() and uid != "0" and gid != "0", (uid, gid)
    for out, code in results[2:6]:
        assert code != 0 and ("Read-only file system" in out or "Permission denied" in out), out
    assert "Read-only file system" in results[2][0]
    assert "tmp-writable" in results[6][0] and results[6][1] == 0
    assert "workspace-writable" in results[7][0] and results[7][1] == 0
    assert (box.settings.groups_dir / "alpha" / "ok").exists()
    status = dict(line.split(":\t") for line in results[8][0].strip().splitlines())
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[cap], 16) == 0, status
    assert status["NoNewPrivs"].strip() == "1"
    assert results[9][1] != 0  # no way back to root

    # What Docker was asked for, with the group's limits applied.
    [attrs] = inspected
    host = attrs["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["CapDrop"] == ["ALL"] and not host.get("CapAdd")
    assert "no-new-privileges" in (host.get("SecurityOpt") or [])
    assert host["ReadonlyRootfs"] is True and host["Privileged"] is False
    assert "/tmp" in (host.get("Tmpfs") or {})
    assert host["Memory"] == 200 * 1024**2 and host["MemorySwap"] == 200 * 1024**2
    assert host["NanoCpus"] == 500_000_000 and host["PidsLimit"] == 64
    assert attrs["Config"]["User"] not in ("", "0", "root") and not attrs["Config"]["User"].startswith("0:")
    binds = {m["Destination"]: m for m in attrs["Mounts"]}
    assert set(binds) == {"/workspace"}, binds
    assert binds["/workspace"]["Source"] == str(box.settings.groups_dir / "alpha") and binds["/workspace"]["RW"]


# -- secrets -----------------------------------------------------------------------------

KEY_PROBE = """python3 - <<'EOF'
import os
needle = {reversed!r}[::-1]
roots = ["/run", "/workspace", "/tmp", "/etc", "/opt", "/home", "/root", "/var", "/srv", "/usr/local"]
hits, scanned = [], 0
for root in roots:
    for folder, dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as fh:
                    data = fh.read(8_000_000)
            except OSError:
                continue
            scanned += 1
            if needle.encode() in data:
                hits.append(path)
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for part in ("environ", "cmdline"):
        try:
            with open(f"/proc/{{pid}}/{{part}}", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        scanned += 1
        if needle.encode() in data:
            hits.append(f"/proc/{{pid}}/{{part}}")
if any(needle in v for v in os.environ.values()):
    hits.append("os.environ")
print("scanned", scanned, "hits", hits, "socket", os.path.exists("/run/gateway/model.sock"))
print("env names", sorted(os.environ))
EOF"""


def test_no_api_key_anywhere_the_agent_can_look(box: Box) -> None:
    from fakes.anthropic_api import FakeAnthropic, message

    key = f"sk-ant-test-{uuid.uuid4().hex}"
    probe = KEY_PROBE.format(reversed=key[::-1])
    assert key not in probe
    fake = FakeAnthropic(
        message(
            [{"type": "tool_use", "id": "toolu_probe", "name": "bash", "input": {"command": probe}}], "tool_use", n=1
        ),
        message([{"type": "text", "text": "probed"}], "end_turn", n=2),
    )
    with fake.serve() as base_url:
        box.pipeline.settings = box.settings.replace(
            **{
                "model": "anthropic:claude-fake-1",
                "anthropic_base_url": base_url,
                "anthropic_api_key": key,
            }
        )
        outcome, outputs = box.ask(ALPHA, "look for keys")
    assert outcome.run.state == "succeeded", outcome.run.error
    assert [c.headers.get("x-api-key") for c in fake.calls] == [key, key]  # a key was in play, upstream
    [(out, code)] = _results(outputs)
    assert code == 0, out
    assert "hits [] socket True" in out, out
    assert int(out.split()[1]) > 50, out  # it really looked
    assert "ANTHROPIC" not in out and "API_KEY" not in out
    assert key not in json.dumps([m.model_dump(mode="json") for m in outputs])
    assert key not in json.dumps(fake.requests)


# -- pids ----------------------------------------------------------------------------------

FORK_PROBE = """
import os, signal, time
kids, err = [], None
for _ in range(2000):
    try:
        pid = os.fork()
    except OSError as exc:
        err = exc.errno
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
print(f"forked={len(kids)} errno={err}", flush=True)
for k in kids:
    os.kill(k, signal.SIGKILL)
for k in kids:
    os.waitpid(k, 0)
"""


def test_the_pids_limit_stops_forking(box: Box) -> None:
    set_container_config(box.db, box.settings, ALPHA, {"pids": 48})
    (box.workspace("alpha") / "forkprobe.py").write_text(FORK_PROBE)
    outcome, outputs = box.ask(ALPHA, "$ python3 /workspace/forkprobe.py")
    assert outcome.run.state == "succeeded", outcome.run.error
    [(out, code)] = _results(outputs)
    fields = dict(part.split("=") for part in out.split())
    assert int(fields["forked"]) < 48, out
    assert fields["errno"] == "11", out  # EAGAIN: the cgroup's pids.max


def test_a_fork_bomb_is_contained(box: Box) -> None:
    set_container_config(box.db, box.settings, ALPHA, {"pids": 64, "run_timeout_s": 15, "bash_timeout_s": 5})
    t0 = time.monotonic()
    outcome, _ = box.ask(ALPHA, "$ bomb() { bomb | bomb & }; bomb; sleep 30")
    elapsed = time.monotonic() - t0
    assert outcome.run.state in ("succeeded", "failed", "timed_out"), outcome.run
    assert elapsed < 60, elapsed
    assert box.containers() == []
    # The host is fine, and so is the next run of the same group.
    assert subprocess.run(["true"], timeout=10).returncode == 0
    assert docker.from_env().ping()
    again, outputs = box.ask(ALPHA, "$ echo still-alive")
    assert again.run.state == "succeeded" and "still-alive" in _results(outputs)[0][0]


# -- per-group timeouts ------------------------------------------------------------------------


def test_a_groups_bash_timeout_kills_a_hung_command(box: Box) -> None:
    set_container_config(box.db, box.settings, ALPHA, {"bash_timeout_s": 2})
    t0 = time.monotonic()
    outcome, outputs = box.ask(ALPHA, _commands("sleep 40", "echo after"))
    assert outcome.run.state == "succeeded", outcome.run.error
    assert time.monotonic() - t0 < 30
    (slept, code), (after, _) = _results(outputs)
    assert code == 124 and "timed out after 2s" in slept
    assert "after" in after


def test_a_groups_shorter_run_timeout_ends_the_run(box: Box) -> None:
    set_container_config(box.db, box.settings, ALPHA, {"run_timeout_s": 3})
    t0 = time.monotonic()
    outcome, outputs = box.ask(ALPHA, "$ sleep 40")
    assert outcome.run.state == "timed_out", outcome.run
    assert time.monotonic() - t0 < 25
    assert "3s limit" in (outcome.run.error or "")
    assert sum(m.message_type == "host" for m in outputs) == 1


# -- extra mounts ------------------------------------------------------------------------------


def test_an_allowlisted_extra_mount_is_read_only_unless_allowed(box: Box) -> None:
    shared = box.base / "shared"
    (shared / "docs").mkdir(parents=True)
    (shared / "docs" / "readme.txt").write_text("shared-readme\n")
    (shared / "out").mkdir()
    if os.getuid() == 0:  # the agent runs as uid 1000 then; let it write where it may
        os.chown(shared / "out", 1000, 1000)
    allowlist = box.settings.sandbox.mount_allowlist
    allowlist.parent.mkdir(parents=True, exist_ok=True)
    allowlist.write_text(
        json.dumps(
            {
                "roots": [
                    {"path": str(shared / "docs"), "read_write": True},  # read-write for the main group only
                    {"path": str(shared / "out"), "read_write": True, "groups": ["alpha"]},
                ]
            }
        )
    )
    set_container_config(
        box.db,
        box.settings,
        ALPHA,
        {
            "extra_mounts": [
                {"host_path": str(shared / "docs")},
                {"host_path": str(shared / "out"), "name": "results", "read_write": True},
            ]
        },
    )
    outcome, outputs = box.ask(
        ALPHA,
        _commands(
            "cat /workspace/extra/docs/readme.txt",
            "touch /workspace/extra/docs/new",
            "echo x > /workspace/extra/docs/readme.txt",
            "echo written > /workspace/extra/results/report.txt && echo wrote",
            "grep ' /workspace/extra/' /proc/self/mountinfo",
        ),
    )
    assert outcome.run.state == "succeeded", outcome.run.error
    (read, _), (touch, touch_code), (over, over_code), (wrote, wrote_code), (mountinfo, _) = _results(outputs)
    assert read.strip() == "shared-readme"
    assert touch_code != 0 and "Read-only file system" in touch
    assert over_code != 0 and "Read-only file system" in over
    assert not (shared / "docs" / "new").exists()
    assert (shared / "docs" / "readme.txt").read_text() == "shared-readme\n"
    assert wrote_code == 0 and (shared / "out" / "report.txt").read_text() == "written\n"
    options = {line.split()[4]: line.split()[5].split(",")[0] for line in mountinfo.splitlines() if line.strip()}
    assert options == {"/workspace/extra/docs": "ro", "/workspace/extra/results": "rw"}, mountinfo

    # Asking for read-write on the read-only-for-alpha root is refused before anything runs.
    from orchestrator.core.errors import MountRefused

    with pytest.raises(MountRefused, match="must name group 'alpha'"):
        set_container_config(
            box.db, box.settings, ALPHA, {"extra_mounts": [{"host_path": str(shared / "docs"), "read_write": True}]}
        )
