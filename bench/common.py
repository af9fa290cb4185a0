"""What the process benchmarks share: an installation in a temporary data
dir, real ``celery worker`` processes, and CPU / memory accounting of the
processes involved (workers with their pool children, the Docker daemon).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self

import docker
import psutil
from docker.errors import DockerException, NotFound

from orchestrator.channels.webhook import SIGNATURE_HEADER, verify
from orchestrator.core.settings import Settings
from orchestrator.run.queue import Signals, make_celery
from orchestrator.sandbox.containers import LABEL_INSTALL, LABEL_MANAGED
from orchestrator.store.db import Database

ROOT = Path(__file__).resolve().parents[1]


def install(data_dir: Path, image: str, warm_idle_s: float = 0, **extra: object) -> tuple[Settings, Database]:
    """A fresh installation (embedded SQLite + filesystem:// unless ``extra`` says otherwise).

    No workspace quota unless ``extra`` asks for one: as root the default
    loop-mounts a volume per group, which would outlive the benchmark's
    temporary data dir (its first-run cost is in docs/performance.md).
    """
    extra.setdefault("workspace_quota", "0")
    settings = Settings.load(data_dir=data_dir, agent_image=image, warm_idle_s=warm_idle_s, env_file=None, **extra)
    settings.ensure_dirs()
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    db.migrate()
    return settings, db


def worker_env(settings: Settings) -> dict[str, str]:
    env = {
        **os.environ,
        "ORCHESTRATOR_DATA_DIR": str(settings.data_dir),
        "ORCHESTRATOR_AGENT_IMAGE": settings.sandbox.agent_image,
        "ORCHESTRATOR_WARM_IDLE_S": str(settings.sandbox.warm_idle_s),
        "ORCHESTRATOR_STANDBY": str(settings.sandbox.standby),
        "ORCHESTRATOR_LOG_LEVEL": "WARNING",
        "ORCHESTRATOR_WORKSPACE_QUOTA": settings.sandbox.workspace_quota,
    }
    if settings.database_url:
        env["ORCHESTRATOR_DATABASE_URL"] = settings.database_url
    if settings.broker_url:
        env["ORCHESTRATOR_BROKER_URL"] = settings.broker_url
    return env


@dataclass
class Workers:
    """``n`` ``celery worker`` processes of ``app``, each with ``concurrency`` pool children
    (by default one: one run at a time); ``host_ids`` gives each its own host id (as N hosts)."""

    settings: Settings
    n: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    app: str = "workers.app"
    concurrency: int = 1
    host_ids: bool = False
    # More of the workers' environment (settings ``install`` does not pass on: the model, ...).
    env: dict[str, str] = field(default_factory=dict)

    def __enter__(self) -> Self:
        env = worker_env(self.settings) | self.env
        for i in range(self.n):
            log = open(self.settings.data_dir / f"worker{i}.log", "wb")  # closed with the process
            own = {"ORCHESTRATOR_HOST_ID": f"bench-host-{i}"} if self.host_ids else {}
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "celery",
                        "-A",
                        self.app,
                        "worker",
                        "-Q",
                        "agent,delivery",
                        "--concurrency",
                        str(self.concurrency),
                        "-l",
                        "WARNING",
                        "--without-gossip",
                        "--without-mingle",
                        "--without-heartbeat",
                        "-n",
                        f"bench{i}@%h",
                    ],
                    env={**env, **own},
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                )
            )
        return self

    def __exit__(self, *exc: object) -> None:
        stop_processes(self.procs)

    def trees(self) -> list[psutil.Process]:
        """Every worker process and its pool children."""
        out: list[psutil.Process] = []
        for p in self.procs:
            with contextlib.suppress(psutil.Error):
                parent = psutil.Process(p.pid)
                out += [parent, *parent.children(recursive=True)]
        return out

    def logs(self) -> str:
        return "\n".join((self.settings.data_dir / f"worker{i}.log").read_text()[-2000:] for i in range(self.n))


# Extra settings of one installation, made fresh for each (a new database).
Extra = Callable[[], contextlib.AbstractContextManager[dict[str, str]]]


def stacks(pg: str, redis: str) -> list[tuple[str, Extra]]:
    """The stacks a process benchmark measures: the embedded one, and PostgreSQL + Redis
    when both URLs are given (a fresh database per installation)."""

    @contextlib.contextmanager
    def embedded() -> Iterator[dict[str, str]]:
        yield {}

    @contextlib.contextmanager
    def fleet() -> Iterator[dict[str, str]]:
        with fresh_pg_database(pg) as url:
            yield {"database_url": url, "broker_url": redis}

    return [("sqlite + filesystem://", embedded)] + ([("postgresql + redis", fleet)] if pg and redis else [])


def flush_broker(settings: Settings) -> None:
    """Empty a Redis broker's database: a benchmark's queues must not meet leftovers."""
    if settings.broker_url.startswith("redis"):
        import redis

        redis.Redis.from_url(settings.broker_url).flushdb()


def pct(values: list[float], p: float) -> float:
    """The ``p``-th percentile (0-100) of ``values``, by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def stop_processes(procs: list[subprocess.Popen[bytes]], timeout: float = 30) -> None:
    """SIGTERM each process still running, then wait for all (SIGKILL one that takes longer than ``timeout``)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def process_logs(settings: Settings) -> str:
    """The tail of every log under ``<data dir>/logs`` (where the process benchmarks write them)."""
    folder = settings.data_dir / "logs"
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(folder.glob("*.log")))


def wait_for(cond: Callable[[], bool], timeout: float, what: str, settings: Settings, poll: float = 0.02) -> float:
    """Poll ``cond()`` until true; the time it took.  Past ``timeout`` the benchmark stops,
    saying what it waited for, with the processes' logs."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"{what}: not within {timeout:.0f} s; logs:\n{process_logs(settings)}")
        time.sleep(poll)
    return time.monotonic() - t0


def cpu_seconds(procs: list[psutil.Process]) -> float:
    """User + system CPU of ``procs``, with the children they have reaped."""
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def daemon_processes() -> dict[str, list[psutil.Process]]:
    found: dict[str, list[psutil.Process]] = {"dockerd": [], "containerd": []}
    for p in psutil.process_iter(["name"]):
        if p.info["name"] in found:
            found[p.info["name"]].append(p)
    return found


def containers_cpu_seconds() -> float | None:
    """CPU used so far by every Docker container's processes (their parent
    cgroup keeps the time of containers already removed); None if unreadable."""
    v1 = Path("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage")
    v2 = Path("/sys/fs/cgroup/docker/cpu.stat")
    with contextlib.suppress(OSError, ValueError):
        if v1.exists():
            return int(v1.read_text()) / 1e9
        if v2.exists():
            stat = dict(line.split() for line in v2.read_text().splitlines())
            return int(stat["usage_usec"]) / 1e6
    return None


class CpuAccount:
    """CPU used between :meth:`start` and :meth:`stop`, by whom.

    The containers' own processes are read from their cgroup when the host
    exposes it; the rest of the short-lived processes (container shims, runc,
    the kernel's work, anything else on the machine) land in ``other``: the
    machine's busy time minus everything named.
    """

    def __init__(self, named: dict[str, list[psutil.Process]]) -> None:
        self.named = named
        self.used: dict[str, float] = {}

    @staticmethod
    def _busy() -> tuple[float, float]:
        t = psutil.cpu_times()
        return t.user + t.nice + t.system + t.irq + t.softirq + t.steal, t.idle + t.iowait

    def start(self) -> CpuAccount:
        self._t0 = time.monotonic()
        self._busy0 = self._busy()
        self._self0 = sum(os.times()[:4])
        self._named0 = {k: cpu_seconds(v) for k, v in self.named.items()}
        self._containers0 = containers_cpu_seconds()
        return self

    def stop(self) -> CpuAccount:
        self.wall = time.monotonic() - self._t0
        busy1 = self._busy()
        self.busy = busy1[0] - self._busy0[0]
        self.used = {k: cpu_seconds(v) - self._named0[k] for k, v in self.named.items()}
        self.used["bench driver"] = sum(os.times()[:4]) - self._self0
        containers = containers_cpu_seconds()
        if containers is not None and self._containers0 is not None:
            self.used["containers (their cgroup)"] = containers - self._containers0
        self.used["other (shims, runc, kernel, other users)"] = max(0.0, self.busy - sum(self.used.values()))
        return self

    def lines(self, per: int, unit: str) -> list[str]:
        cores = psutil.cpu_count() or 1
        out = [
            f"    machine busy {self.busy:6.1f} CPU-s over {self.wall:5.1f} s"
            f" = {self.busy / self.wall / cores:4.0%} of {cores} cores"
        ]
        for name, secs in self.used.items():
            out.append(f"    {name:46} {secs:6.1f} CPU-s  {secs / max(per, 1) * 1000:6.1f} ms/{unit}")
        return out


def remove_install_containers(settings: Settings) -> int:
    """Remove every container of this installation (a benchmark's leftovers), warm
    and standby ones through their pool: a standby's slot holds mounts to release."""
    from orchestrator.sandbox.warm import WarmPool

    client = docker.from_env()
    removed = WarmPool(settings, client).stop_all()
    labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={settings.install_id}"]
    for c in client.containers.list(all=True, filters={"label": labels}):
        with contextlib.suppress(NotFound, DockerException):
            c.remove(force=True)
            removed += 1
    return removed


@contextlib.contextmanager
def fresh_pg_database(url: str) -> Iterator[str]:
    """A new database on ``url``'s server (its URL), dropped afterwards."""
    import psycopg
    from psycopg import sql
    from sqlalchemy.engine import make_url

    name = f"orch_bench_{uuid.uuid4().hex[:10]}"
    maintenance = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(maintenance, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(maintenance, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextlib.contextmanager
def timed() -> Iterator[list[float]]:
    box: list[float] = []
    t0 = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - t0)


_SIGNALS: dict[tuple[str, str], Signals] = {}


def signals_for(settings: Settings) -> Signals:
    """One Signals (one Celery app) per broker: a benchmark talks to several installations in turn.

    Keyed by the broker URL and the data dir: every installation's
    ``filesystem://`` broker has the same URL and its own folders.
    """
    key = (settings.effective_broker_url, str(settings.data_dir))
    if key not in _SIGNALS:
        _SIGNALS[key] = Signals(lambda: make_celery(settings))
    return _SIGNALS[key]


class HookReceiver:
    """A webhook endpoint on loopback (a threaded HTTP server): each POST's signature
    is checked with ``secret``, then :meth:`signed` or :meth:`unsigned` is told of it
    under ``self._lock``, and it is answered 200 or 401."""

    def __init__(self, secret: str) -> None:
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the http.server name
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                arrived = (time.monotonic(), time.time())
                ok = verify(secret, body, self.headers.get(SIGNATURE_HEADER))
                with receiver._lock:
                    if ok:
                        receiver.signed(self.headers, body, arrived)
                    else:
                        receiver.unsigned()
                self.send_response(200 if ok else 401)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # the base class's name
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def signed(self, headers: Message, body: bytes, arrived: tuple[float, float]) -> None:
        """A POST with a good signature (``arrived``: monotonic and wall clock)."""

    def unsigned(self) -> None:
        """A POST with a wrong or missing signature."""

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class DockerCalls:
    """The requests a Docker client sends to its engine (each one an API call), in
    order, as ``GET /containers/json``: counted on the client's own HTTP session
    (the SDK's ``APIClient`` is a ``requests.Session``), so nothing is faked and a
    call made through any of the SDK's layers is seen."""

    def __init__(self, client: docker.DockerClient) -> None:
        self.calls: list[str] = []
        api = client.api
        send = api.request

        def request(method: str, url: str, *args: object, **kwargs: object) -> object:
            path = url.split("://", 1)[-1]
            path = "/" + path.split("/", 1)[1] if "/" in path else path
            # The API's version prefix (/v1.41) says nothing about the call.
            self.calls.append(f"{method} {path.split('?', 1)[0].split('/', 2)[-1]}")
            return send(method, url, *args, **kwargs)

        api.request = request  # type: ignore[method-assign]

    def take(self) -> list[str]:
        """The calls since the last take."""
        calls, self.calls = self.calls, []
        return calls
