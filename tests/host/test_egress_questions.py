"""The ``ask`` network policy (orchestrator/sandbox/egress_policy.py, orchestrator/run/questions.py):
a host off the list is refused at once and noted; the chat is asked once per host; only the
operator or the group's approvers may allow it; an Allow adds it to the group's allowlist
(nothing wakes), a Refuse or the clock leaves it refused."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from agent_runner.protocol import APPROVAL
from orchestrator.core.errors import NotAllowed
from orchestrator.core.settings import Settings
from orchestrator.run.profile import change_profile
from orchestrator.run.questions import answer_question, ask_about_egress, expire_due
from orchestrator.sandbox.config import parse_container_config
from orchestrator.sandbox.egress import EgressProxy
from orchestrator.sandbox.egress_policy import host_refusal, parse_network_option
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, get_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.questions import chat_questions, group_open_question
from tests.host.test_egress import raw

TEAM = "team@g.us"


@pytest.fixture(autouse=True)
def group(db: Database) -> None:
    add_group(db, chat_jid=TEAM, name="team", folder="team", requires_trigger=False)


def ask(db: Database, host: str = "pypi.org", port: int = 443) -> str | None:
    with db.transaction() as conn:
        asked = ask_about_egress(
            conn, db, chat_jid=TEAM, run_id="run-1", host=host, port=port, asked_at=db.now(), ttl_s=3600
        )
    return None if asked is None else asked[0].metadata["payload"]["question_id"]  # type: ignore[index]


def test_an_ask_policy_refuses_at_once_and_notes_the_host(tmp_path: Path) -> None:
    policy = parse_network_option("ask:files.internal.test")
    assert host_refusal(policy, "files.internal.test", 80) is None
    folder = tmp_path / "run"
    folder.mkdir()
    with EgressProxy(folder / "egress.sock", policy, resolver=lambda h, p: ["93.184.216.34"]) as proxy:
        reply = raw(proxy.socket_path, b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 403") and b"the chat is asked whether to allow it" in reply
    assert list(proxy.run.to_ask) == [("pypi.org", 443)]


def test_the_chat_is_asked_once_and_an_allow_opens_the_host(db: Database, settings: Settings) -> None:
    qid = ask(db)
    assert qid is not None and ask(db) is None  # one question per host while it is open
    (shown,) = [m for m in get_messages_after(TEAM, 0, db=db) if (m.metadata or {}).get("message_type") == APPROVAL]
    assert shown.message_type == "host" and "tried to reach pypi.org:443" in shown.content
    assert group_open_question(db, TEAM) is None  # not the group's: a reply or a trigger does not touch it
    # Nobody but the operator and the approvers opens the network.
    with pytest.raises(NotAllowed, match="none are named: the operator only"):
        answer_question(db, TEAM, "allow", by="U_ANYONE", by_name="Anyone", via="slack", question_id=qid)
    before = get_group(db, TEAM).pending_seq
    answered = answer_question(db, TEAM, "allow", via="cli", question_id=qid)
    assert answered.message.content.startswith("🌐 pypi.org is allowed for this group now")
    policy = parse_container_config(get_group(db, TEAM).container_config).egress
    assert (
        policy.allow == ["pypi.org"]
        and host_refusal(policy.model_copy(update={"mode": "ask"}), "pypi.org", 443) is None
    )
    assert get_group(db, TEAM).pending_seq == before  # nothing wakes: the agent retries in a later run


def test_approvers_may_refuse_and_the_clock_leaves_it_refused(db: Database, settings: Settings) -> None:
    change_profile(db, settings, TEAM, {"approvers": ["U_BOSS"]})
    first = ask(db, "example.com", 8443)
    answered = answer_question(db, TEAM, "2", by="U_BOSS", by_name="Boss", via="slack", question_id=first)
    assert answered.message.content == "🌐 example.com:8443 stays refused for this group (by Boss via slack)."
    assert get_group(db, TEAM).container_config is None
    second = ask(db, "example.org", 443)
    (late,) = chat_questions(db, TEAM, open_only=True)
    assert late.id == second
    (expired,) = expire_due(db, late.asked_at + timedelta(hours=2))
    assert expired.id == second
    notes = [m.content for m in get_messages_after(TEAM, 0, db=db) if m.message_type == "host"]
    assert notes[-1] == "🌐 No answer about example.org:443 (no answer within 1 h): it stays refused."
