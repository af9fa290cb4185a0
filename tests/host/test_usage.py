"""Quotas and rate limits (orchestrator/store/usage.py) on both databases: a group's
runs per hour and tokens per day counted on the database's clock (rows set back
with UPDATEs, never a sleep), defaults and per-group overrides, when a waiting
quota frees and the 🏠 message saying so; the sender rate limit in ingest, over
HTTP (429 + Retry-After), over the inbound webhook and on Telegram; the
``groups usage`` / ``groups set`` commands; migration 0008."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import inspect, select, text, update

from fakes.telegram_api import FakeTelegramAPI
from orchestrator.channels.telegram_poller import TelegramPoller
from orchestrator.channels.webhook import INBOUND_PATH, inbound_headers
from orchestrator.core.errors import RateLimited
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.http.endpoint import CLIENT_HEADER
from orchestrator.root import Orchestrator
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import SCHEMA_HEAD, Database
from orchestrator.store.deliveries import list_deliveries
from orchestrator.store.groups import Group, add_group, get_group, update_group
from orchestrator.store.hosts import database_now
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import create_run, finish_run
from orchestrator.store.tables import RunRow, SenderHitRow
from orchestrator.store.usage import (
    RATE_WINDOW_S,
    group_usage,
    quota_message,
    quota_wait,
    store_quota_notice,
)
from tests.conftest import TEST_ENV, alembic, run_in_threads

JID = "team@chat"


@pytest.fixture
def group(db: Database) -> Group:
    return add_group(db, chat_jid=JID, name="Team", folder="team", requires_trigger=False)


def _run(
    db: Database,
    age: timedelta | None = None,
    *,
    tokens: tuple[int, int] = (0, 0),
    at: datetime | None = None,
    chat_jid: str = JID,
) -> str:
    """A finished run of the group, started ``age`` ago by the database's clock (or ``at``)."""
    run = create_run(db, chat_jid=chat_jid, cursor_from=0, cursor_to=0, celery_task_id=None)
    finish_run(db, run.id, state="succeeded", input_tokens=tokens[0], output_tokens=tokens[1])
    if age is not None or at is not None:
        when = at if at is not None else database_now(db) - (age or timedelta())
        with db.write() as session:
            session.execute(update(RunRow).where(RunRow.id == run.id).values(created_at=when))
    return run.id


def _today(db: Database, age: timedelta) -> timedelta:
    """``age``, or less when the UTC day is younger: so the run's tokens count today."""
    now = database_now(db)
    return min(age, (now - now.replace(hour=0, minute=0, second=0, microsecond=0)) / 2)


def _latest_run(db: Database) -> str:
    with db.read() as session:
        return session.execute(select(RunRow.id).order_by(RunRow.created_at.desc()).limit(1)).scalar_one()


def _created(db: Database, run_id: str) -> datetime:
    with db.read() as session:
        return session.execute(select(RunRow.created_at).where(RunRow.id == run_id)).scalar_one()


# -- a group's quotas ---------------------------------------------------------------------


def test_runs_are_counted_over_the_last_hour_on_the_databases_clock(
    db: Database, settings: Settings, group: Group
) -> None:
    _run(db, timedelta(minutes=61))
    _run(db, timedelta(minutes=59))
    _run(db)
    _run(db, timedelta(minutes=1), chat_jid="other@chat")  # another group's
    u = group_usage(db, settings, group)
    assert (u.runs_last_hour, u.runs_per_hour, u.waiting) == (2, 0, None)
    assert abs((u.now - database_now(db)).total_seconds()) < 5


def test_tokens_are_counted_since_midnight_utc(db: Database, settings: Settings, group: Group) -> None:
    now = database_now(db)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    _run(db, at=midnight - timedelta(microseconds=1), tokens=(10_000, 10_000))  # yesterday's
    _run(db, at=midnight, tokens=(300, 200))
    _run(db, tokens=(40, 60))
    u = group_usage(db, settings, group)
    assert u.tokens_today == 600 and u.tokens_per_day == 0


def test_the_runs_quota_waits_for_the_oldest_run_of_the_hour(db: Database, settings: Settings, group: Group) -> None:
    limited = settings.replace(group_runs_per_hour=2)
    first = _run(db, timedelta(minutes=50))
    assert quota_wait(db, limited, group) is None  # one of two
    _run(db, timedelta(minutes=10))
    wait = quota_wait(db, limited, group)
    assert wait is not None and (wait.quota, wait.limit, wait.used) == ("runs_per_hour", 2, 2)
    assert wait.until == _created(db, first) + timedelta(hours=1)
    assert 9 * 60 < wait.wait_s <= 10 * 60 + 5  # the 50-minute-old run leaves the hour in 10 minutes
    # Once that run is over an hour old, the next may start.
    with db.write() as session:
        session.execute(
            update(RunRow).where(RunRow.id == first).values(created_at=database_now(db) - timedelta(minutes=61))
        )
    assert quota_wait(db, limited, group) is None


