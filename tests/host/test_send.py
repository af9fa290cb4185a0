"""``orchestrator send`` as a thin client of a running installation's API, and
its in-process path when none runs (orchestrator/cli/send.py, http/endpoint.py).

Real processes: ``orchestrator api`` (uvicorn) and the ``orchestrator``
executable, on both databases.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core.settings import Settings
from orchestrator.http.endpoint import ANNOUNCE_FILE, announce, find
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import get_messages_after, now_iso, store_message_direct
from tests.conftest import wait_until

CLI = str(Path(sys.executable).parent / "orchestrator")
JID = "send@local"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    env.update(
        ORCHESTRATOR_DATA_DIR=str(settings.data_dir),
        ORCHESTRATOR_DATABASE_URL=settings.database_url,
        ORCHESTRATOR_WORKSPACE_QUOTA="0",
        ORCHESTRATOR_LOG_LEVEL="WARNING",
        **extra,
    )
    return env


def _send(settings: Settings, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, "send", *args], env=_env(settings, **extra), capture_output=True, text=True, timeout=60)


def _contents(db: Database, chat_jid: str = JID) -> list[str]:
    return [m.content for m in get_messages_after(chat_jid, 0, db=db)]


@pytest.fixture
def api_server(db: Database, settings: Settings) -> Iterator[str]:
    """``orchestrator api`` serving ``settings``' installation; yields its URL."""
    add_group(db, chat_jid=JID, name="send", folder="send", requires_trigger=False)
    port = _free_port()
    proc = subprocess.Popen(
        [CLI, "api", "--port", str(port)],
        env=_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    try:
        wait_until(healthy, 60, "the API to answer")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_send_goes_through_the_announced_api(db: Database, settings: Settings, api_server: str) -> None:
    announced = json.loads((settings.data_dir / ANNOUNCE_FILE).read_text())
    assert announced["url"] == api_server
    done = _send(settings, JID, "through the api", "--metadata", '{"source": "test"}')
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == f"stored #1 in {JID} via {api_server}"
    [stored] = get_messages_after(JID, 0, db=db)
    assert (stored.content, stored.sender, stored.metadata) == ("through the api", "cli-user", {"source": "test"})
    assert stored.id.startswith("msg-")


def test_send_through_the_api_reports_its_refusal(db: Database, settings: Settings, api_server: str) -> None:
    # The API requires a registered chat: its 404 reaches the user, nothing is stored anywhere.
    done = _send(settings, "nobody@local", "hello?")
    assert done.returncode == 1
    assert "404" in done.stderr and "no registered group" in done.stderr
    assert _contents(db, "nobody@local") == []


def test_a_stale_announcement_falls_back_to_storing_in_process(db: Database, settings: Settings) -> None:
    add_group(db, chat_jid=JID, name="send", folder="send", requires_trigger=False)
    settings.ensure_dirs()
    announce(settings, "127.0.0.1", _free_port(), pid=999_999)  # nothing listens there
    done = _send(settings, JID, "nobody serves")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == f"stored #1 in {JID}"
    assert _contents(db) == ["nobody serves"]


def test_another_installations_api_refuses_and_the_message_stays_home(
    db: Database, settings: Settings, api_server: str, tmp_path: Path
) -> None:
    # A second installation (its own data dir and SQLite file) whose announce
    # file names the first one's port, as a stale file would after a restart.
    other = Settings.load(data_dir=tmp_path / "other", env_file=None)
    other.ensure_dirs()
    other_db = Database(other.effective_database_url, lock_dir=other.data_dir)
    other_db.migrate()
    add_group(other_db, chat_jid=JID, name="send", folder="send", requires_trigger=False)
    port = int(api_server.rsplit(":", 1)[1])
    announce(other, "127.0.0.1", port, pid=999_999)
    done = _send(other, JID, "for the other installation")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == f"stored #1 in {JID}"  # in process, not via the API
    assert [m.content for m in get_messages_after(JID, 0, db=other_db)] == ["for the other installation"]
    assert _contents(db) == []
    # The refusal itself, as the API gives it.
    request = urllib.request.Request(api_server + "/api/info", headers={"X-Orchestrator-Install": "someone-else"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 421
    other_db.dispose()


def test_an_explicit_api_url_that_does_not_answer_is_an_error(db: Database, settings: Settings) -> None:
    add_group(db, chat_jid=JID, name="send", folder="send", requires_trigger=False)
    url = f"http://127.0.0.1:{_free_port()}"
    done = _send(settings, JID, "lost?", ORCHESTRATOR_API_URL=url)
    assert done.returncode == 1
    assert f"no API answers at {url}" in done.stderr
    assert _contents(db) == []  # never stored behind the user's back


def test_send_is_the_same_command_through_the_typer_app(db: Database, settings: Settings) -> None:
    # The typer app's `send` reaches the click command through its forwarding
    # entry, options and all.
    add_group(db, chat_jid=JID, name="send", folder="send", requires_trigger=False)
    typer_app = [sys.executable, "-c", "import sys; from orchestrator.cli.main import main; sys.argv[0] = 'x'; main()"]
    done = subprocess.run(
        [*typer_app, "send", JID, "forwarded", "--sender", "ann"],
        env=_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "stored #1" in done.stderr
    [stored] = get_messages_after(JID, 0, db=db)
    assert (stored.content, stored.sender) == ("forwarded", "ann")
    helped = subprocess.run(
        [*typer_app, "send", "--help"], env=_env(settings), capture_output=True, text=True, timeout=60
    )
    assert "Usage: orchestrator send [OPTIONS] CHAT_JID TEXT" in helped.stdout


def test_the_endpoint_is_found_from_settings(tmp_path: Path) -> None:
    settings = Settings.load(data_dir=tmp_path, env_file=None)
    assert find(settings) is None
    (tmp_path / ANNOUNCE_FILE).write_text("not json")
    assert find(settings) is None
    announce(settings, "0.0.0.0", 8123)
    found = find(settings)
    assert found is not None and (found.url, found.install_id) == ("http://127.0.0.1:8123", settings.install_id)
    announce(settings, "::", 8123)
    assert find(settings) is not None and find(settings).url == "http://[::1]:8123"  # type: ignore[union-attr]
    explicit = find(settings.replace(api_url="https://api.example:9000/", api_token="t"))
    assert explicit is not None
    assert (explicit.url, explicit.token, explicit.install_id) == ("https://api.example:9000", "t", None)


def test_send_through_the_api_imports_no_store_no_typer_no_pydantic(
    db: Database, settings: Settings, api_server: str
) -> None:
    """What keeps `send` under its start-up target (bench/cli.py measures it)."""
    probe = (
        f"import sys; sys.argv = ['orchestrator', 'send', {JID!r}, 'probe']\n"
        "from orchestrator.cli.entry import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('sqlalchemy', 'alembic', 'celery', 'kombu', 'pydantic', 'pydantic_settings',"
        " 'typer', 'httpx', 'docker') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], env=_env(settings), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "via http://" in done.stderr
    assert "HEAVY []" in done.stdout, done.stdout
    assert _contents(db) == ["probe"]


def test_the_client_knows_the_final_run_states() -> None:
    from orchestrator.cli.send import _FINAL_STATES, _GOOD_ENDS
    from orchestrator.store.runs import FINAL_STATES, GOOD_ENDS

    assert _FINAL_STATES == FINAL_STATES
    assert _GOOD_ENDS == GOOD_ENDS


def test_wait_prints_the_agents_and_the_hosts_messages_only(
    db: Database, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli.send import _LocalChat, _print_replies
    from orchestrator.root import Orchestrator

    add_group(db, chat_jid=JID, name="Send", folder="send", requires_trigger=False)
    for i, (sender, message_type, from_me, words) in enumerate(
        [
            ("cli-user", "user", False, "a question"),
            ("bob", "user", False, "someone else"),
            ("host", "host", False, "a note"),
            ("bot", "assistant", True, "the answer"),
        ]
    ):
        store_message_direct(db=db, id=f"m{i}", chat_jid=JID, sender=sender, sender_name=sender, content=words,
                             timestamp=now_iso(), is_from_me=from_me, message_type=message_type)  # fmt: skip
    last = _print_replies(_LocalChat(Orchestrator(settings), JID), 0, "Robo", as_json=False)
    assert last == get_messages_after(JID, 0, db=db)[-1].seq
    printed = capsys.readouterr().out.splitlines()
    assert [line.split("]")[0] for line in printed] == ["[host", "[assistant"]
    assert "a note" in printed[0] and "the answer" in printed[1]
