"""The garbage collector in the long-running processes (orchestrator/core/heap.py): the
API server's factory settles the heap; cycles made afterwards are still collected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROBE = """
import gc, json, weakref
from orchestrator.core import heap
from orchestrator.http.api import serve_app

before = gc.get_freeze_count()
app = serve_app()
class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a          # a cycle made after start-up
gone = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({"frozen_before": before, "frozen": gc.get_freeze_count(), "threshold": gc.get_threshold(),
                  "young": heap.YOUNG_THRESHOLD, "cycle_collected": gone() is None, "routes": len(app.routes)}))
"""


def test_the_servers_factory_freezes_start_up_and_cycles_are_still_collected(tmp_path: Path) -> None:
    env = {**os.environ, "ORCHESTRATOR_DATA_DIR": str(tmp_path / "data")}
    env.pop("ORCHESTRATOR_DATABASE_URL", None)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["frozen_before"] == 0
    assert seen["frozen"] > 10_000  # start-up's objects: modules, routes, schemas, tables
    assert seen["threshold"][0] == seen["young"]
    assert seen["cycle_collected"]
    assert seen["routes"] > 10
