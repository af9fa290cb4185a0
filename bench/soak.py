"""A soak: the whole installation under steady mixed traffic for ``--minutes``,
checked for lost, duplicated or failed work and for memory that grows.

    .venv/bin/python -m bench.soak [--minutes 30] [--clients 32] [--groups 10] [--interval 30]
                                   [--pg URL --redis URL] [--stacks sqlite,pg] [--json PATH]

Each stack (the embedded SQLite + filesystem://; with ``--pg`` and
``--redis`` also PostgreSQL + Redis, a fresh database, the Redis database
flushed) is a fresh installation with the API served as ``orchestrator up``
serves it (``api_argv``: uvicorn, its log configuration) and two real
``celery worker`` processes as ``orchestrator up`` starts them
(``worker_argv``: one ``-Q agent``, one ``-Q delivery``), the offline model,
cold containers.  ``--groups`` groups need a trigger; every other one has
the built-in ``webhook`` channel attached, pointed at a receiver on
127.0.0.1 in this process that checks the signature and counts each
``X-Orchestrator-Delivery`` id.  ``--clients`` HTTP clients, a thread and a
keep-alive connection each, for the whole run:

* one per group (the first ``--groups``) holds a conversation: a triggering
  message (``@Andy``; every third one has a ``$ echo`` line, a tool call in
  the container), then it polls the history until the reply is there, then
  the next;
* the others post untriggering messages to random groups (each with a new
  id; one in 20 is posted twice, a client's retry, which must be stored
  once), read a group's history, or hold its event stream open for a
  moment.

Every ``--interval`` seconds it prints the requests so far by status class,
the runs, the deliveries, and the RSS of the API process and of each worker
(main process + pool children).  At the end, once the runs and deliveries
have settled, it checks in the database: every acknowledged message stored
exactly once (counted by id), every triggering message answered by exactly
one reply (the assistant messages between it and the next trigger of its
group), every delivery row sent and received exactly once, no 5xx and no
failed request, and no lease taken over (nothing dies in a soak: a takeover
would be a live holder judged gone).  Memory: each process's RSS at 25 % of the run against the
end (the first quarter is warm-up: imports, caches, pools filling), as a
growth figure; reported, and checked only against ``--max-growth`` when
given (RSS is noisy: the CI test uses a generous bound).  Any failed check
makes the command exit non-zero.  Speeds are printed, never checked.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path

import httpx
import psutil
from sqlalchemy import func, select

from bench.api import free_port
from bench.common import (
    ROOT,
    Extra,
    HookReceiver,
    flush_broker,
    install,
    remove_install_containers,
    stacks,
    stop_processes,
    worker_env,
)
from orchestrator.channels.registry import build_registry
from orchestrator.channels.webhook import CHANNEL, DELIVERY_HEADER
from orchestrator.cli.supervisor import api_argv, worker_argv
from orchestrator.core.logs import write_dict_config
from orchestrator.core.settings import Settings
from orchestrator.http.endpoint import CLIENT_HEADER
from orchestrator.model.messages import SENDER_BOT
from orchestrator.model.render import displayed
from orchestrator.sandbox.containers import docker_client
from orchestrator.sandbox.image import ensure_agent_image
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import to_stored
from orchestrator.store.tables import DeliveryRow, MessageRow, RunRow

SECRET = "bench-soak-secret"  # outbound webhooks are signed with it; the receiver checks
REPLY_TIMEOUT_S = 180.0  # a conversation's reply; past it the message counts as unanswered
SETTLE_S = 180.0  # after the traffic stops: runs and deliveries must be done within it
TIMEOUT = httpx.Timeout(30.0)
# What this API's clients send with a change while no token is set (orchestrator/http/guards.py).
CLIENT = {CLIENT_HEADER: "bench"}


def jid(g: int) -> str:
    return f"soak{g}@bench"


class Receiver(HookReceiver):
    """A webhook endpoint on loopback: how many times each delivery id arrived (signed POSTs only)."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.bad = 0
        super().__init__(SECRET)

    def signed(self, headers: Message, body: bytes, arrived: tuple[float, float]) -> None:
        self.seen[headers.get(DELIVERY_HEADER) or "(none)"] += 1

    def unsigned(self) -> None:
        self.bad += 1

    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(self.seen)


