"""Two machines over one shared data dir, with workspace volumes on (issue 45): what fences a
group's ext4 image when its host dies or is cut off.

Two "machines" on this one kernel: worker A sees the data dir at its path; worker B sees the
same files through a private bind mount at another path, so a volume mounted through one is
not mounted through the other (two mount tables over one storage), and each has a machine
identity of its own (``ORCHESTRATOR_MACHINE_ID``).  Nothing but the image's multiple-mount
protection (``orchestrator/sandbox/mmp.py``) and the hosts' own fences stands between the two
kernels' mounts, as between two real machines.  Fleet stack (PostgreSQL + Redis).

* **SIGKILL**: A answers, then A's worker is SIGKILLed; its kernel keeps the image mounted.
  B takes the group and its hold once A is dead, but B's mount is refused: the group waits,
  said once, until a worker restarted with A's identity lets go of the volume; then B
  answers, once, with the files A wrote.
* **partition**: A's connections to the database and the broker go through fault proxies on
  loopback, cut after A answered.  A fences itself on its own clock (its warm container gone,
  the volume unmounted) before B may take the group, says so in its log; B answers once; the
  proxies heal and A writes nothing more; ``e2fsck -n`` finds the image clean.  Again with
  the group awaiting the answer to a question when A is cut off: B runs the answer, once;
  and with A's deliverer waiting on a webhook's answer to its post: the claim runs out, B
  sends it again with its delivery id, the receiver acts on it once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
from docker.models.containers import Container

from fakes.webhook_receiver import Received, WebhookReceiver
from orchestrator.cli.supervisor import QUEUES, worker_argv
from orchestrator.root import Orchestrator
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.sandbox import quota
from orchestrator.sandbox.containers import LABEL_INSTALL
from orchestrator.sandbox.warm import LABEL_HOST
from orchestrator.store import hosts
from orchestrator.store.attachments import attach_channel
from orchestrator.store.deliveries import list_deliveries
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.questions import chat_questions
from orchestrator.store.runs import Run, list_runs
from orchestrator.store.volume_holds import holder
from tests.conftest import wait_until
from tests.fault_proxy import FaultProxy
from tests.quota_support import release_everything, require_volumes

from .conftest import Stack

A, B = "machine-a", "machine-b"
JID, FOLDER = "p@x", "p"
INSTALL = "partition-trial"


@dataclass
class Machines:
    stack: Stack
    root: Orchestrator
    there: Path  # the data dir as machine B sees it
    proxies: list[FaultProxy]
    procs: dict[str, subprocess.Popen[bytes]]

    def worker(self, machine: str, queues: tuple[str, ...] = QUEUES, node: str = "") -> subprocess.Popen[bytes]:
        """A worker of ``machine`` (host id = machine id) consuming ``queues``, in its own session."""
        env = self.stack.env | {
            "ORCHESTRATOR_HOST_ID": machine,
            "ORCHESTRATOR_MACHINE_ID": machine,
            "ORCHESTRATOR_INSTALLATION_ID": INSTALL,
            "ORCHESTRATOR_WORKSPACE_QUOTA": "64m",
            "ORCHESTRATOR_WARM_IDLE_S": "30",
        }
        if machine == A:
            pg, redis = self.proxies
            env["ORCHESTRATOR_DATABASE_URL"] = pg.url(env["ORCHESTRATOR_DATABASE_URL"])
            env["ORCHESTRATOR_BROKER_URL"] = redis.url(env["ORCHESTRATOR_BROKER_URL"])
        else:
            env["ORCHESTRATOR_DATA_DIR"] = str(self.there)
        log = self.stack.settings.data_dir.parent / f"worker-{machine}-{len(self.stack.procs)}.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                worker_argv(2, queues=queues, name=f"{node or machine}@%h"),
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                cwd=self.stack.settings.data_dir.parent,
                start_new_session=True,
            )
        self.stack.procs.append(proc)
        self.stack.logs.append(log)
        self.procs[machine] = proc
        wait_until(lambda: _up(self.stack, machine), 90, f"{machine} up", self.stack.worker_logs)
        return proc

    def send(self, text: str) -> int:
        return ingest(
            self.stack.db,
            self.stack.settings,
            IncomingMessage(chat_jid=JID, sender="u", content=text),
            signal=self.root.signals.group,
        ).message.seq

    def replies(self, after: int) -> list[str]:
        return [m.content for m in get_messages_after(JID, after, db=self.stack.db) if m.sender == "bot"]

    def answered(self, seq: int, timeout: float) -> str:
        wait_until(lambda: bool(self.replies(seq)), timeout, f"the answer to {seq}", self.stack.worker_logs)
        return self.replies(seq)[0]

    def told(self) -> list[str]:
        return [m.content for m in get_messages_after(JID, 0, db=self.stack.db) if m.message_type == "host"]

    def volume(self, machine: str) -> quota.Volume:
        data = self.stack.settings.data_dir if machine == A else self.there
        return quota.Volume.of(self.stack.settings.replace(data_dir=data), FOLDER)

    def log_of(self, machine: str) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.stack.logs if f"worker-{machine}-" in p.name)


def _up(stack: Stack, host: str) -> bool:
    h = hosts.get_host(stack.db, host)
    return h is not None and h.alive and h.state == "up"


def _containers_of(host: str) -> list[Container]:
    labels = [f"{LABEL_INSTALL}={INSTALL}", f"{LABEL_HOST}={host}"]
    return docker.from_env().containers.list(filters={"label": labels, "status": "running"})


@pytest.fixture
def machines(stack: Stack) -> Iterator[Machines]:
    require_volumes()
    data = stack.settings.data_dir
    there = data.parent / "machine-b-view"
    there.mkdir()
    subprocess.run(["mount", "--bind", str(data), str(there)], check=True)
    subprocess.run(["mount", "--make-private", str(there)], check=True)
    pg_url, redis_url = stack.env["ORCHESTRATOR_DATABASE_URL"], stack.env["ORCHESTRATOR_BROKER_URL"]
    from urllib.parse import urlsplit

    with contextlib.ExitStack() as cleanup:
        proxies = [
            cleanup.enter_context(FaultProxy(urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 0))
            for url in (pg_url, redis_url)
        ]
        root = Orchestrator(stack.settings)
        cleanup.callback(root.close)
        add_group(stack.db, chat_jid=JID, name="p", folder=FOLDER, requires_trigger=False)
        try:
            yield Machines(stack, root, there, proxies, {})
        finally:
            for proxy in proxies:
                proxy.heal()
            for proc in stack.procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            client = docker.from_env()
            for c in client.containers.list(all=True, filters={"label": [f"{LABEL_INSTALL}={INSTALL}"]}):
                with contextlib.suppress(docker.errors.NotFound):
                    c.remove(force=True)
            for view in (there, data):
                quota.unmount_all(stack.settings.replace(data_dir=view, workspace_quota="64m"))
            subprocess.run(["umount", "-l", str(there)], check=False)
            release_everything(data)


def _clean(image: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["e2fsck", "-n", "-f", str(image)], capture_output=True, text=True, check=False)


def _first_answer_on_a(m: Machines, b_queues: tuple[str, ...] = QUEUES) -> str:
    """Both machines' workers up (B's consuming ``b_queues``), the group placed on A, a file
    written there by a first run."""
    m.worker(A)
    m.worker(B, b_queues)
    assert m.stack.cli("groups", "move", JID, A).returncode == 0
    marker = f"kept-{uuid.uuid4().hex[:8]}"
    seq = m.send(f"$ echo {marker} > note.txt")
    assert "exit 0" in m.answered(seq, 90)
    return marker


@pytest.mark.parametrize("stack", ["fleet"], indirect=True)
def test_a_killed_machines_mount_keeps_the_group_waiting_until_that_machine_lets_go(machines: Machines) -> None:
    m = machines
    marker = _first_answer_on_a(m)
    assert m.volume(A).mounted() == "ours" and m.volume(B).mounted() is None

    os.killpg(m.procs[A].pid, signal.SIGKILL)
    m.procs[A].wait()
    t0 = time.monotonic()
    seq = m.send("$ cat note.txt")
    # B takes the hold with A's leases, but A's kernel still has the image: B's mount is refused.
    wait_until(lambda: holder(m.stack.db, FOLDER) == B, 60, "B to hold the volume", m.stack.worker_logs)
    wait_until(lambda: any("still mounted by machine" in t for t in m.told()), 60, "the wait said", m.stack.worker_logs)
    assert not m.replies(seq) and m.volume(B).mounted() is None
    refused_after = time.monotonic() - t0
    time.sleep(12)  # one more look, refused again: still nothing, still said once
    assert not m.replies(seq)
    assert sum("still mounted by machine" in t for t in m.told()) == 1

    restarted_at = time.monotonic() - t0
    m.worker(A)  # A's worker again: its first beat lets go of what B's machine holds now
    answer = m.answered(seq, 90)
    elapsed = time.monotonic() - t0
    assert marker in answer and len(m.replies(seq)) == 1
    assert m.volume(A).mounted() is None and m.volume(B).mounted() == "ours"
    assert "held by host machine-b of another machine: its volumes are unmounted here" in m.log_of(A)
    owners = [
        hosts.owner_host(r.owner) for r in list_runs(m.stack.db, chat_jid=JID, limit=10) if r.state == "succeeded"
    ]
    assert owners[0] == B, owners  # the newest: B's
    print(
        f"PARTITION: a SIGKILLed machine's mount refused to the other machine ({refused_after:.1f} s after the "
        f"kill: waiting, said once); answered once {elapsed:.1f} s after the kill, A's worker restarted "
        f"{restarted_at:.1f} s after it"
    )


@pytest.mark.parametrize("stack", ["fleet"], indirect=True)
def test_a_cut_off_machine_fences_itself_before_the_other_takes_its_group(machines: Machines) -> None:
    m = machines
    marker = _first_answer_on_a(m)
    assert m.volume(A).mounted() == "ours" and _containers_of(A)  # its warm container, its mount

    for proxy in m.proxies:
        proxy.cut()
    t0 = time.monotonic()
    seq = m.send("$ cat note.txt")
    # A, on its own clock: its sandbox gone and its volume unmounted, with nobody else's help
    # (B cannot take the group before A has been silent for the liveness window).
    wait_until(
        lambda: m.volume(A).mounted() is None and not _containers_of(A), 30, "A to fence itself", m.stack.worker_logs
    )
    fenced_after = time.monotonic() - t0
    first_b_run = [r for r in list_runs(m.stack.db, chat_jid=JID, limit=10) if hosts.owner_host(r.owner) == B]
    assert first_b_run == [], "B ran the group before A had fenced itself"
    answer = m.answered(seq, 90)
    elapsed = time.monotonic() - t0
    assert marker in answer and len(m.replies(seq)) == 1
    assert "fenced itself" in m.log_of(A) and f"volumes unmounted: {FOLDER}" in m.log_of(A)
    assert not any("still mounted by machine" in t for t in m.told())  # B's mount was never refused

    for proxy in m.proxies:
        proxy.heal()
    wait_until(lambda: _up(m.stack, A), 60, "A beating again", m.stack.worker_logs)
    time.sleep(8)  # A back: nothing more from it for the group
    assert len(m.replies(seq)) == 1 and m.volume(A).mounted() is None
    image = m.volume(B).image
    quota.unmount_all(m.stack.settings.replace(data_dir=m.there, workspace_quota="64m"))
    checked = _clean(image)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    print(
        f"PARTITION: the cut-off machine fenced itself {fenced_after:.1f} s after the cut (sandbox gone, volume "
        f"unmounted); the other answered once {elapsed:.1f} s after it; e2fsck -n clean"
    )


def _fenced(m: Machines) -> float:
    """Cut A off; the seconds until it fenced itself (its volume unmounted, its containers gone),
    with no run of B's for the group before."""
    for proxy in m.proxies:
        proxy.cut()
    t0 = time.monotonic()
    wait_until(
        lambda: m.volume(A).mounted() is None and not _containers_of(A), 30, "A to fence itself", m.stack.worker_logs
    )
    assert [r for r in list_runs(m.stack.db, chat_jid=JID, limit=10) if hosts.owner_host(r.owner) == B] == []
    return time.monotonic() - t0


