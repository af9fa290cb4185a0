"""send_message: the agent posts during a run; the host decides where it may.

Real Docker, the real agent image (offline model directives ``/send`` and
``/send-to``) and the faulty front end that forges the event past the
runner's own check, so the host's enforcement is what is tested.
"""

from __future__ import annotations

import pytest

from fakes.channel import RecordingChannel, attach_recorder
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, ensure_main_group
from orchestrator.store.message_log import get_messages_after

TEAM = "team@g.us"


def _pipeline(settings: Settings, db: Database, image: str) -> tuple[Pipeline, RecordingChannel]:
    s = settings.replace(**{"agent_image": image, "run_timeout_s": 30.0})
    s.ensure_dirs()
    ensure_main_group(db)
    add_group(db, chat_jid=TEAM, name="team", folder="team", requires_trigger=False)
    rec = attach_recorder(db, "main@local", TEAM)
    return Pipeline(s, db, ChannelRegistry([rec])), rec


def _run(p: Pipeline, jid: str, text: str) -> None:
    ingest(p.db, p.settings, IncomingMessage(chat_jid=jid, sender="u", content=text), signal=None)
    outcomes = p.drain_group(jid)
    assert [o.run.state for o in outcomes] == ["succeeded"]


def _bot_texts(db: Database, jid: str) -> list[str]:
    return [m.content for m in get_messages_after(jid, 0, db=db) if m.sender == "bot"]


def test_a_group_posts_to_its_own_chat_and_main_to_any(settings: Settings, db: Database, agent_image: str) -> None:
    p, rec = _pipeline(settings, db, agent_image)
    _run(p, TEAM, "/send working on it")
    assert _bot_texts(db, TEAM)[0] == "working on it"
    _run(p, "main@local", f"/send-to {TEAM} deploy finished")
    posted = [m for m in get_messages_after(TEAM, 0, db=db) if m.content == "deploy finished"]
    assert len(posted) == 1
    assert posted[0].message_type == "assistant" and posted[0].is_from_me
    assert posted[0].metadata["via"] == "send_message" and posted[0].metadata["from_chat"] == "main@local"
    assert any(m.content == "deploy finished" and m.chat_jid == TEAM for m in rec.sent)  # delivered


def test_a_non_main_group_cannot_post_elsewhere(settings: Settings, db: Database, agent_image: str) -> None:
    p, _ = _pipeline(settings, db, agent_image)
    # The runner refuses early, and says so to the model.
    _run(p, TEAM, "/send-to main@local hello main")
    results = [m for m in get_messages_after(TEAM, 0, db=db) if m.message_type == "tool_result"]
    assert results[0].metadata["exit_code"] == 1 and "may not post to 'main@local'" in results[0].content
    assert [m for m in get_messages_after("main@local", 0, db=db) if m.content == "hello main"] == []


@pytest.mark.parametrize("target", ["main@local", "stranger@g.us"])
def test_the_host_refuses_a_forged_send(settings: Settings, db: Database, faulty_image: str, target: str) -> None:
    p, _ = _pipeline(settings, db, faulty_image)
    _run(p, TEAM, f"forge-send {target}")
    assert [m for m in get_messages_after(target, 0, db=db) if "forged" in m.content] == []
    hosts = [m.content for m in get_messages_after(TEAM, 0, db=db) if m.message_type == "host"]
    assert hosts == [
        f"🚫 send_message refused: a non-main group may only post to its own chat ({TEAM}), not {target!r}"
    ]


def test_main_cannot_post_to_an_unregistered_chat(settings: Settings, db: Database, faulty_image: str) -> None:
    p, _ = _pipeline(settings, db, faulty_image)
    _run(p, "main@local", "forge-send stranger@g.us")
    assert get_messages_after("stranger@g.us", 0, db=db) == []
    hosts = [m.content for m in get_messages_after("main@local", 0, db=db) if m.message_type == "host"]
    assert hosts == ["🚫 send_message refused: 'stranger@g.us' is not a registered chat"]