def test_a_group_override_wins_over_the_setting(db: Database, settings: Settings, group: Group) -> None:
    limited = settings.replace(group_runs_per_hour=2)
    _run(db, timedelta(minutes=50))
    second = _run(db, timedelta(minutes=10))
    third = _run(db, timedelta(minutes=5))
    wait = quota_wait(db, limited, group)
    # Three runs in the hour, two allowed: two must leave it, the 10-minute-old one last.
    assert wait is not None and wait.until == _created(db, second) + timedelta(hours=1)
    # The group's own 0: no limit, whatever the setting.
    unlimited = update_group(db, JID, {"runs_per_hour": 0})
    assert quota_wait(db, limited, unlimited) is None
    assert group_usage(db, limited, unlimited).runs_per_hour == 0
    # Its own 1 with three runs in the hour: all three must leave it, the 5-minute-old one last.
    strict = update_group(db, JID, {"runs_per_hour": 1})
    wait = quota_wait(db, settings, strict)  # the setting is 0 here: the group's own applies
    assert wait is not None and wait.limit == 1 and wait.used == 3
    assert wait.until == _created(db, third) + timedelta(hours=1)
    roomy = update_group(db, JID, {"runs_per_hour": 4})
    assert quota_wait(db, limited, roomy) is None
    back = update_group(db, JID, {"runs_per_hour": None})  # null: the setting again
    assert back.runs_per_hour is None and quota_wait(db, limited, back) is not None


def test_the_tokens_quota_frees_at_the_next_utc_midnight(db: Database, settings: Settings, group: Group) -> None:
    _run(db, tokens=(600, 300))
    assert quota_wait(db, settings.replace(group_tokens_per_day=1000), group) is None
    _run(db, tokens=(50, 50))
    wait = quota_wait(db, settings.replace(group_tokens_per_day=1000), group)
    assert wait is not None and (wait.quota, wait.limit, wait.used) == ("tokens_per_day", 1000, 1000)
    midnight = wait.now.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    assert wait.until == midnight and wait.wait_s == pytest.approx((midnight - wait.now).total_seconds())
    # The group's own quota instead of the setting's.
    own = update_group(db, JID, {"tokens_per_day": 5000})
    assert quota_wait(db, settings.replace(group_tokens_per_day=1000), own) is None
    assert quota_wait(db, settings, update_group(db, JID, {"tokens_per_day": 900})) is not None


def test_over_both_quotas_the_later_one_decides(db: Database, settings: Settings, group: Group) -> None:
    _run(db, timedelta(minutes=30), tokens=(100, 0))
    both = settings.replace(group_runs_per_hour=1, group_tokens_per_day=100)
    u = group_usage(db, both, group)
    today = u.now.replace(hour=0, minute=0, second=0, microsecond=0)
    created = _created(db, _latest_run(db))
    runs_free = created + timedelta(hours=1)
    if created < today:  # the first half hour of the UTC day: yesterday's tokens do not count
        assert u.waiting is not None and (u.waiting.quota, u.waiting.until) == ("runs_per_hour", runs_free)
        return
    # Tokens, unless the test runs in the last half hour of the UTC day.
    midnight = today + timedelta(days=1)
    assert u.waiting is not None and u.waiting.until == max(midnight, runs_free)
    assert u.waiting.quota == ("tokens_per_day" if midnight >= runs_free else "runs_per_hour")


