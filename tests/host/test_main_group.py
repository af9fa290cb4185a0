"""The main group on first start (``ORCHESTRATOR_MAIN_GROUP``, ``store.groups.ensure_main_group``)
and over the API (``is_main``), on both databases: there is one main group, an ordinary
group is never made main behind anyone's back, and the service commands make it before
they start (a fleet started service by service has one)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.core.errors import ConfigError, StoreError
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.http.endpoint import CLIENT_HEADER
from orchestrator.root import Orchestrator
from orchestrator.store.db import Database
from orchestrator.store.groups import (
    MAIN_JID,
    add_group,
    ensure_main_group,
    find_group,
    main_group,
    send_targets,
)
from tests.conftest import wait_until

BIN = Path(__file__).resolve().parents[2] / ".venv" / "bin"


def test_the_main_group_of_the_setting_is_made_once(db: Database) -> None:
    made = ensure_main_group(db, "ops@team")
    assert (made.chat_jid, made.is_main, made.requires_trigger, made.folder) == ("ops@team", True, False, "main")
    assert ensure_main_group(db, "ops@team") == made and main_group(db) == made
    # Another chat is main already: a second main group is refused, whoever asks.
    with pytest.raises(ConfigError, match="'ops@team' already"):
        ensure_main_group(db, MAIN_JID)
    with pytest.raises(StoreError, match="one"):
        add_group(db, chat_jid="x@team", name="x", folder="x", is_main=True)
    assert find_group(db, MAIN_JID) is None


def test_the_main_groups_agent_may_post_to_every_other_chat_and_no_other_group_may(db: Database) -> None:
    main = ensure_main_group(db)
    for jid in ("b@g", "Z@g", "a@g"):
        add_group(db, chat_jid=jid, name=jid, folder=jid.split("@")[0].lower() + "-f", requires_trigger=False)
    # Every registered chat but its own, in byte order on both backends.
    assert send_targets(db, main) == sorted(["a@g", "b@g", "Z@g"], key=str.encode)
    other = find_group(db, "a@g")
    assert other is not None and send_targets(db, other) == []


def test_an_ordinary_group_is_never_made_main(db: Database) -> None:
    add_group(db, chat_jid="team@chat", name="team", folder="main")
    with pytest.raises(ConfigError, match="ordinary group"):
        ensure_main_group(db, "team@chat")
    assert not find_group(db, "team@chat").is_main  # type: ignore[union-attr]
    # Its folder is taken: the main group gets one of its own.
    made = ensure_main_group(db, "ops@team")
    assert made.folder.startswith("main-") and made.is_main


def test_the_api_registers_the_main_group_once(db: Database, settings: Settings) -> None:
    with TestClient(create_app(Orchestrator(settings)), headers={CLIENT_HEADER: "tests"}) as client:
        body = {"chat_jid": "ops@team", "name": "ops", "folder": "ops", "is_main": True}
        r = client.post("/api/groups", json=body)
        assert r.status_code == 201 and r.json()["is_main"] and not r.json()["requires_trigger"], r.text
        again = client.post("/api/groups", json={**body, "chat_jid": "two@team", "folder": "two"})
        assert again.status_code == 409 and "ops@team" in again.text
        plain = client.post("/api/groups", json={"chat_jid": "p@team", "name": "p", "folder": "p"})
        assert plain.status_code == 201 and not plain.json()["is_main"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_api_command_makes_the_main_group_before_it_serves(db: Database, settings: Settings) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    env.update(
        ORCHESTRATOR_DATA_DIR=str(settings.data_dir),
        ORCHESTRATOR_DATABASE_URL=settings.effective_database_url,
        ORCHESTRATOR_MAIN_GROUP="ops@team",
    )
    api = subprocess.Popen(
        [str(BIN / "orchestrator"), "api", "--port", str(_free_port())],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(
            lambda: find_group(db, "ops@team") is not None,
            30,
            "the main group",
            lambda: "exited" if api.poll() is not None else "",
        )
        assert find_group(db, "ops@team").is_main  # type: ignore[union-attr]
    finally:
        api.terminate()
        api.wait(20)
    # A setting that names an ordinary group: the command stops at once, saying so.
    add_group(db, chat_jid="team@chat", name="team", folder="team")
    env["ORCHESTRATOR_MAIN_GROUP"] = "team@chat"
    refused = subprocess.run([str(BIN / "orchestrator"), "worker"], env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "ordinary group" in refused.stderr, refused.stderr
