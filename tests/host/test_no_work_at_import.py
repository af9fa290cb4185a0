"""No work at import time, and no process-wide state set by building a root.

Importing ``workers.app`` or ``orchestrator.root`` reads no environment into a
root, makes no folder and builds no :class:`~orchestrator.root.Orchestrator`; the
worker's root and app are built when Celery looks the app up (``celery -A
workers.app``), with its tasks.  Building a root hides no secret and starts no
trace exporter: those are the process's, set by its entry point
(``orchestrator/core/process.py``), so two roots in one process share nothing.
Each check runs in a fresh interpreter: the test process has long set both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, cwd: Path, *args: str, **env: str) -> dict[str, object]:
    """Run ``code`` (with ``args``) in a fresh interpreter with only ``env`` of the ORCHESTRATOR_
    and OTEL_ variables; its last line of output, as JSON."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ORCHESTRATOR_", "OTEL_"))}
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env={**clean, **env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


IMPORTS = r"""
import json
import orchestrator.root

built = []
real_init = orchestrator.root.Orchestrator.__init__

def counting_init(self, *args, **kwargs):
    built.append(1)
    real_init(self, *args, **kwargs)

orchestrator.root.Orchestrator.__init__ = counting_init
import workers.app
import workers.tasks
import workers.host
print(json.dumps({"roots": len(built)}))
"""


def test_importing_the_worker_app_and_the_root_builds_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "never-made"
    work = tmp_path / "cwd"
    work.mkdir()
    seen = _python(IMPORTS, work, ORCHESTRATOR_DATA_DIR=str(data_dir))
    assert seen["roots"] == 0
    assert not data_dir.exists()
    assert list(work.iterdir()) == []  # nor ./data, the default


FINDS_THE_APP = r"""
import json
from celery.app.utils import find_app
import workers.app

app = find_app("workers.app")  # as `celery -A workers.app worker` does
print(json.dumps({
    "same": app is workers.app.worker_root().celery and app is workers.app.app,
    "tasks": sorted(name for name in app.tasks if name.startswith("workers.")),
}))
"""


def test_celery_finds_the_worker_app_with_its_tasks(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    seen = _python(FINDS_THE_APP, tmp_path, ORCHESTRATOR_DATA_DIR=str(data_dir))
    assert seen["same"] is True
    assert seen["tasks"] == [
        "workers.tasks.deliver",
        "workers.tasks.drain_group",
        "workers.tasks.fire_schedules",
        "workers.tasks.replay_run",
        "workers.tasks.sweep",
    ]
    assert data_dir.is_dir()  # built on first use, from the environment


TWO_ROOTS = r"""
import json, sys
from pathlib import Path

import pytest
from orchestrator.core import secrets, tracing
from orchestrator.core.process import set_up_process
from orchestrator.core.settings import Settings
from orchestrator.root import Orchestrator

def settings(name, **environ):
    return Settings.load(
        environ={"ORCHESTRATOR_API_TOKEN": f"{name}-root-token-5c1e", **environ},
        env_file=None,
        data_dir=Path(sys.argv[1]) / name,
    )

first = Orchestrator(settings("first", OTEL_TRACES_EXPORTER="console"))
second = Orchestrator(settings("second"))
after_building = {
    "first hidden": secrets.redact("first-root-token-5c1e") != "first-root-token-5c1e",
    "second hidden": secrets.redact("second-root-token-5c1e") != "second-root-token-5c1e",
    "tracing": tracing.enabled(),
}
set_up_process(second.settings)  # the process's entry point, with the second root's settings
set_up_process(second.settings)  # twice: idempotent
after_set_up = {
    "first hidden": secrets.redact("first-root-token-5c1e") != "first-root-token-5c1e",
    "second hidden": secrets.redact("second-root-token-5c1e") != "second-root-token-5c1e",
    "tracing": tracing.enabled(),
}
print(json.dumps({"after building": after_building, "after set-up": after_set_up}))
"""


def test_two_roots_in_one_process_leak_no_secrets_or_tracing_into_each_other(tmp_path: Path) -> None:
    seen = _python(TWO_ROOTS, tmp_path, str(tmp_path))
    # Building either root set nothing: the first one's console exporter and token are not the process's.
    assert seen["after building"] == {"first hidden": False, "second hidden": False, "tracing": False}
    # The entry point's set-up is the second's alone: its token hidden, the first's not, no exporter.
    assert seen["after set-up"] == {"first hidden": False, "second hidden": True, "tracing": False}
    assert not (tmp_path / "first").exists() and not (tmp_path / "second").exists()


ENTRY_POINTS = r"""
import json, sys
from orchestrator.core import secrets, tracing

def process_state():
    return {"hidden": secrets.redact("entry-point-token-9d2f") != "entry-point-token-9d2f", "tracing": tracing.enabled()}

seen = {}
if sys.argv[1] == "cli":
    from orchestrator.cli.support import setup
    seen["built"] = process_state()
    setup()
elif sys.argv[1] == "api":
    from orchestrator.http.api import serve_app
    seen["built"] = process_state()
    serve_app()  # what uvicorn --factory calls
else:
    from celery.signals import setup_logging
    import workers.app

    workers.app.worker_root()  # as Celery's -A does
    seen["built"] = process_state()
    # What a worker (and beat) sends as it starts, before its pool forks.
    setup_logging.send(sender=None, loglevel="INFO", logfile=None, format="", colorize=False)
seen["set up"] = process_state()
print(json.dumps(seen))
"""


@pytest.mark.parametrize("entry_point", ["cli", "api", "worker"])
def test_each_entry_point_sets_up_its_process(tmp_path: Path, entry_point: str) -> None:
    env = {
        "ORCHESTRATOR_DATA_DIR": str(tmp_path / "data"),
        "ORCHESTRATOR_API_TOKEN": "entry-point-token-9d2f",
        "OTEL_TRACES_EXPORTER": "console",
    }
    seen = _python(ENTRY_POINTS, tmp_path, entry_point, **env)
    assert seen["built"] == {"hidden": False, "tracing": False}  # the root did not
    assert seen["set up"] == {"hidden": True, "tracing": True}  # its entry point did
