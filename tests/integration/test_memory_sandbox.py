"""Memory and instructions through a real container: a line the agent writes to MEMORY.md in
one run is in the next run's system prompt, after the installation's instructions (the
offline model's ``/write`` and ``/system``, the real agent image)."""

from __future__ import annotations

from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.instructions import write_instructions
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after

JID = "main@local"


def test_memory_written_in_one_run_is_in_the_next_runs_prompt(
    settings: Settings, db: Database, agent_image: str
) -> None:
    s = settings.replace(agent_image=agent_image, run_timeout_s=30.0)
    s.ensure_dirs()
    ensure_main_group(db)
    write_instructions(s, None, "Always answer kindly.")
    p = Pipeline(s, db, ChannelRegistry([]))
    for text in ("/write MEMORY.md\n- the standup is at 9:30\n/end", "/system"):
        ingest(db, s, IncomingMessage(chat_jid=JID, sender="u", content=text), signal=None)
        assert [o.run.state for o in p.drain_group(JID)] == ["succeeded"]
    prompt = [m.content for m in get_messages_after(JID, 0, db=db) if m.sender == "bot"][-1]
    assert (
        prompt.index("Always answer kindly.") < prompt.index("## Your memory") < prompt.index("the standup is at 9:30")
    )