@dataclass
class Tally:
    """What the clients saw, shared by their threads."""

    statuses: Counter[str] = field(default_factory=Counter)  # "2xx", "4xx", "5xx", "error"
    acked: set[str] = field(default_factory=set)  # message ids answered 201
    triggers: dict[str, list[str]] = field(default_factory=dict)  # chat -> its triggering ids, in order
    unanswered: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, status: int | None, what: str) -> None:
        with self.lock:
            if status is None:
                self.statuses["error"] += 1
                self.errors.append(what)
            else:
                self.statuses[f"{status // 100}xx"] += 1
                if status >= 500:
                    self.errors.append(what)


class Traffic:
    """The ``clients`` threads, until :meth:`stop`."""

    def __init__(self, base: str, groups: int, clients: int, tally: Tally) -> None:
        self.base, self.groups, self.tally = base, groups, tally
        self.done = threading.Event()
        self.threads = [threading.Thread(target=self._conversation, args=(g,), daemon=True) for g in range(groups)]
        self.threads += [
            threading.Thread(target=self._chatter, args=(c,), daemon=True) for c in range(max(0, clients - groups))
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.done.set()
        for t in self.threads:
            t.join(REPLY_TIMEOUT_S + 60)

    def _request(self, client: httpx.Client, method: str, path: str, **kw: object) -> httpx.Response | None:
        try:
            r = client.request(method, path, **kw)  # type: ignore[arg-type]
        except httpx.HTTPError as exc:
            self.tally.note(None, f"{method} {path}: {exc!r}")
            return None
        self.tally.note(r.status_code, f"{method} {path}: {r.status_code} {r.text[:200]}")
        return r

    def _post(self, client: httpx.Client, chat: str, sender: str, content: str, mid: str) -> httpx.Response | None:
        body = {"chat_jid": chat, "sender": sender, "sender_name": sender, "content": content, "id": mid}
        r = self._request(client, "POST", "/api/messages", json=body)
        if r is not None and r.status_code == 201:
            with self.tally.lock:
                self.tally.acked.add(mid)
        return r

    def _conversation(self, g: int) -> None:
        chat = jid(g)
        with httpx.Client(base_url=self.base, timeout=TIMEOUT, headers=CLIENT) as client:
            i = 0
            while not self.done.is_set():
                mid = f"soak-t-{g}-{i}-{uuid.uuid4().hex[:8]}"
                content = f"@Andy soak {g}/{i}" + (f"\n$ echo soak-{g}-{i}" if i % 3 == 2 else "")
                r = self._post(client, chat, f"talker{g}", content, mid)
                if r is None or r.status_code != 201:
                    time.sleep(1)
                    continue
                with self.tally.lock:
                    self.tally.triggers.setdefault(chat, []).append(mid)
                seq = r.json()["message"]["seq"]
                deadline = time.monotonic() + REPLY_TIMEOUT_S
                while True:
                    got = self._request(client, "GET", f"/api/chats/{chat}/messages", params={"after": seq})
                    if (
                        got is not None
                        and got.status_code == 200
                        and any(m["sender"] == SENDER_BOT and m["message_type"] == "assistant" for m in got.json())
                    ):
                        break
                    if time.monotonic() > deadline:
                        with self.tally.lock:
                            self.tally.unanswered.append(mid)
                        break
                    time.sleep(0.5)
                i += 1

    def _chatter(self, c: int) -> None:
        rng = random.Random(c)
        with httpx.Client(base_url=self.base, timeout=TIMEOUT, headers=CLIENT) as client:
            while not self.done.is_set():
                chat = jid(rng.randrange(self.groups))
                roll = rng.random()
                if roll < 0.6:
                    mid = f"soak-c-{c}-{uuid.uuid4().hex}"
                    self._post(client, chat, f"chatter{c}", f"chatter {c} says {mid[-6:]}", mid)
                    if rng.random() < 0.05:  # a client's retry of the same message: stored once
                        self._post(client, chat, f"chatter{c}", f"chatter {c} says {mid[-6:]}", mid)
                elif roll < 0.9:
                    self._request(client, "GET", f"/api/chats/{chat}/messages", params={"limit": 50})
                else:
                    self._stream(client, chat, rng.uniform(1, 3))
                time.sleep(rng.uniform(0.2, 0.6))

    def _stream(self, client: httpx.Client, chat: str, hold_s: float) -> None:
        """The chat's event stream, read for ``hold_s`` seconds, then closed (as a browser tab leaves)."""
        path = f"/api/chats/{chat}/stream"
        try:
            with client.stream("GET", path, params={"after": 0}) as r:
                self.tally.note(r.status_code, f"GET {path}: {r.status_code}")
                end = time.monotonic() + hold_s
                for _ in r.iter_raw():
                    if time.monotonic() > end:
                        break
        except httpx.HTTPError as exc:
            self.tally.note(None, f"GET {path}: {exc!r}")


def tree_rss(pid: int) -> tuple[int, int]:
    """RSS (bytes) of the process ``pid`` and of its children together: (main, children)."""
    with contextlib.suppress(psutil.Error):
        p = psutil.Process(pid)
        children = 0
        for child in p.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                children += child.memory_info().rss
        return p.memory_info().rss, children
    return 0, 0


@dataclass
class Sample:
    t: float
    rss: dict[str, tuple[int, int]]  # process name -> (main, children)
    statuses: dict[str, int]
    runs: dict[str, int]
    deliveries_sent: int
    received: int


def growth(samples: list[Sample], name: str) -> tuple[float, float, float]:
    """(RSS at 25 % of the run, at the end, end / 25 % - 1), main + children, in MiB."""
    start = samples[0].t
    span = samples[-1].t - start
    quarter = min(samples, key=lambda s: abs(s.t - start - span / 4))
    a, b = sum(quarter.rss[name]) / 2**20, sum(samples[-1].rss[name]) / 2**20
    return a, b, (b / a - 1) if a else 0.0


def _run_states(db: Database) -> dict[str, int]:
    with db.read() as s:
        return {state: n for state, n in s.execute(select(RunRow.state, func.count()).group_by(RunRow.state))}


def _sent_deliveries(db: Database) -> int:
    with db.read() as s:
        return s.scalar(select(func.count()).select_from(DeliveryRow).where(DeliveryRow.state == "sent")) or 0


@contextlib.contextmanager
def installation_processes(settings: Settings) -> Iterator[tuple[str, dict[str, subprocess.Popen[bytes]]]]:
    """The API (its base URL) and the two workers, as ``orchestrator up`` starts them."""
    env = worker_env(settings) | {"ORCHESTRATOR_WEBHOOK_SECRET": SECRET}
    # Loopback never through a proxy the environment may name.
    env["NO_PROXY"] = env["no_proxy"] = ",".join(filter(None, [env.get("NO_PROXY", ""), "127.0.0.1"]))
    logs = settings.data_dir / "logs"
    logs.mkdir(exist_ok=True)
    port = free_port()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, argv in [
            ("api", api_argv("127.0.0.1", port, write_dict_config(settings))),
            ("agent worker", worker_argv(1, "WARNING", queues=("agent",), name="soak-agent@%h")),
            ("delivery worker", worker_argv(1, "WARNING", queues=("delivery",), name="soak-delivery@%h")),
        ]:
            with open(logs / f"{name.replace(' ', '-')}.log", "ab") as fh:
                procs[name] = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=fh, stderr=fh)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            if procs["api"].poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the API did not start:\n{(logs / 'api.log').read_text()[-3000:]}")
            time.sleep(0.2)
        yield base, procs
    finally:
        stop_processes(list(procs.values()))


