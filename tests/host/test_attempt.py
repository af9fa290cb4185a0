"""One attempt, two callers (orchestrator/run/attempt.py), on both databases, with the fake sandbox.

A chat run (the pipeline) and a replay of it go through the same attempt: the same
container spec (the host's fence on the spec and in the input, the group's limits),
the same verdict from the same container (a crash reads the same), and the same
output budget (a ``send_message`` costs what it says, a flood of them ends both alike).
What differs is only what each does with an output: the chat stores it, the replay
keeps it.
"""

from __future__ import annotations

from agent_runner.protocol import AssistantEvent, KeepEvent, ResultEvent, SendMessageEvent, ToolUseEvent, Usage
from fakes.clock import FakeClock
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.run.replay import create_replay, execute_replay
from orchestrator.run.run_diff import run_outputs
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group, get_group
from orchestrator.store.runs import get_run

JID = "main@local"


def _chat_run(settings: Settings, db: Database, sandbox: FakeSandbox) -> str:
    """One message of the main group answered by one chat run (a single attempt): its id."""
    ensure_main_group(db)
    p = Pipeline(settings, db, ChannelRegistry([]), sandbox, clock=FakeClock())
    ingest(db, settings, IncomingMessage(chat_jid=JID, sender="u", content="go"), signal=None)
    [outcome] = p.drain_group(JID)
    return outcome.run.id


def test_a_chat_run_and_its_replay_get_the_same_container_and_verdict(settings: Settings, db: Database) -> None:
    crash = Script(
        [ToolUseEvent(id="t1", name="bash", input={"command": "make"})],
        exit_code=137,
        stderr="building\nKilled by the kernel\n",
    )
    settings = settings.replace(max_attempts=1, sandbox_fence_s=4.0)
    sandbox = FakeSandbox(crash)
    original = _chat_run(settings, db, sandbox)
    replay = execute_replay(db, settings, sandbox, create_replay(db, settings, original, "offline").id)

    want = "the agent container exited with status 137 (killed: out of memory or stopped): Killed by the kernel"
    assert (get_run(db, original).state, get_run(db, original).error) == ("failed", want)
    assert (replay.state, replay.error) == ("failed", want)
    (run_spec, run_input), (replay_spec, replay_input) = sandbox.started
    folder = get_group(db, JID).folder
    assert run_spec.name.startswith(f"orch-{folder}-{original[:8]}-")
    assert replay_spec.name.startswith(f"orch-replay-{folder}-{replay.id[:8]}-")
    assert replay_spec.extra_labels == {"orchestrator.replay_of": original}
    for spec, sent in sandbox.started:
        # Gone with its worker, and told so: the fence on the spec and in the input alike.
        assert spec.fence_s == 4.0 and sent.host_fence_s == 4.0
        assert (spec.memory, spec.cpus, spec.pids, spec.timeout_s) == (
            settings.sandbox.container_memory,
            settings.sandbox.container_cpus,
            settings.sandbox.container_pids,
            settings.runs.run_timeout_s,
        )
    # Each kept what it said its own way: the chat run stored it, the replay kept it aside.
    assert [o.sender for o in run_outputs(db, get_run(db, original))] == ["tool_use", "host", "result_meta"]
    assert [o.sender for o in run_outputs(db, replay)] == ["tool_use", "result_meta"]


def test_send_message_costs_a_replay_what_it_costs_a_chat_run(settings: Settings, db: Database) -> None:
    # Each send_message is charged its text's bytes against ORCHESTRATOR_MAX_RUN_STORED_BYTES.
    sends = Script(
        [*(SendMessageEvent(chat_jid=JID, text="x" * 400) for _ in range(3)), AssistantEvent(text="done")]
        + [ResultEvent(usage=Usage())]
    )
    settings = settings.replace(max_attempts=1, max_run_stored_bytes=1000)
    sandbox = FakeSandbox(sends)
    original = _chat_run(settings, db, sandbox)
    replay = execute_replay(db, settings, sandbox, create_replay(db, settings, original, "offline").id)
    run = get_run(db, original)
    assert run.state == replay.state == "failed"
    assert run.error == replay.error and "ORCHESTRATOR_MAX_RUN_STORED_BYTES" in (run.error or ""), run.error
    # Two sends fit in the budget in both; the third stopped both runs.
    assert [o.content for o in run_outputs(db, run) if o.sender == "bot"] == ["x" * 400] * 2
    assert [o.content for o in run_outputs(db, replay) if o.sender == "bot"] == ["x" * 400] * 2


def test_the_process_a_runner_keeps_goes_to_its_container_and_nowhere_else(settings: Settings, db: Database) -> None:
    keep = KeepEvent(pid=42, started=123456)
    sandbox = FakeSandbox(Script([AssistantEvent(text="done"), keep, ResultEvent(usage=Usage())]))
    run_id = _chat_run(settings, db, sandbox)
    assert get_run(db, run_id).state == "succeeded"
    [agent] = sandbox.agents
    assert agent.kept == [keep]  # for the clean-up to spare (a warm container's, under runc)
    # Not the chat's: the run stored its reply and its record, nothing for the kept process.
    stored = run_outputs(db, get_run(db, run_id))
    assert [m.content for m in stored][:1] == ["done"] and len(stored) == 2, stored
    assert stored[1].content.startswith("offline · succeeded"), stored  # the run's record
