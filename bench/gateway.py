"""The model gateway: what one costs a worker for every run (cold start,
memory) and every model request (latency), for the gateway in the tree and
for any candidate with its API, measured in the same command.

    .venv/bin/python -m bench.gateway [--rounds 3] [--cycles 20] [--requests 200] [--long 200]
                                      [--gateway MODULE[:CLASS]]...

``--gateway`` (repeatable; default ``orchestrator.sandbox.gateway``) names a
class with the API the pipeline uses (``for_provider(socket_path, settings,
provider, spent=...)``, a context manager, ``input_tokens``/``output_tokens``).
Each gateway is measured in a fresh host process per round (the gateways
interleaved round by round, so a busy machine slows them alike) that
imports ``workers.app`` first, as a worker's pool child has before its
first run; the fake upstream (``fakes/anthropic_api.py``, the real
wire format, on loopback) and the clients run in this process.

* **cold start**, per run, as the pipeline does it (``with
  ModelGateway.for_provider(...)``): from the constructor until the socket
  answers a request (``GET /v1/models``, refused by the gateway itself),
  and, after a random pause of 0-100 ms (a run lasts a while: a server that
  polls for its stop is caught at a random point of its poll), from the
  context manager's exit until it has closed; the host process's CPU (user
  + system) for the whole cycle.  The first cycle of a process is shown
  apart (it pays what the gateway imports or sets up on first use).  For
  scale, what a new ``httpx.Client()`` costs on the same machine.
* **memory** of the host process, from ``/proc/self/smaps_rollup``: RSS,
  USS (its private pages) and anonymous pages (heap, stacks; USS counts a
  library page as shared while another process maps it, so it moves as
  other processes come and go, the anonymous pages do not), added to what
  ``workers.app`` holds: by importing the gateway's module, after the cold
  cycles (what a worker keeps between runs), by one open idle gateway, at the peak while 16 clients
  stream through it at once (the connection cap; one goes upstream at a
  time, 15 wait in the gateway, each stream is 40 events over ~0.2 s), and
  its host threads at that peak; then, in a process of its own, what it
  keeps after 10 and after ``--long`` runs in a row (a worker's pool child
  runs one after another: whatever a run leaves behind adds up).
* **latency** per request, over a keep-alive connection the way the runner's
  SDK connects, against the same request sent straight to the upstream
  (interleaved request by request): a non-streamed answer, and a streamed
  one of 40 events read to its end.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: the host process must not have them before the gateway does
    import httpx

KEY = "sk-bench-gateway"
REQUEST = {"model": "claude-fake", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
STREAM_WORDS = 36  # + message_start, content_block_start/stop, ping, message_delta/stop: ~40 events
LOAD_CLIENTS = 16
KEYS = ("rss", "uss", "anon")
PROBE = b"GET /v1/models HTTP/1.1\r\nHost: gateway\r\nContent-Length: 0\r\n\r\n"


# -- the host process: one gateway class, driven over stdin/stdout ---------------------------------


def _memory() -> dict[str, int]:
    """RSS and USS of this process, in KiB."""
    fields: dict[str, int] = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                fields[parts[0].rstrip(":")] = int(parts[1])
    return {"rss": fields["Rss"], "uss": fields["Private_Clean"] + fields["Private_Dirty"], "anon": fields["Anonymous"]}


def _cpu() -> float:
    return time.process_time()  # user + system of every thread, to the nanosecond (os.times: 10 ms ticks)


def _probe(path: Path, deadline_s: float = 10.0) -> None:
    """Send PROBE to the socket until an answer comes back."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            with socket.socket(socket.AF_UNIX) as conn:
                conn.settimeout(deadline_s)
                conn.connect(str(path))
                conn.sendall(PROBE)
                if conn.recv(64).startswith(b"HTTP/1."):
                    return
        except OSError:
            pass
        if time.monotonic() > end:
            raise SystemExit(f"the gateway at {path} never answered")
        time.sleep(0.001)