def check(db: Database, install_id: str, tally: Tally, receiver: Receiver, webhook_chats: list[str]) -> list[str]:
    """Every invariant that does not hold, in words (empty: all hold)."""
    failures: list[str] = []
    if tally.statuses["5xx"] or tally.statuses["error"]:
        failures.append(
            f"{tally.statuses['5xx']} 5xx and {tally.statuses['error']} failed requests, e.g. {tally.errors[:3]}"
        )
    if tally.unanswered:
        failures.append(
            f"{len(tally.unanswered)} triggering message(s) unanswered within"
            f" {REPLY_TIMEOUT_S:.0f} s: {tally.unanswered[:5]}"
        )
    with db.read() as s:
        stored = Counter(
            {
                mid: n
                for mid, n in s.execute(
                    select(MessageRow.id, func.count()).where(MessageRow.id.like("soak-%")).group_by(MessageRow.id)
                )
            }
        )
        lost = [m for m in tally.acked if stored[m] == 0]
        doubled = [m for m, n in stored.items() if n > 1]
        if lost or doubled:
            failures.append(
                f"acknowledged {len(tally.acked)}: {len(lost)} lost {lost[:3]},"
                f" {len(doubled)} stored more than once {doubled[:3]}"
            )
        # Replies: the assistant messages of a chat between a trigger and the next one.
        bad_replies: list[str] = []
        for chat, mids in tally.triggers.items():
            rows = s.execute(
                select(MessageRow.id, MessageRow.seq, MessageRow.sender, MessageRow.message_type)
                .where(MessageRow.chat_jid == chat)
                .order_by(MessageRow.seq)
            ).all()
            replies: Counter[str] = Counter()
            current: str | None = None
            wanted = set(mids)
            for mid, _seq, sender, kind in rows:
                if mid in wanted:
                    current = mid
                    replies[mid] += 0
                elif sender == SENDER_BOT and kind == "assistant":
                    replies[current or "(before any trigger)"] += 1
            bad_replies += [f"{m}: {n}" for m, n in replies.items() if n != 1]
        if bad_replies:
            failures.append(f"{len(bad_replies)} trigger(s) not answered exactly once: {bad_replies[:5]}")
        deliveries = s.execute(
            select(DeliveryRow.id, DeliveryRow.state, DeliveryRow.chat_jid).where(DeliveryRow.channel == CHANNEL)
        ).all()
        # Every message of a webhook group that channels show has its delivery.
        delivered_seqs = {d.message_seq for d in s.scalars(select(DeliveryRow).where(DeliveryRow.channel == CHANNEL))}
        undelivered_rows = sum(
            1
            for row in s.scalars(select(MessageRow).where(MessageRow.chat_jid.in_(webhook_chats)))
            if displayed(to_stored(row)) and row.seq not in delivered_seqs
        )
    if undelivered_rows:
        failures.append(f"{undelivered_rows} message(s) of webhook groups without a delivery row")
    seen = receiver.counts()
    expected = {f"{install_id}-{d.id}" for d in deliveries}  # as the deliverer names them
    not_sent = [d.id for d in deliveries if d.state != "sent"]
    missing = sorted(expected - set(seen))
    twice = sorted(k for k, n in seen.items() if n > 1)
    unknown = sorted(set(seen) - expected)
    if not_sent or missing or twice or unknown or receiver.bad:
        failures.append(
            f"deliveries: {len(expected)} expected, {len(not_sent)} not sent, {len(missing)} not"
            f" received {missing[:3]}, {len(twice)} received twice {twice[:3]}, {len(unknown)}"
            f" unknown ids {unknown[:3]}, {receiver.bad} unsigned"
        )
    return failures