def test_the_host_message_says_which_quota_and_when(db: Database, settings: Settings, group: Group) -> None:
    _run(db, timedelta(minutes=20))
    wait = quota_wait(db, settings.replace(group_runs_per_hour=1), group)
    assert wait is not None
    text_ = quota_message(wait)
    # Rounded up to the minute: never earlier than the run may start.
    shown = (
        (wait.until + timedelta(minutes=1)).replace(second=0, microsecond=0)
        if (wait.until.second, wait.until.microsecond) != (0, 0)
        else wait.until
    )
    assert text_.startswith(
        f"⏳ This group reached its quota of 1 run per hour; the next run starts at {shown:%H:%M} UTC"
    ), text_
    _run(db, tokens=(70_000, 30_000))
    tokens = quota_wait(db, settings.replace(group_tokens_per_day=100_000), group)
    assert tokens is not None
    assert "used its quota of 100,000 model tokens for today (UTC)" in quota_message(tokens)
    assert "00:00 UTC tomorrow" in quota_message(tokens)

    # Stored once per wait (a re-check finds it there), as a host message with its deliveries.
    attach_channel(db, JID, "log")
    stored = store_quota_notice(db, JID, wait)
    assert stored is not None and stored.message_type == "host" and stored.content == text_
    assert store_quota_notice(db, JID, wait) is None
    assert [m.id for m in get_messages_after(JID, 0, db=db)] == [wait.notice_id]
    assert [d.channel for d in list_deliveries(db, message_seq=stored.seq)] == ["log"]


def test_no_quota_no_wait(db: Database, settings: Settings, group: Group) -> None:
    for _ in range(5):
        _run(db, tokens=(10**6, 10**6))
    assert quota_wait(db, settings, group) is None
    u = group_usage(db, settings, group)
    assert (u.runs_last_hour, u.tokens_today, u.waiting) == (5, 5 * 2 * 10**6, None)


# -- the sender rate limit at ingest ------------------------------------------------------


def _say(db: Database, settings: Settings, sender: str = "ann", chat_jid: str = JID, **kw: object) -> object:
    msg = IncomingMessage(chat_jid=chat_jid, sender=sender, content="hi", **kw)  # type: ignore[arg-type]
    return ingest(db, settings, msg, signal=None)


def _age_hits(db: Database, seconds: float) -> None:
    """Move every sender hit ``seconds`` into the past (the database's clock)."""
    with db.write() as session:
        for hit_id, at in session.execute(select(SenderHitRow.id, SenderHitRow.at)).all():
            session.execute(
                update(SenderHitRow).where(SenderHitRow.id == hit_id).values(at=at - timedelta(seconds=seconds))
            )


def test_a_sender_over_its_rate_is_refused_and_nothing_is_stored(
    db: Database, settings: Settings, group: Group
) -> None:
    limited = settings.replace(sender_messages_per_minute=3)
    for _ in range(3):
        _say(db, limited)
    with pytest.raises(RateLimited) as refused:
        _say(db, limited, id="fourth")
    assert 55 <= refused.value.retry_after_s <= RATE_WINDOW_S
    assert "slow down" in str(refused.value) and "try again in" in str(refused.value)
    assert len(get_messages_after(JID, 0, db=db)) == 3
    # Others are not held back: another sender, the same sender in another chat.
    _say(db, limited, sender="bob")
    _say(db, limited, chat_jid="other@chat")
    # The harness's own senders and our own messages are never limited.
    for _ in range(5):
        _say(db, limited, sender="deploy")
        _say(db, limited, sender="bot", message_type="assistant")
        _say(db, limited, sender="ann", is_from_me=True)
    # A message already stored is answered as the duplicate it is, never refused.
    first = get_messages_after(JID, 0, db=db)[0]
    again = ingest(db, limited, IncomingMessage(id=first.id, chat_jid=JID, sender="ann", content="hi"), signal=None)
    assert not again.created and again.message.seq == first.seq


def test_the_window_is_the_last_minute_on_the_databases_clock(db: Database, settings: Settings, group: Group) -> None:
    limited = settings.replace(sender_messages_per_minute=2)
    _say(db, limited)
    _age_hits(db, 50)
    _say(db, limited)
    with pytest.raises(RateLimited) as refused:
        _say(db, limited)
    assert 9 <= refused.value.retry_after_s <= 11  # the 50-second-old one leaves the window in ~10 s
    _age_hits(db, 11)  # now 61 s and 11 s old: one left in the window
    _say(db, limited)
    with pytest.raises(RateLimited):
        _say(db, limited)
    # Old hits are pruned as new ones come: never more than the window holds.
    with db.read() as session:
        assert session.execute(select(SenderHitRow.id)).all().__len__() == 2


def test_no_limit_writes_nothing(db: Database, settings: Settings, group: Group) -> None:
    assert settings.quotas.sender_messages_per_minute == 0  # the default: off
    for _ in range(100):
        _say(db, settings)
    with db.read() as session:
        assert session.execute(select(SenderHitRow.id)).first() is None


def test_concurrent_messages_of_one_sender_never_pass_the_limit(db: Database, settings: Settings, group: Group) -> None:
    limited = settings.replace(sender_messages_per_minute=3)
    refused: list[RateLimited] = []

    def send(i: int) -> None:
        try:
            _say(db, limited, id=f"m-{i}")
        except RateLimited as exc:
            refused.append(exc)

    assert run_in_threads(send, 8) == []
    assert len(get_messages_after(JID, 0, db=db)) == 3 and len(refused) == 5


