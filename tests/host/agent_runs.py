"""Runs of a group's agent through the pipeline with the fake sandbox: the main group and one
ordinary group, and a message answered by a scripted agent (the agent-tool tests' setting)."""

from __future__ import annotations

from agent_runner.protocol import Event, ResultEvent, Usage
from fakes.clock import FakeClock
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, ensure_main_group

MAIN, TEAM = "main@local", "team@g.us"


def main_and_team(db: Database) -> None:
    ensure_main_group(db)
    add_group(db, chat_jid=TEAM, name="team", folder="team", requires_trigger=False)


def play(settings: Settings, db: Database, jid: str, *events: Event, content: str = "go") -> None:
    """``content`` from a person in ``jid``, answered by an agent that emits ``events``."""
    ingest(db, settings, IncomingMessage(chat_jid=jid, sender="u", content=content), signal=None)
    sandbox = FakeSandbox(Script([*events, ResultEvent(usage=Usage())]))
    Pipeline(settings, db, ChannelRegistry([]), sandbox, clock=FakeClock()).drain_group(jid)