def soak(base_dir: Path, image: str, name: str, extra: Extra, args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(dir=base_dir) as tmp, extra() as more, Receiver() as receiver:
        # As `up` runs it: warm sessions and standby sandboxes at their defaults, unless --cold.
        warm = 0.0 if args.cold else Settings.load(environ={}, env_file=None).sandbox.warm_idle_s
        settings, db = install(Path(tmp), image, warm, webhook_secret=SECRET, **more)
        flush_broker(settings)
        webhook_chats = [jid(g) for g in range(args.groups) if g % 2 == 0]
        for g in range(args.groups):
            add_group(db, chat_jid=jid(g), name=f"soak{g}", folder=f"soak{g}", requires_trigger=True)
        registry = build_registry(settings)
        for chat in webhook_chats:
            attach_channel(db, chat, CHANNEL, address=receiver.url, registry=registry)
        tally = Tally()
        samples: list[Sample] = []
        failures: list[str] = []
        final_runs: dict[str, int] = {}
        receiver_seen: Counter[str] = Counter()
        try:
            with installation_processes(settings) as (url, procs):
                traffic = Traffic(url, args.groups, args.clients, tally)
                t0 = time.monotonic()
                traffic.start()
                print(
                    f"{name}: {args.clients} clients, {args.groups} groups ({len(webhook_chats)} with a webhook),"
                    f" {args.minutes:g} min",
                    flush=True,
                )

                def sample() -> Sample:
                    with tally.lock:
                        statuses = dict(tally.statuses)
                    s = Sample(
                        time.monotonic() - t0,
                        {n: tree_rss(p.pid) for n, p in procs.items()},
                        statuses,
                        _run_states(db),
                        _sent_deliveries(db),
                        sum(receiver.counts().values()),
                    )
                    rss = "  ".join(f"{n} {m / 2**20:.0f}+{c / 2**20:.0f} MiB" for n, (m, c) in s.rss.items())
                    print(
                        f"  t={s.t:6.0f} s  requests {statuses}  runs {s.runs}  deliveries sent"
                        f" {s.deliveries_sent}, received {s.received}  RSS (main+children) {rss}",
                        flush=True,
                    )
                    samples.append(s)
                    return s

                end = t0 + args.minutes * 60
                sample()
                while time.monotonic() < end:
                    time.sleep(min(args.interval, max(0.0, end - time.monotonic())))
                    sample()
                    dead = [n for n, p in procs.items() if p.poll() is not None]
                    if dead:
                        failures.append(f"exited during the run: {', '.join(dead)}")
                        break
                traffic.stop()
                # Settle: the last runs and deliveries, then the checks.
                settle_end = time.monotonic() + SETTLE_S
                while time.monotonic() < settle_end:
                    states = _run_states(db)
                    busy = sum(n for st, n in states.items() if st not in ("succeeded", "failed", "cancelled"))
                    with db.read() as s:
                        unsent = (
                            s.scalar(
                                select(func.count())
                                .select_from(DeliveryRow)
                                .where(DeliveryRow.state.in_(["pending", "sending"]))
                            )
                            or 0
                        )
                    if not busy and not unsent:
                        break
                    time.sleep(1)
                failures += check(db, settings.install_id, tally, receiver, webhook_chats)
                # Nothing died: a lease taken over (a holder judged gone) was a false takeover.
                took = sum(
                    p.read_text(errors="replace").count("took over the lease")
                    for p in (settings.data_dir / "logs").glob("*.log")
                )
                if took:
                    failures.append(f"{took} lease(s) taken over from a live holder")
                final_runs, receiver_seen = states, receiver.counts()
                if states.get("failed"):
                    failures.append(f"{states['failed']} run(s) failed")
        finally:
            remove_install_containers(settings)
            if failures:
                logs = settings.data_dir / "logs"
                for p in sorted(logs.glob("*.log")):
                    print(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            db.dispose()
    memory = {n: growth(samples, n) for n in samples[-1].rss} if len(samples) > 1 else {}
    print(
        f"  {name}: {sum(tally.statuses.values())} requests {dict(tally.statuses)};"
        f" {len(tally.acked)} messages acknowledged; {sum(map(len, tally.triggers.values()))} triggers;"
        f" runs {final_runs}; {sum(receiver_seen.values())} deliveries received"
    )
    for n, (at_quarter, at_end, grew) in memory.items():
        print(f"    RSS {n:16} at 25 % {at_quarter:7.1f} MiB, at the end {at_end:7.1f} MiB: {grew:+.1%}")
        if args.max_growth is not None and grew > args.max_growth:
            failures.append(f"RSS of the {n} grew {grew:+.1%} (over --max-growth {args.max_growth:.0%})")
    for f in failures:
        print(f"  FAILED: {f}", flush=True)
    return {
        "stack": name,
        "minutes": args.minutes,
        "statuses": dict(tally.statuses),
        "acknowledged": len(tally.acked),
        "triggers": sum(map(len, tally.triggers.values())),
        "runs": final_runs,
        "deliveries_received": sum(receiver_seen.values()),
        "failures": failures,
        "memory": {n: {"rss_25_mib": a, "rss_end_mib": b, "growth": g} for n, (a, b, g) in memory.items()},
        "samples": [{"t": s.t, "rss": s.rss, "runs": s.runs, "received": s.received} for s in samples],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="of traffic, per stack")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--groups", type=int, default=10)
    ap.add_argument("--interval", type=float, default=30.0, help="seconds between two reports")
    ap.add_argument("--pg", default="", help="PostgreSQL server URL (a role that may create databases)")
    ap.add_argument("--redis", default="", help="Redis URL of a database the soak may flush (with --pg)")
    ap.add_argument(
        "--max-growth",
        type=float,
        default=None,
        help="fail if a process's RSS grew more than this fraction from 25 %% of the run to the end",
    )
    ap.add_argument("--json", default="", help="also write the figures here (JSON)")
    ap.add_argument("--stacks", default="sqlite,pg", help="which stacks, of sqlite and pg (pg needs --pg and --redis)")
    ap.add_argument(
        "--cold",
        action="store_true",
        help="a new container per run (default: warm sessions and standby sandboxes, as `orchestrator up` runs)",
    )
    args = ap.parse_args()
    wanted = {part.strip() for part in args.stacks.split(",") if part.strip()}
    if not wanted or not wanted <= {"sqlite", "pg"}:
        ap.error("--stacks names sqlite, pg or both (comma-separated)")
    if args.groups < 1 or args.clients < args.groups or args.minutes <= 0:
        ap.error("--groups must be at least 1, --clients at least --groups, --minutes above 0")
    settings = Settings.load(env_file=None)
    ensure_agent_image(docker_client(settings), settings)
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"
    print(f"machine: {os.cpu_count()} CPUs, load average at the start {load}", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in stacks(args.pg, args.redis):
            if ("pg" if name.startswith("postgresql") else "sqlite") not in wanted:
                continue
            results.append(soak(Path(tmp), settings.sandbox.agent_image, name, extra, args))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    failed = [f"{r['stack']}: {f}" for r in results for f in r["failures"]]  # type: ignore[attr-defined]
    if failed:
        raise SystemExit("soak failed:\n" + "\n".join(failed))


if __name__ == "__main__":
    main()