# -- HTTP, webhook, Telegram --------------------------------------------------------------


@pytest.fixture
def client(db: Database, settings: Settings, group: Group) -> Iterator[TestClient]:
    app_settings = settings.replace(
        sender_messages_per_minute=2, group_runs_per_hour=5, webhook_inbound_secret="s3cret"
    )
    with TestClient(create_app(Orchestrator(app_settings)), headers={CLIENT_HEADER: "tests"}) as c:
        yield c


def test_the_api_answers_429_with_retry_after(client: TestClient, db: Database) -> None:
    body = {"chat_jid": JID, "sender": "web:Ann", "content": "hi"}
    assert [client.post("/api/messages", json=body).status_code for _ in range(2)] == [201, 201]
    r = client.post("/api/messages", json=body)
    assert r.status_code == 429, r.text
    assert 1 <= int(r.headers["retry-after"]) <= 60 and r.json()["retry_after_s"] == int(r.headers["retry-after"])
    assert "slow down" in r.json()["detail"]
    assert len(get_messages_after(JID, 0, db=db)) == 2
    # Listed in the OpenAPI document, with its header.
    doc = client.get("/openapi.json").json()
    listed = doc["paths"]["/api/messages"]["post"]["responses"]["429"]
    assert "Retry-After" in listed["headers"]
    assert "429" in doc["paths"][INBOUND_PATH]["post"]["responses"]


def test_the_inbound_webhook_answers_429(client: TestClient, db: Database) -> None:
    def post() -> int:
        raw = json.dumps({"chat_jid": JID, "sender": "hook", "content": "ping"}).encode()
        r = client.post(
            INBOUND_PATH, content=raw, headers={**inbound_headers("s3cret", raw), "content-type": "application/json"}
        )
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
        return r.status_code

    assert [post() for _ in range(3)] == [201, 201, 429]


def test_usage_and_quotas_over_http(client: TestClient, db: Database) -> None:
    _run(db, tokens=(5, 7))
    u = client.get(f"/api/groups/{JID}/usage").json()
    assert (
        u["runs_last_hour"],
        u["runs_per_hour"],
        u["runs_per_hour_override"],
        u["tokens_today"],
        u["tokens_per_day"],
        u["sender_messages_per_minute"],
        u["waiting"],
    ) == (1, 5, None, 12, 0, 2, None)
    r = client.patch(f"/api/groups/{JID}", json={"runs_per_hour": 1, "tokens_per_day": 1000})
    assert r.status_code == 200 and (r.json()["runs_per_hour"], r.json()["tokens_per_day"]) == (1, 1000)
    waiting = client.get(f"/api/groups/{JID}/usage").json()["waiting"]
    assert waiting["quota"] == "runs_per_hour" and waiting["limit"] == 1 and 3500 < waiting["wait_s"] <= 3600
    for bad in (
        {"runs_per_hour": -1},
        {"runs_per_hour": "3"},
        {"runs_per_hour": True},
        {"tokens_per_day": 1.5},
        {"tokens_per_day": 2**31},
    ):
        r = client.patch(f"/api/groups/{JID}", json=bad)
        assert r.status_code == 400 and r.json()["field"] == next(iter(bad)), (bad, r.text)
    assert client.patch(f"/api/groups/{JID}", json={"runs_per_hour": None}).json()["runs_per_hour"] is None
    assert client.get("/api/groups/nobody@chat/usage").status_code == 404
    assert "/api/groups/{chat_jid}/usage" in client.get("/openapi.json").json()["paths"]


def test_telegram_tells_a_fast_sender_to_slow_down_once(db: Database, settings: Settings, group: Group) -> None:
    tg_chat = -100123
    attach_channel(db, JID, "telegram", address=str(tg_chat))
    with FakeTelegramAPI() as fake:
        tg = settings.replace(telegram_bot_token=fake.token, telegram_api_base=fake.base, sender_messages_per_minute=2)
        poller = TelegramPoller(db, tg)
        try:
            for i in range(4):
                fake.push_text(tg_chat, 42, f"message {i}")
            fake.push_text(tg_chat, 43, "someone else")
            stored = poller.poll_once()
        finally:
            poller.close()
        assert [r.message.content for r in stored] == ["message 0", "message 1", "someone else"]
        [(chat, said)] = fake.sent()  # one reply for the two refused messages
        assert chat == str(tg_chat) and said.startswith("⏳ slow down: try again in ")
        reply = fake.calls("sendMessage", ok_only=True)[0].params
        assert json.loads(reply["reply_parameters"])["message_id"] == 3  # the first refused message
    assert [m.content for m in get_messages_after(JID, 0, db=db)] == ["message 0", "message 1", "someone else"]


