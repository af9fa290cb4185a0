"""The soak (bench/soak.py), short: a minute of mixed traffic on each stack.

The real installation as ``orchestrator up`` runs it (the API under uvicorn,
an agent worker and a delivery worker, Docker containers, the offline
model), 32 API clients, 10 groups, a webhook receiver on loopback.  Asserted:
what the script checked (no 5xx, every acknowledged message stored once,
every trigger answered once, every delivery received once) and that it
reported memory over time; memory "flat" only with a generous bound (RSS is
noisy over a minute).  Never a speed: the 30-minute figures are in
docs/performance.md.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import (
    PG_URL,
    REDIS_URL,
    docker_available,
    pg_available,
    redis_available,
    require_service,
)

ROOT = Path(__file__).resolve().parents[2]
# A Redis database of its own (the soak flushes it): no other test's queues there.
SOAK_REDIS = re.sub(r"/\d+$", "", REDIS_URL) + "/10"
MAX_GROWTH = 0.5  # RSS at the end against 25 % of the run; generous, RSS is noisy


def test_soak_loses_nothing_duplicates_nothing_and_reports_flat_memory(tmp_path: Path) -> None:
    require_service(docker_available(), "a Docker engine")
    require_service(pg_available(), "PostgreSQL")
    require_service(redis_available(), "Redis")
    figures = tmp_path / "soak.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.soak",
            "--minutes",
            "1",
            "--interval",
            "10",
            "--pg",
            PG_URL,
            "--redis",
            SOAK_REDIS,
            "--json",
            str(figures),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"the soak failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    results = json.loads(figures.read_text())
    assert [r["stack"] for r in results] == ["sqlite + filesystem://", "postgresql + redis"]
    for r in results:
        assert r["failures"] == [], r["failures"]
        statuses = r["statuses"]
        assert statuses.get("5xx", 0) == 0 and statuses.get("error", 0) == 0, statuses
        assert statuses["2xx"] > 100, statuses  # the clients did run
        assert r["acknowledged"] > 50 and r["triggers"] >= 10, r
        # Every triggering message got its run, and none failed.
        assert r["runs"].get("succeeded", 0) >= r["triggers"] and not r["runs"].get("failed"), r["runs"]
        assert r["deliveries_received"] > 0
        # Memory reported over time, for the API and each worker (main + pool children).
        assert len(r["samples"]) >= 5
        assert set(r["memory"]) == {"api", "agent worker", "delivery worker"}
        for name, m in r["memory"].items():
            assert m["rss_25_mib"] > 10 and m["rss_end_mib"] > 10, (name, m)
            assert m["growth"] < MAX_GROWTH, (name, m)
        assert all(s["rss"]["agent worker"][1] > 0 for s in r["samples"][1:]), "no pool child measured"
