"""A worker proves it sees the installation's data dir before it takes work
(orchestrator/store/installation.py), on both databases, and a real worker
process with another data dir refuses to start."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from orchestrator.core.errors import ConfigError, DataDirNotShared
from orchestrator.core.settings import Settings
from orchestrator.store.db import Database
from orchestrator.store.installation import MARKER_FILE, prove_data_dir

ROOT = Path(__file__).resolve().parents[2]


def _beside(settings: Settings, data_dir: Path) -> Settings:
    """Another data dir on the same database (as a second host would have)."""
    return settings.replace(data_dir=data_dir, database_url=settings.effective_database_url)


def test_the_first_start_marks_the_data_dir_and_later_ones_find_it(db: Database, settings: Settings) -> None:
    marker = prove_data_dir(db, settings)
    assert (settings.data_dir / MARKER_FILE).read_text().strip() == marker and len(marker) == 32
    assert prove_data_dir(db, settings) == marker
    # A second host that mounts the same (shared) data dir: the same proof.
    assert prove_data_dir(db, _beside(settings, settings.data_dir)) == marker


def test_a_worker_with_a_local_data_dir_is_refused(db: Database, settings: Settings, tmp_path: Path) -> None:
    prove_data_dir(db, settings)
    local = _beside(settings, tmp_path / "local")
    with pytest.raises(DataDirNotShared) as refused:
        prove_data_dir(db, local)
    assert f"{local.data_dir / MARKER_FILE} is missing" in str(refused.value)
    assert "shared data dir" in str(refused.value) and isinstance(refused.value, ConfigError)
    assert not (local.data_dir / MARKER_FILE).exists()  # never marked as if it were the shared one
    other = _beside(settings, tmp_path / "other")
    other.data_dir.mkdir()
    (other.data_dir / MARKER_FILE).write_text("0" * 32)
    with pytest.raises(DataDirNotShared, match="names another installation"):
        prove_data_dir(db, other)


def test_an_installation_from_before_markers_adopts_its_data_dir(db: Database, settings: Settings) -> None:
    # Group files already there, no marker anywhere: the first start after the upgrade.
    (settings.groups_dir / "team").mkdir(parents=True)
    marker = prove_data_dir(db, settings)
    assert (settings.data_dir / MARKER_FILE).read_text().strip() == marker


def test_a_recreated_database_keeps_the_data_dirs_marker(db: Database, settings: Settings) -> None:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    (settings.data_dir / MARKER_FILE).write_text("f" * 32 + "\n")
    assert prove_data_dir(db, settings) == "f" * 32


def test_a_real_worker_with_another_data_dir_refuses_to_start(db: Database, settings: Settings, tmp_path: Path) -> None:
    prove_data_dir(db, settings)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    env.update(
        ORCHESTRATOR_DATA_DIR=str(tmp_path / "elsewhere"),
        ORCHESTRATOR_DATABASE_URL=settings.effective_database_url,
        ORCHESTRATOR_WORKSPACE_QUOTA="0",
        PYTHONPATH=str(ROOT),
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "workers.app",
            "worker",
            "-Q",
            "agent",
            "--concurrency",
            "1",
            "--without-gossip",
            "--without-mingle",
            "-l",
            "INFO",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "refusing to start: the data dir" in output and "is missing" in output, output[-3000:]


def test_workers_that_start_together_all_prove_the_same_marker(db: Database, settings: Settings) -> None:
    # `up` starts an agent worker and a deliverer at once: neither may see the
    # other's row before its file (the first start used to refuse one of them).
    from sqlalchemy import delete

    from orchestrator.store.tables import InstallationRow

    provers = 6
    for _round in range(8):
        with db.write() as session:
            session.execute(delete(InstallationRow))
        (settings.data_dir / MARKER_FILE).unlink(missing_ok=True)
        start = threading.Barrier(provers)
        proved: list[str | BaseException] = []

        def prove() -> None:
            start.wait()
            try:
                proved.append(prove_data_dir(db, settings))
            except BaseException as refused:  # noqa: BLE001 - reported by the assert below
                proved.append(refused)

        threads = [threading.Thread(target=prove) for _ in range(provers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert len(proved) == provers and len(set(proved)) == 1, proved
        assert (settings.data_dir / MARKER_FILE).read_text().strip() == proved[0]
        assert not list(settings.data_dir.glob(f"{MARKER_FILE}.*.tmp"))
