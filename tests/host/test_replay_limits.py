"""Replays under the group's quotas and the fleet's run cap, on both databases.

A replay is spent on the group's behalf and runs a container like any run: it
used to skip both, so an operator (or a script on the API) could run past the
quotas and fill every machine's run slots while the chats waited.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from fakes.sandbox import FakeSandbox
from orchestrator.core.errors import FleetFull, ReplayLimited
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.root import Orchestrator
from orchestrator.run.replay import create_replay, execute_replay
from orchestrator.store.db import Database
from orchestrator.store.hosts import process_owner
from orchestrator.store.runs import create_run, list_runs
from orchestrator.store.slots import fleet_slots, take_replay_slot, take_slot
from tests.host.test_replay import JID, ORIGINAL, REPLAYED, _chat


def test_a_replay_counts_against_the_groups_quota_and_is_refused_past_it(settings: Settings, db: Database) -> None:
    sandbox = FakeSandbox(ORIGINAL, REPLAYED)
    _, original = _chat(settings, db, sandbox)
    two_an_hour = settings.replace(group_runs_per_hour=2)
    first = create_replay(db, two_an_hour, original, "offline")  # the original and this one: two runs this hour
    with pytest.raises(ReplayLimited, match=r"used 2 of its 2 runs in the last hour.*try again after") as refused:
        create_replay(db, two_an_hour, original, "offline")
    assert 3500 < refused.value.retry_after_s <= 3600
    assert [r.id for r in list_runs(db, chat_jid=JID) if r.replay_of] == [first.id]  # nothing made
    # The API says so with a 429 and when to come back.
    root = Orchestrator(two_an_hour)
    root.signals.replay = lambda run_id, chat_jid: "task"  # type: ignore[method-assign]
    client = TestClient(create_app(root), headers={"X-Orchestrator-Client": "tests"})
    r = client.post(f"/api/runs/{original}/replay", json={"model": "offline"})
    assert r.status_code == 429, r.text
    assert 3500 < int(r.headers["Retry-After"]) <= 3600 and "runs in the last hour" in r.json()["detail"]
    # Tokens per day too.
    with pytest.raises(ReplayLimited, match="model tokens today"):
        create_replay(db, settings.replace(group_tokens_per_day=50), original, "offline")


def test_a_replay_takes_a_run_slot_behind_the_chats(settings: Settings, db: Database) -> None:
    sandbox = FakeSandbox(ORIGINAL, REPLAYED, REPLAYED)
    _, original = _chat(settings, db, sandbox)
    one_slot = settings.replace(max_concurrent_runs=1)
    # A chat's run holds the only slot: the replay is refused when a worker would start it.
    busy = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=0, celery_task_id=None, owner="someone")
    replay = create_replay(db, one_slot, original, "offline")
    assert fleet_slots(db, 1).running == 1  # queued, the replay holds no slot yet
    ended = execute_replay(db, one_slot, sandbox, replay.id)
    assert ended.state == "failed" and "run slots are taken (1 of 1 running" in (ended.error or "")
    assert len(sandbox.started) == 1  # only the original ran
    # The slot free, a replay takes it, and a chat's run then waits for it.
    from orchestrator.store.runs import finish_run

    finish_run(db, busy.id, state="succeeded")
    waiting = create_replay(db, one_slot, original, "offline")
    assert take_replay_slot(db, 1, run_id=waiting.id, owner=process_owner("here"))
    assert fleet_slots(db, 1).running == 1
    with pytest.raises(FleetFull):
        take_slot(db, 1, chat_jid=JID, cursor_from=0, cursor_to=0, celery_task_id=None)
    # Taken once: a second start (the task delivered twice) finds it taken.
    assert not take_replay_slot(db, 1, run_id=waiting.id, owner=process_owner("there"))