@pytest.mark.parametrize("stack", ["fleet"], indirect=True)
def test_a_machine_cut_off_while_the_group_awaits_an_answer_leaves_the_answer_to_the_other(
    machines: Machines,
) -> None:
    """The run asked and ended; A is cut off before the answer comes: B runs the answered
    question, once."""
    m = machines
    _first_answer_on_a(m)
    seq = m.send("/ask Which colour? | red | blue")
    wait_until(
        lambda: any(r.state == "awaiting_answer" for r in list_runs(m.stack.db, chat_jid=JID, limit=10)),
        60,
        "the question asked",
        m.stack.worker_logs,
    )
    (question,) = chat_questions(m.stack.db, JID, open_only=True)
    fenced_after = _fenced(m)
    answered = m.stack.cli("answer", JID, "2", "--question", question.id)
    assert answered.returncode == 0, answered.stderr
    wait_until(
        lambda: any(hosts.owner_host(r.owner) == B and r.state == "succeeded" for r in _runs(m)),
        90,
        "B to run the answered question",
        m.stack.worker_logs,
    )
    for proxy in m.proxies:
        proxy.heal()
    wait_until(lambda: _up(m.stack, A), 60, "A beating again", m.stack.worker_logs)
    time.sleep(5)
    continued = [r for r in _runs(m) if r.cursor_from >= seq]
    assert [hosts.owner_host(r.owner) for r in continued if r.state == "succeeded"] == [B], continued
    assert m.volume(A).mounted() is None
    print(
        f"PARTITION: cut off while awaiting an answer: fenced {fenced_after:.1f} s after the cut; B ran the answer once"
    )


