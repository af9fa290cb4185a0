"""What the egress proxy costs a sandbox's request (issue 35): the same client and server,
directly and through the proxy (the runner's loopback relay, the proxy's unix socket, the
proxy's decision and resolve entry), in one run.

* latency: ``--requests`` small GETs (a 12-byte file) one after the other, a new connection
  each (as the proxy serves one request per connection), p50 and p95;
* throughput: one GET of a ``--megabytes`` file, MB/s.

    .venv/bin/python -m bench.egress [--requests 300] [--megabytes 200]
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import statistics
import tempfile
import threading
import time
from pathlib import Path

from agent_runner.relay import UnixRelay
from orchestrator.sandbox.egress import EgressProxy, parse_resolve
from orchestrator.sandbox.egress_policy import parse_network_option

HOST = "files.internal.test"


class _Files(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass


def _get(port: int, path: str, proxy_port: int | None) -> int:
    """One GET on a new connection; the bytes of the body."""
    if proxy_port is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", path, headers={"Host": HOST})
    else:
        conn = http.client.HTTPConnection("127.0.0.1", proxy_port, timeout=30)
        conn.request("GET", f"http://{HOST}:{port}{path}")
    resp = conn.getresponse()
    n = 0
    while chunk := resp.read(1 << 20):
        n += len(chunk)
    conn.close()
    assert resp.status == 200, resp.status
    return n


def _latencies(port: int, proxy_port: int | None, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        _get(port, "/small.txt", proxy_port)
        out.append((time.perf_counter() - t) * 1000)
    return out


def _throughput(port: int, proxy_port: int | None) -> float:
    t = time.perf_counter()
    n = _get(port, "/big.bin", proxy_port)
    return n / (time.perf_counter() - t) / 1e6


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--requests", type=int, default=300)
    args.add_argument("--megabytes", type=int, default=200)
    opts = args.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "www"
        root.mkdir()
        (root / "small.txt").write_bytes(b"hello there\n")
        with (root / "big.bin").open("wb") as f:
            block = b"x" * (1 << 20)
            for _ in range(opts.megabytes):
                f.write(block)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _Files(*a, directory=str(root)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_address[1]
        policy = parse_network_option(f"allowlist:{HOST}")
        (Path(tmp) / "run").mkdir()
        with (
            EgressProxy(
                Path(tmp) / "run" / "egress.sock",
                policy,
                resolve=parse_resolve([f"{HOST}:{port}:127.0.0.1"]),
            ) as proxy,
            UnixRelay(str(proxy.socket_path)) as relay,
        ):
            _latencies(port, None, 20)  # warm both paths
            _latencies(port, relay.port, 20)
            direct = _latencies(port, None, opts.requests)
            proxied = _latencies(port, relay.port, opts.requests)
            direct_mb = _throughput(port, None)
            proxied_mb = _throughput(port, relay.port)
        server.shutdown()

    def p(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=100)[int(q) - 1]

    print(f"egress proxy: {opts.requests} small GETs each way, one {opts.megabytes} MB GET each way")
    print(f"  direct     p50 {p(direct, 50):6.2f} ms  p95 {p(direct, 95):6.2f} ms  {direct_mb:8.1f} MB/s")
    print(f"  via proxy  p50 {p(proxied, 50):6.2f} ms  p95 {p(proxied, 95):6.2f} ms  {proxied_mb:8.1f} MB/s")
    print(
        f"  proxy adds {p(proxied, 50) - p(direct, 50):.2f} ms at p50 (x{p(proxied, 50) / p(direct, 50):.2f}); "
        f"throughput x{proxied_mb / direct_mb:.2f}"
    )


if __name__ == "__main__":
    main()
