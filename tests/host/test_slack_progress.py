"""A run's "working..." message on Slack, on both databases: the real pipeline with a fake
sandbox (``fakes/sandbox.py``) streaming a reply, the Slack channel delivering it to
a fake Slack on loopback, and :class:`WorkingMessages` following the run as the other
processes do (the runs table and the run's draft): posted in the thread the run answers,
updated in place with the reply being written, deleted once the reply is out or the run
ended without one, kept across a restart of the follower, put off by a 429."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from agent_runner.protocol import AssistantEvent, ResultEvent, TextDeltaEvent
from fakes.clock import FakeClock
from fakes.sandbox import FakeSandbox, Script
from fakes.slack_api import FakeSlack, Post, fake_slack  # noqa: F401 - the fixture "fake"
from orchestrator.channels.slack import SlackChannel, SlackWeb
from orchestrator.channels.slack_inbound import SlackInbound
from orchestrator.channels.slack_progress import WorkingMessages
from orchestrator.core.settings import Settings
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.runs import create_run, finish_run
from orchestrator.store.tables import RunRow

JID = "main@local"
SLACK_CHANNEL = "C0MAIN0001"
THREAD = "1700000000.000100"


class Ticks:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def sl(db: Database, settings: Settings, fake: FakeSlack) -> tuple[Database, Settings]:
    ensure_main_group(db)
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    return db, settings.replace(
        slack_bot_token=fake.bot_token, slack_api_base=fake.base, max_attempts=1, slack_progress_interval_s=2.0
    )


def _ask(db: Database, settings: Settings, fake: FakeSlack, text: str, *, thread: str | None = THREAD) -> int:
    """A person's message from Slack, taken in as the Events API and Socket Mode take it."""
    inbound = SlackInbound(db, settings, web=SlackWeb(settings))
    result = inbound.take(fake.message_event(SLACK_CHANNEL, "UANN0001", text, thread_ts=thread))
    assert result is not None and result.created
    return result.message.seq


def _running(db: Database, cursor_to: int) -> str:
    """A run that a worker started (the state the pipeline gives it), without an agent."""
    run = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=cursor_to, celery_task_id=None)
    with db.write() as session:
        session.execute(update(RunRow).where(RunRow.id == run.id).values(state="running"))
    return run.id


def _texts(post: Post) -> list[str]:
    return [b["text"]["text"] if b["type"] == "section" else b["elements"][0]["text"] for b in post.blocks]


def test_the_working_message_follows_the_run_and_gives_way_to_the_reply(
    sl: tuple[Database, Settings],
    fake: FakeSlack,
) -> None:
    db, settings = sl
    ticks = Ticks()
    follower = WorkingMessages(db, settings, SlackWeb(settings), clock=ticks)
    seen: dict[int, list[Post]] = {}

    def look(i: int) -> None:
        if i in (0, 2, 3):
            ticks.now += 3  # past the update interval each time
            follower.tick()
            seen[i] = [Post(**vars(p)) for p in fake.posts]

    events = [
        TextDeltaEvent(block="1.0", text="Hello <!here> "),
        TextDeltaEvent(block="1.0", text="wor"),
        AssistantEvent(text="Hello <!here> world"),
        ResultEvent(num_turns=1),
    ]
    slack = SlackChannel(settings, db=db)
    pipeline = Pipeline(
        settings, db, ChannelRegistry([slack]), FakeSandbox(Script(events, before_event=look)), clock=FakeClock()
    )
    _ask(db, settings, fake, "@Andy say hello")
    pipeline.drain_group(JID)

    # Before the agent wrote anything: "working…", in the thread the question was asked in.
    [working] = seen[0]
    assert working.thread_ts == THREAD and working.channel == SLACK_CHANNEL
    assert _texts(working) == ["⏳ Andy is working… (0 s)"]
    # While the reply is written: the same message, updated in place with it (escaped).
    [updated] = seen[2]
    assert updated.ts == working.ts and updated.updates == 1
    assert _texts(updated)[0] == "⏳ Andy is working… (3 s)"
    assert _texts(updated)[1].startswith("Hello &lt;!here&gt; ")
    # The reply is out (delivered by the pipeline, in the thread): the working message is gone.
    assert [p.deleted for p in seen[3]] == [True, False]
    reply = seen[3][1]
    assert reply.thread_ts == THREAD and _texts(reply) == ["Hello &lt;!here&gt; world"]
    assert [r.method for r in fake.requests if r.method.startswith("chat.")] == [
        "chat.postMessage",
        "chat.update",
        "chat.postMessage",
        "chat.delete",
    ]
    assert follower.posts == {}
    calls = len(fake.requests)
    follower.tick()  # nothing more to do once the run ended
    assert len(fake.requests) == calls


def test_a_run_without_a_reply_leaves_no_working_message(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    db, settings = sl
    ticks = Ticks()
    follower = WorkingMessages(db, settings, SlackWeb(settings), clock=ticks)
    seq = _ask(db, settings, fake, "@Andy hello", thread=None)
    run_id = _running(db, seq)
    follower.tick()
    [working] = fake.live_posts()
    assert working.thread_ts is None  # asked at the top: answered at the top
    finish_run(db, run_id, state="failed", error="the agent crashed")
    follower.tick()
    assert fake.live_posts() == [] and follower.posts == {}


def test_a_restarted_follower_finishes_what_the_last_one_posted(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    db, settings = sl
    seq = _ask(db, settings, fake, "@Andy hello")
    run_id = _running(db, seq)
    WorkingMessages(db, settings, SlackWeb(settings)).tick()
    assert len(fake.live_posts()) == 1
    again = WorkingMessages(db, settings, SlackWeb(settings))  # a new process: read from the data dir
    again.tick()
    assert len(fake.calls("chat.postMessage")) == 1  # not posted twice
    finish_run(db, run_id, state="succeeded")
    again.tick()
    assert fake.live_posts() == []


def test_a_rate_limited_update_waits_for_retry_after(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    db, settings = sl
    ticks = Ticks()
    follower = WorkingMessages(db, settings, SlackWeb(settings), clock=ticks)
    seq = _ask(db, settings, fake, "@Andy hello")
    _running(db, seq)
    fake.fail("chat.postMessage", 500)
    follower.tick()
    assert fake.live_posts() == []  # a failed post: tried again after the interval, not at every look
    follower.tick()
    assert len(fake.calls("chat.postMessage")) == 1
    ticks.now += 2
    follower.tick()
    assert len(fake.live_posts()) == 1
    fake.fail("chat.update", 429, retry_after=30)
    ticks.now += 2
    follower.tick()
    assert [r.status for r in fake.calls("chat.update")] == [429]
    ticks.now += 20  # the interval passed many times over, Retry-After did not
    follower.tick()
    assert len(fake.calls("chat.update")) == 1
    ticks.now += 11
    follower.tick()
    assert [r.status for r in fake.calls("chat.update")] == [429, 200]
