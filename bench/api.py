"""The HTTP path: ``GET /health`` and ``POST /api/messages`` through the API
server as ``orchestrator up`` and ``orchestrator api`` start it
(``orchestrator/cli/supervisor.py``'s uvicorn command), against in-process
ingest of the same messages on the same database, in the same command:

    .venv/bin/python -m bench.api [--requests N] [--clients C] [--rounds R] [--pg URL --redis URL]

* ``/health`` p50 and p95: one client, one keep-alive connection, one
  request at a time;
* ``POST /api/messages`` p50 and p95, one client the same way;
* messages/s with ``--clients`` clients at once (each its own keep-alive
  connection, a thread each), every message into one registered group (a
  burst into a busy group: its first message signalled, as in
  ``bench/ingest.py``'s "one busy group");
* the baseline: ``ingest()`` called in this process on the same database
  and group, the same messages one after another (what the API's handler
  does, without HTTP).

Blocks alternate over ``--rounds``; figures are medians over them.  The
client is a few lines over plain sockets (requests prepared up front), so
that its own cost stays small next to the server's; it runs on the same
machine and takes CPU from the server all the same.  PostgreSQL runs in a
fresh database on ``--pg``'s server, with ``--redis`` as the broker.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import ROOT, fresh_pg_database, pct, stop_processes
from orchestrator.cli.supervisor import api_argv
from orchestrator.core.logs import write_dict_config
from orchestrator.core.settings import Settings
from orchestrator.root import Orchestrator
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.store.groups import ensure_main_group

JID = "main@local"


class Client:
    """One keep-alive HTTP/1.1 connection; :meth:`call` returns (status, body)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def call(self, request: bytes) -> tuple[int, bytes]:
        self.sock.sendall(request)
        while b"\r\n\r\n" not in self.buf:
            self._recv()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = next(int(v) for k, _, v in (x.partition(b":") for x in lines[1:]) if k.lower() == b"content-length")
        while len(self.buf) < length:
            self._recv()
        body, self.buf = self.buf[:length], self.buf[length:]
        return status, body

    def _recv(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buf += chunk

    def close(self) -> None:
        self.sock.close()


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def post_message(content: str) -> bytes:
    body = json.dumps({"chat_jid": JID, "sender": "bench", "content": content}).encode()
    return (
        b"POST /api/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"X-Orchestrator-Client: bench\r\n"  # an API without a token refuses a change without it
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )


def latencies(port: int, requests: list[bytes], expect: int) -> list[float]:
    client = Client(port)
    out = []
    try:
        for request in requests:
            t0 = time.perf_counter()
            status, body = client.call(request)
            out.append(time.perf_counter() - t0)
            if status != expect:
                raise SystemExit(f"{request[:40]!r}: {status} {body[:300]!r}")
    finally:
        client.close()
    return out


def concurrent_rate(port: int, clients: int, per_client: int, tag: str) -> float:
    """Messages/s stored by ``clients`` connections posting ``per_client`` messages each."""
    batches = [[post_message(f"{tag} c{c} m{i}") for i in range(per_client)] for c in range(clients)]
    conns = [Client(port) for _ in range(clients)]
    start = threading.Barrier(clients + 1)
    failures: list[str] = []

    def one(conn: Client, batch: list[bytes]) -> None:
        start.wait()
        for request in batch:
            status, body = conn.call(request)
            if status != 201:
                failures.append(f"{status} {body[:300]!r}")
                return

    threads = [threading.Thread(target=one, args=(conn, batch)) for conn, batch in zip(conns, batches, strict=True)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    for conn in conns:
        conn.close()
    if failures:
        raise SystemExit(f"a POST failed: {failures[0]}")
    return clients * per_client / elapsed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """An API server to measure: this tree's, or a baseline checkout's (``--baseline-root``)."""

    name: str
    settings: Settings
    root: Path = ROOT
    extra_argv: tuple[str, ...] = ()
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    health: list[float] = field(default_factory=list)
    posts: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)

    def start(self) -> None:
        settings = self.settings
        env = {
            **os.environ,
            "ORCHESTRATOR_DATA_DIR": str(settings.data_dir),
            "PYTHONPATH": str(self.root),
        }
        if settings.database_url:
            env["ORCHESTRATOR_DATABASE_URL"] = settings.database_url
        if settings.broker_url:
            env["ORCHESTRATOR_BROKER_URL"] = settings.broker_url
        self.port = free_port()
        log = open(settings.data_dir / "api.log", "wb")  # closed with the process
        # As `orchestrator up` and `orchestrator api` run it: their log configuration, whose
        # access log writes a line per request (here to api.log).
        argv = [*api_argv("127.0.0.1", self.port, write_dict_config(settings)), *self.extra_argv]
        self.proc = subprocess.Popen(argv, env=env, cwd=self.root, stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while True:
            try:
                client = Client(self.port)
                status, _ = client.call(get("/health"))
                client.close()
                if status == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(
                    f"{self.name}: the API did not start:\n{(settings.data_dir / 'api.log').read_text()[-3000:]}"
                )
            time.sleep(0.1)
        # The main group (a message to it always wakes the agent: the first signals, the
        # rest find it busy), made through the API so that a baseline checkout makes it its way.
        body = json.dumps({"chat_jid": JID, "name": "main", "folder": "main", "is_main": True}).encode()
        request = b"POST /api/groups HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        request += b"X-Orchestrator-Client: bench\r\n"
        request += b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        client = Client(self.port)
        status, answer = client.call(request)
        client.close()
        if status not in (201, 409):  # 409: made already (ensure_main_group)
            raise SystemExit(f"{self.name}: POST /api/groups: {status} {answer[:300]!r}")
        latencies(self.port, [get("/health")] * 50, 200)  # the first connections
        latencies(self.port, [post_message("warm-up")], 201)

    def round(self, r: int, args: argparse.Namespace, per_client: int) -> None:
        self.health += latencies(self.port, [get("/health")] * args.requests, 200)
        self.posts += latencies(self.port, [post_message(f"r{r} one {i}") for i in range(args.requests)], 201)
        self.rates.append(concurrent_rate(self.port, args.clients, per_client, f"r{r}"))

    def stop(self) -> None:
        if self.proc is not None:
            stop_processes([self.proc])


def run_stack(name: str, settings: Settings, args: argparse.Namespace, baseline: Settings | None) -> None:
    root = Orchestrator(settings)
    db = root.db
    ensure_main_group(db)
    signal = root.signals.group
    servers = [Server("this tree", settings)]
    if baseline is not None:
        # The baseline's own dependencies: uvicorn without httptools and uvloop runs h11 on asyncio's loop.
        servers.insert(
            0,
            Server(
                f"baseline {args.baseline_root}",
                baseline,
                Path(args.baseline_root),
                ("--http", "h11", "--loop", "asyncio"),
            ),
        )
    inproc: list[float] = []
    per_client = max(1, args.requests // args.clients)
    try:
        for server in servers:
            server.start()
        for r in range(args.rounds):
            for server in servers:
                server.round(r, args, per_client)
            messages = [
                IncomingMessage(chat_jid=JID, sender="bench", content=f"r{r} in process {i}")
                for i in range(args.clients * per_client)
            ]
            t0 = time.perf_counter()
            for message in messages:
                ingest(db, settings, message, signal=signal)
            inproc.append(len(messages) / (time.perf_counter() - t0))
    finally:
        for server in servers:
            server.stop()
        root.celery.control.purge()  # nobody drains the signals the messages queued
        db.dispose()
    floor = statistics.median(inproc)
    print(f"{name}: in-process ingest {floor:.0f} msg/s (one busy group, this tree's ingest)")
    for server in servers:
        rate = statistics.median(server.rates)
        print(
            f"  {server.name}: /health p50 {pct(server.health, 50) * 1000:.2f} ms (p95 {pct(server.health, 95) * 1000:.2f})"
            f" | POST /api/messages p50 {pct(server.posts, 50) * 1000:.2f} ms (p95 {pct(server.posts, 95) * 1000:.2f})"
            f" | {args.clients} clients {rate:.0f} msg/s, ratio to in-process ingest {rate / floor:.2f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=500, help="per block (latency blocks, and the concurrent one)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pg", default="", help="a PostgreSQL server URL whose role may create databases")
    ap.add_argument("--redis", default="", help="the broker of the PostgreSQL run (default: filesystem://)")
    ap.add_argument(
        "--baseline-root",
        default="",
        help="also serve the API from this checkout (e.g. `git archive HEAD`), measured alongside, in a database of its own",
    )
    args = ap.parse_args()
    print(f"n = {args.requests} per block, {args.rounds} rounds; {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        base = Path(tmp)

        def installation(name: str, **extra: str) -> Settings:
            settings = Settings.load(data_dir=base / name, env_file=None, **extra)
            settings.ensure_dirs()
            return settings

        with_baseline = bool(args.baseline_root)
        run_stack(
            "sqlite + filesystem://",
            installation("sqlite"),
            args,
            installation("sqlite-baseline") if with_baseline else None,
        )
        if args.pg:
            urls = [stack.enter_context(fresh_pg_database(args.pg)) for _ in range(1 + with_baseline)]
            run_stack(
                f"postgresql + {args.redis.split(':')[0] if args.redis else 'filesystem://'}",
                installation("pg", database_url=urls[0], broker_url=args.redis),
                args,
                installation("pg-baseline", database_url=urls[1], broker_url=args.redis) if with_baseline else None,
            )


if __name__ == "__main__":
    main()