def _runs(m: Machines) -> list[Run]:
    return list(reversed(list_runs(m.stack.db, chat_jid=JID, limit=20)))


@pytest.mark.parametrize("stack", ["fleet"], indirect=True)
def test_a_machine_cut_off_while_it_delivers_leaves_one_copy_and_the_next_answer_to_the_other(
    machines: Machines,
) -> None:
    """A's deliverer has posted the answer to a webhook whose receiver has not answered yet
    when A is cut off: A cannot record the send.  Its claim runs out; the sweeper sends it
    again with the same delivery id (the webhook's receivers deduplicate by it), from B's
    deliverer; the receiver acts on it once, A records nothing when it is back, and B
    answers the next message, delivered once.  B consumes no deliveries until A is cut
    off, so the send in flight is A's."""
    m = machines
    with WebhookReceiver(HOOK_SECRET) as hook:
        m.stack.env.update({"ORCHESTRATOR_WEBHOOK_SECRET": HOOK_SECRET, "ORCHESTRATOR_DELIVERY_CLAIM_S": "15"})
        attach_channel(m.stack.db, JID, "webhook", address=hook.url)
        _first_answer_on_a(m, b_queues=("agent",))
        wait_until(lambda: _hooked(hook), 60, "the first answer at the webhook", m.stack.worker_logs)

        hook.hold(lambda post: post.doc["message"]["sender"] == "bot")
        word = f"inflight-{uuid.uuid4().hex[:8]}"
        seq = m.send(f"$ echo {word}")
        wait_until(lambda: any(word in p.doc["message"]["content"] for p in _bot_posts(hook)), 60, "A's send")
        (row,) = [d for d in list_deliveries(m.stack.db, chat_jid=JID, channel="webhook") if d.state == "sending"]
        assert row.message_seq > seq
        fenced_after = _fenced(m)
        hook.release()  # the receiver has it; A cannot record that it was sent

        m.worker(B, ("delivery",), node="machine-b-deliveries")
        # What beat's sweep does every few seconds: the claim that ran out goes back, again.
        wait_until(lambda: m.root.sweep().abandoned_deliveries > 0, 60, "A's claim to run out")
        wait_until(lambda: _state(m, row.id) == "sent", 60, "B's deliverer to send it again", m.stack.worker_logs)
        copies = [p for p in hook.posts if p.delivery_id == _sent_as(hook, word)]
        assert len(copies) == 2 and all(p.delivery_id for p in copies)  # one post each, one id
        assert [word in p.doc["message"]["content"] for p in _taken_bot(hook)].count(True) == 1

        after = m.send("$ echo after-the-cut")
        answer = m.answered(after, 90)
        assert "after-the-cut" in answer
        wait_until(lambda: any("after-the-cut" in p.doc["message"]["content"] for p in _taken_bot(hook)), 60, "B's")
        for proxy in m.proxies:
            proxy.heal()
        wait_until(lambda: _up(m.stack, A), 60, "A beating again", m.stack.worker_logs)
        time.sleep(5)  # A back: it records nothing of the send it could not finish, sends nothing more
        assert _state(m, row.id) == "sent"
        bot_texts = [p.doc["message"]["content"] for p in _taken_bot(hook)]
        assert sum(word in t for t in bot_texts) == 1 and sum("after-the-cut" in t for t in bot_texts) == 1
        assert sum(p.delivery_id == _sent_as(hook, word) for p in hook.posts) == 2
        assert {hosts.owner_host(r.owner) for r in _runs(m) if r.cursor_to >= after} == {B}
        print(
            f"PARTITION: cut off mid-delivery: fenced {fenced_after:.1f} s after the cut; the send in flight "
            "taken once by the receiver (sent again by B with its delivery id); B answered the next message once"
        )


HOOK_SECRET = "partition-webhook-secret"


def _bot_posts(hook: WebhookReceiver) -> list[Received]:
    return [p for p in list(hook.posts) if p.doc.get("event") == "message" and p.doc["message"]["sender"] == "bot"]


def _taken_bot(hook: WebhookReceiver) -> list[Received]:
    return [p for p in hook.taken() if p.doc.get("event") == "message" and p.doc["message"]["sender"] == "bot"]


def _hooked(hook: WebhookReceiver) -> bool:
    return bool(_taken_bot(hook))


def _sent_as(hook: WebhookReceiver, word: str) -> str | None:
    """The delivery id the message with ``word`` went out with."""
    return next(p.delivery_id for p in _bot_posts(hook) if word in p.doc["message"]["content"])


def _state(m: Machines, delivery_id: int) -> str:
    return next(d.state for d in list_deliveries(m.stack.db, chat_jid=JID) if d.id == delivery_id)