class _Peak(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.peak = {k: 0 for k in KEYS}
        self.threads = 0

    def run(self) -> None:
        while not self.stop.wait(0.01):
            m = _memory()
            self.peak = {k: max(self.peak[k], m[k]) for k in m}
            self.threads = max(self.threads, threading.active_count())


def host(spec: str, upstream: str, folder: Path) -> None:
    """The gateway's side: commands on stdin, one JSON answer a line on stdout."""
    import workers.app
    from orchestrator.core.settings import Settings

    # What a worker's pool child holds before its first run: its root, built on first use.
    os.environ["ORCHESTRATOR_DATA_DIR"] = str(folder / "data")
    workers.app.worker_root()

    settings = Settings.load(
        env_file=None, data_dir=folder / "data", anthropic_base_url=upstream, anthropic_api_key=KEY
    )
    path = folder / "run" / "model.sock"
    out: dict[str, Any] = {"base": _memory()}
    module, _, name = spec.partition(":")
    cls = getattr(importlib.import_module(module), name or "ModelGateway")
    out["imported"] = _memory()
    gateway: Any = None
    peak: _Peak | None = None

    def reply(value: object) -> None:
        sys.stdout.write(json.dumps(value) + "\n")
        sys.stdout.flush()

    reply(out)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "cold":
            cycles = []
            rng = random.Random(0)
            for _ in range(int(args[0])):
                c0, t0 = _cpu(), time.perf_counter()
                with cls.for_provider(path, settings, "anthropic", spent=None):
                    _probe(path)
                    t1 = time.perf_counter()
                    # A run lasts a while: a gateway that polls for its stop
                    # waits for its next poll, not for a whole interval.
                    time.sleep(rng.uniform(0, 0.1))
                    t2 = time.perf_counter()
                t3 = time.perf_counter()
                cycles.append([t1 - t0, t3 - t2, _cpu() - c0])
            reply({"cycles": cycles, "after": _memory()})
        elif cmd == "client":
            # For scale: a new upstream client (most of it: loading the CA bundle into a TLS context).
            import httpx

            clients = []
            for _ in range(int(args[0])):
                t0 = time.perf_counter()
                httpx.Client(timeout=600).close()
                clients.append(time.perf_counter() - t0)
            reply({"client": statistics.median(clients)})
        elif cmd == "open":
            gateway = cls.for_provider(path, settings, "anthropic", spent=None)
            gateway.__enter__()
            _probe(path)
            reply({"path": str(path), "open": _memory(), "threads": threading.active_count()})
        elif cmd == "peak":
            peak = _Peak()
            peak.start()
            reply({})
        elif cmd == "unpeak":
            assert peak is not None
            peak.stop.set()
            peak.join()
            reply({"peak": peak.peak, "threads": peak.threads})
        elif cmd == "close":
            gateway.__exit__(None, None, None)
            reply({"closed": _memory(), "tokens": [gateway.input_tokens, gateway.output_tokens]})
        elif cmd == "quit":
            return


# -- this process: the upstream, the clients, the figures ---------------------------------------


def make_upstream() -> Any:
    """A fake Messages API that answers every request: a plain message, or a stream of ~40 events
    (slow when the model is "slow")."""
    from fakes.anthropic_api import FakeAnthropic, Recorded, message, message_stream

    class Upstream(FakeAnthropic):
        def _next_reply(self, rec: Recorded) -> Any:
            with self._lock:
                self.calls.clear()  # nobody reads them here
                self.sent.clear()
            body = rec.body if isinstance(rec.body, dict) else {}
            if not body.get("stream"):
                return message([{"type": "text", "text": "hello"}], "end_turn", n=3)
            status, chunks, headers = message_stream(" ".join(["word"] * STREAM_WORDS), n=STREAM_WORDS)
            if body.get("model") == "slow":

                def slow(it: Iterator[bytes] = chunks) -> Iterator[bytes]:
                    for chunk in it:
                        time.sleep(0.005)
                        yield chunk

                chunks = slow()
            return status, chunks, headers

    return Upstream()


class Host:
    """A host process for one gateway class."""

    def __init__(self, spec: str, upstream: str, folder: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
        env.update(ORCHESTRATOR_DATA_DIR=str(folder / "data"), ORCHESTRATOR_LOG_LEVEL="WARNING")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.gateway", "--host", spec, "--upstream", upstream, "--folder", str(folder)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=Path(__file__).resolve().parents[1],
        )
        self.start = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the host process ended ({self.proc.wait()})")
        return json.loads(line)

    def ask(self, cmd: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self._read()

    def quit(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        self.proc.wait(30)


def timed_request(client: httpx.Client, path: str, request: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    if request.get("stream"):
        with client.stream("POST", path, json=request) as resp:
            assert resp.status_code == 200, resp.read()
            for _ in resp.iter_raw():
                pass
    else:
        resp = client.post(path, json=request)
        assert resp.status_code == 200, resp.text
    return time.perf_counter() - t0


def latency(sock: str, upstream: str, n: int) -> dict[str, list[float]]:
    """Seconds per request, through the gateway and straight to the upstream, interleaved."""
    import httpx

    times: dict[str, list[float]] = {k: [] for k in ("gw", "direct", "gw stream", "direct stream")}
    with (
        httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://gateway", timeout=30) as gw,
        httpx.Client(base_url=upstream, timeout=30) as direct,
    ):
        for request, suffix in ((REQUEST, ""), ({**REQUEST, "stream": True}, " stream")):
            for client in (gw, direct):  # warm-up: connections, first-use set-up
                timed_request(client, "/v1/messages", request)
            for _ in range(n):
                times["gw" + suffix].append(timed_request(gw, "/v1/messages", request))
                times["direct" + suffix].append(timed_request(direct, "/v1/messages", request))
    return times


def load(sock: str) -> float:
    """LOAD_CLIENTS slow streams at once through the gateway; seconds until all are read."""
    import httpx

    request = {**REQUEST, "model": "slow", "stream": True}
    barrier = threading.Barrier(LOAD_CLIENTS)
    errors: list[BaseException] = []

    def one() -> None:
        try:
            with httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://gateway", timeout=60) as c:
                barrier.wait()
                timed_request(c, "/v1/messages", request)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one) for _ in range(LOAD_CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"a streaming client failed: {errors[0]!r}")
    return time.perf_counter() - t0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", action="append", help="MODULE[:CLASS] (repeatable)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=20, help="open/close cycles per round")
    parser.add_argument("--requests", type=int, default=200, help="requests of each kind per round")
    parser.add_argument("--long", type=int, default=200, help="runs in a row for the memory kept (0: skip)")
    parser.add_argument("--host", help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.host:
        host(args.host, args.upstream, Path(args.folder))
        return
    specs: list[str] = args.gateway or ["orchestrator.sandbox.gateway"]
    fig: dict[str, dict[str, list[Any]]] = {s: {} for s in specs}

    def add(spec: str, key: str, *values: Any) -> None:
        fig[spec].setdefault(key, []).extend(values)

    print(f"load average at the start: {load_average()} ({os.cpu_count()} CPUs)")
    upstream = make_upstream()
    with upstream.serve() as base, tempfile.TemporaryDirectory(prefix="bench-gw-") as tmp:
        for r in range(args.rounds):
            for i, spec in enumerate(specs):
                folder = Path(tmp) / f"{r}-{i}"
                h = Host(spec, base, folder)
                try:
                    add(spec, "import", {k: h.start["imported"][k] - h.start["base"][k] for k in KEYS})
                    cold = h.ask(f"cold {args.cycles}")
                    add(spec, "first", cold["cycles"][0])
                    add(spec, "cycles", *cold["cycles"][1:])
                    add(spec, "kept", {k: cold["after"][k] - h.start["base"][k] for k in KEYS})
                    opened = h.ask("open")
                    add(spec, "open", {k: opened["open"][k] - cold["after"][k] for k in KEYS})
                    add(spec, "threads idle", opened["threads"])
                    for key, values in latency(opened["path"], base, args.requests).items():
                        add(spec, key, *values)
                    h.ask("peak")
                    add(spec, "load s", load(opened["path"]))
                    peak = h.ask("unpeak")
                    add(spec, "peak", {k: peak["peak"][k] - cold["after"][k] for k in KEYS})
                    add(spec, "threads peak", peak["threads"])
                    closed = h.ask("close")
                    add(spec, "closed", {k: closed["closed"][k] - cold["after"][k] for k in KEYS})
                    add(spec, "client", h.ask(f"client {args.cycles}")["client"])
                finally:
                    h.quit()
        if args.long:
            for i, spec in enumerate(specs):
                h = Host(spec, base, Path(tmp) / f"long-{i}")
                try:
                    done = 0
                    for n in (10, args.long):
                        if n > done:
                            after = h.ask(f"cold {n - done}")["after"]
                            add(spec, f"kept {n}", {k: after[k] - h.start["base"][k] for k in KEYS})
                            done = n
                finally:
                    h.quit()
    print(f"load average at the end:   {load_average()}")
    report(specs, fig, args)


def report(specs: list[str], fig: dict[str, dict[str, list[Any]]], args: argparse.Namespace) -> None:
    ms = 1000.0
    print(f"\ncold start per run (ms; {args.rounds} rounds x {args.cycles} cycles, first cycle of each process apart)")
    print(
        f"{'gateway':44} {'ready p50':>9} {'close p50':>9} {'total p50':>9} {'total p95':>9} {'cpu p50':>8}"
        f" | {'first: ready':>12} {'close':>6} {'cpu':>6}"
    )
    for s in specs:
        cyc = fig[s]["cycles"]
        ready, close, cpu = ([c[i] for c in cyc] for i in range(3))
        total = [a + b for a, b in zip(ready, close, strict=True)]
        first = fig[s]["first"]
        print(
            f"{s:44} {statistics.median(ready) * ms:9.1f} {statistics.median(close) * ms:9.1f}"
            f" {statistics.median(total) * ms:9.1f} {pct(total, 0.95) * ms:9.1f} {statistics.median(cpu) * ms:8.1f}"
            f" | {statistics.median(c[0] for c in first) * ms:12.1f} {statistics.median(c[1] for c in first) * ms:6.1f}"
            f" {statistics.median(c[2] for c in first) * ms:6.1f}"
        )
    client = statistics.median(x for s in specs for x in fig[s]["client"])
    print(f"  for scale: a new httpx.Client() (what loads the CA bundle) took {client * ms:.1f} ms here (p50)")

    def mib(entries: list[dict[str, int]]) -> str:
        return "/".join(f"{statistics.median(e[k] for e in entries) / 1024:.1f}" for k in KEYS)

    print(f"\nmemory added (MiB, RSS / USS / anonymous, median of {args.rounds} processes; host threads)")
    print(
        f"{'gateway':44} {'import':>14} {'kept':>14} {'open idle':>14} {'16 streams':>14} {'closed':>14}"
        f" {'threads idle/peak':>18}"
    )
    for s in specs:
        f = fig[s]
        cols = " ".join(f"{mib(f[k]):>14}" for k in ("import", "kept", "open", "peak", "closed"))
        threads = f"{statistics.median(f['threads idle']):.0f}/{max(f['threads peak']):.0f}"
        print(f"{s:44} {cols} {threads:>18}")
    print("  import: the module, after workers.app; kept: after the cold cycles; the rest from 'kept'")
    if args.long:
        print("\nmemory kept by a worker process after runs in a row (MiB above workers.app, RSS / USS / anonymous)")
        print(f"{'gateway':44} {'10 runs':>14} {str(args.long) + ' runs':>14}")
        for s in specs:
            print(
                f"{s:44} "
                + " ".join(f"{mib(fig[s][f'kept {n}']):>14}" for n in (10, args.long) if f"kept {n}" in fig[s])
            )

    print(f"\nlatency per request (ms; {args.rounds} x {args.requests} of each; p50 / p95)")
    print(
        f"{'gateway':44} {'direct':>13} {'gateway':>13} {'overhead p50':>13}"
        f" {'direct stream':>14} {'gw stream':>13} {'overhead p50':>13} {'16 streams s':>13}"
    )
    for s in specs:
        f = fig[s]

        def pp(key: str, f: dict[str, list[Any]] = f) -> str:
            return f"{statistics.median(f[key]) * ms:5.2f} / {pct(f[key], 0.95) * ms:5.2f}"

        plain = (statistics.median(f["gw"]) - statistics.median(f["direct"])) * ms
        streamed = (statistics.median(f["gw stream"]) - statistics.median(f["direct stream"])) * ms
        print(
            f"{s:44} {pp('direct'):>13} {pp('gw'):>13} {plain:+13.2f} {pp('direct stream'):>14}"
            f" {pp('gw stream'):>13} {streamed:+13.2f} {statistics.median(f['load s']):13.2f}"
        )


if __name__ == "__main__":
    main()