# -- the CLI ------------------------------------------------------------------------------


def _cli(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")} | TEST_ENV
    base |= {"ORCHESTRATOR_DATA_DIR": str(settings.data_dir), "ORCHESTRATOR_DATABASE_URL": settings.database_url}
    cli = str(Path(sys.executable).parent / "orchestrator")
    return subprocess.run([cli, *args], env=base | env, capture_output=True, text=True, timeout=120)


def test_groups_usage_and_set_on_the_command_line(db: Database, settings: Settings, group: Group) -> None:
    _run(db, _today(db, timedelta(minutes=30)), tokens=(1200, 34))
    shown = _cli(
        settings,
        "groups",
        "usage",
        JID,
        ORCHESTRATOR_GROUP_RUNS_PER_HOUR="10",
        ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE="20",
    )
    assert shown.returncode == 0, shown.stderr
    assert "runs in the last hour: 1 of 10 (the setting's)" in shown.stdout
    assert "tokens today (UTC):    1,234, no limit (the setting's)" in shown.stdout
    assert "messages per sender:   20 per minute" in shown.stdout and "next run: now" in shown.stdout

    done = _cli(settings, "groups", "set", JID, "--runs-per-hour", "1", "--tokens-per-day", "0")
    assert done.returncode == 0, done.stderr
    assert "runs per hour 1, tokens per day no limit" in done.stdout and "container_config" not in done.stdout
    assert (get_group(db, JID).runs_per_hour, get_group(db, JID).tokens_per_day) == (1, 0)
    waiting = _cli(settings, "groups", "usage", JID, "--json")
    assert waiting.returncode == 0, waiting.stderr
    doc = json.loads(waiting.stdout)
    assert doc["runs_per_hour_override"] == 1 and doc["waiting"]["quota"] == "runs_per_hour"
    assert "waits for runs per hour (1 of 1) until" in _cli(settings, "groups", "usage", JID).stdout

    assert _cli(settings, "groups", "set", JID, "--runs-per-hour", "default").returncode == 0
    assert get_group(db, JID).runs_per_hour is None
    for bad in (["--runs-per-hour", "-1"], ["--tokens-per-day", "lots"], []):
        r = _cli(settings, "groups", "set", JID, *bad)
        assert r.returncode == 1 and r.stderr.startswith("error: ") and len(r.stderr.splitlines()) == 1, r.stderr
    missing = _cli(settings, "groups", "usage", "nobody@chat")
    assert missing.returncode == 1 and "no registered group" in missing.stderr


def test_cli_send_over_the_rate_is_a_one_line_error(db: Database, settings: Settings, group: Group) -> None:
    env = {"ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE": "1"}
    assert _cli(settings, "send", JID, "one", **env).returncode == 0
    refused = _cli(settings, "send", JID, "two", **env)
    assert refused.returncode == 1 and refused.stderr.startswith("error: slow down: 'cli-user' sent 1 messages")
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


# -- migration 0008 -----------------------------------------------------------------------


def test_migration_0008_adds_the_quotas_and_the_senders_window(db: Database) -> None:
    assert int(SCHEMA_HEAD) >= 8  # the later revisions come down with it
    alembic(db, "downgrade", "0007")
    names = inspect(db.engine)
    assert "sender_hits" not in names.get_table_names()
    assert "runs_per_hour" not in {c["name"] for c in names.get_columns("groups")}
    with db.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO groups (chat_jid, name, folder, is_main, requires_trigger, cursor_seq, "
                "pending_seq, created_at) VALUES ('old@chat', 'Old', 'old', false, true, 0, 0, "
                "CURRENT_TIMESTAMP)"
            )
        )
    alembic(db, "upgrade", "head")
    assert db.schema_revision() == SCHEMA_HEAD
    old = get_group(db, "old@chat")
    assert (old.runs_per_hour, old.tokens_per_day) == (None, None)  # the settings' quotas
    indexes = {i["name"] for i in inspect(db.engine).get_indexes("runs")}
    assert "idx_runs_chat_created" in indexes
    assert {i["name"] for i in inspect(db.engine).get_indexes("sender_hits")} == {"idx_sender_hits_window"}
