"""Log lines (orchestrator/core/logs.py): text for people, JSON lines with the context of
the work (``chat_jid``, ``run_id``, ``host``), in a real process configured from its
environment as the CLI, the workers and uvicorn configure theirs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core.errors import SettingsError
from orchestrator.core.logs import dict_config
from orchestrator.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import logging
from orchestrator.core.logs import configure, log_context
from orchestrator.core.settings import Settings
configure(Settings.load(env_file=None))
log = logging.getLogger("orchestrator.run.pipeline")
log.info("outside")
with log_context(chat_jid="team@g.us"):
    with log_context(run_id="r-1"):
        log.warning("inside %s", "both")
    log.info("only the chat")
log.debug("below the level")
try:
    raise ValueError("boom")
except ValueError:
    log.exception("it failed")
"""


def _run(tmp_path: Path, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=clean | {"ORCHESTRATOR_DATA_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)} | env,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_json_lines_carry_the_context_of_the_work(tmp_path: Path) -> None:
    out = _run(tmp_path, ORCHESTRATOR_LOG_FORMAT="json", ORCHESTRATOR_HOST_ID="host-7")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(x["level"], x["message"]) for x in lines] == [
        ("INFO", "outside"),
        ("WARNING", "inside both"),
        ("INFO", "only the chat"),
        ("ERROR", "it failed"),
    ]
    outside, inside, chat, failed = lines
    assert (outside["chat_jid"], outside["run_id"]) == ("", "")
    assert (inside["chat_jid"], inside["run_id"], inside["host"]) == ("team@g.us", "r-1", "host-7")
    assert (chat["chat_jid"], chat["run_id"]) == ("team@g.us", "")  # the inner context ended
    assert {"time", "logger", "trace_id"} <= set(inside) and inside["logger"] == "orchestrator.run.pipeline"
    assert "ValueError: boom" in failed["exc_info"]


def test_text_lines_name_the_context_only_when_there_is_one(tmp_path: Path) -> None:
    out = _run(tmp_path, ORCHESTRATOR_LOG_LEVEL="DEBUG").splitlines()
    assert out[0].endswith("INFO orchestrator.run.pipeline: outside")
    assert out[1].endswith("WARNING orchestrator.run.pipeline: inside both [chat_jid=team@g.us] [run_id=r-1]")
    assert out[2].endswith("only the chat [chat_jid=team@g.us]")
    assert out[3].endswith("below the level")  # DEBUG when asked for


def test_uvicorns_config_is_the_same_and_the_format_is_checked(tmp_path: Path) -> None:
    settings = Settings.load(data_dir=tmp_path, log_format="json", env_file=None)
    config = dict_config(settings)
    assert config["formatters"]["line"]["()"].endswith("json_formatter")
    assert config["loggers"]["uvicorn.access"] == {"handlers": [], "propagate": True}
    json.dumps(config)  # written to a file for --log-config
    with pytest.raises(SettingsError, match="LOG_FORMAT"):
        Settings.load(environ={"ORCHESTRATOR_LOG_FORMAT": "xml"}, env_file=None)
