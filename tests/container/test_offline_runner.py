"""The runner end to end with the offline model, plus the loop and prompt as units."""

from __future__ import annotations

import json
import time
from pathlib import Path

from runner_harness import RunRunner, make_input

from agent_runner.conversation import build_messages, build_system_prompt
from agent_runner.loop import run_agent
from agent_runner.one_run import run
from agent_runner.protocol import Event, SdkMessage, ToolResultEvent, decode_input, parse_event
from agent_runner.providers.base import (
    ProviderMessage,
    ProviderResponse,
    TextBlock,
    TextSink,
    TokenUsage,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)
from agent_runner.providers.offline import OfflineProvider
from agent_runner.tools.bash import run_bash

# --- the runner process --------------------------------------------------------


def test_dollar_command_runs_bash_and_reports_output(run_runner: RunRunner) -> None:
    res = run_runner(make_input("$ echo hi"))

    assert res.returncode == 0, res.stderr
    assert res.types == ["tool_use", "tool_result", "assistant", "result"]
    for event in res.events:  # each line is a valid protocol event
        parse_event(json.dumps(event))
    use, result = res.events[0], res.events[1]
    assert use["name"] == "bash" and use["input"] == {"command": "echo hi"}
    assert result["tool_use_id"] == use["id"]
    assert result["exit_code"] == 0 and result["output"] == "hi\n" and not result["is_error"]
    assert "hi" in res.events[2]["text"] and "exit 0" in res.events[2]["text"]
    final = res.events[3]
    assert final["num_turns"] == 2 and final["stop_reason"] == "end_turn"
    assert final["usage"]["input_tokens"] > 0 and final["usage"]["output_tokens"] > 0
    assert final["session_id"]


def test_plain_message_is_quoted(run_runner: RunRunner) -> None:
    res = run_runner(make_input("what is the weather like?", session_id="sess-1"))

    assert res.returncode == 0, res.stderr
    assert res.types == ["assistant", "result"]
    assert res.events[0]["text"] == 'Andy (offline model) received: "what is the weather like?"'
    assert res.events[1]["session_id"] == "sess-1"
    assert res.events[1]["num_turns"] == 1


def test_only_newest_user_message_is_answered(run_runner: RunRunner) -> None:
    history = [
        "$ echo old",
        {"role": "assistant", "content": "Ran `echo old` (exit 0)"},
        "thanks!",
    ]
    res = run_runner(make_input(*history))

    assert res.types == ["assistant", "result"]
    assert res.events[0]["text"].endswith('received: "thanks!"')


def test_failing_command_reports_its_exit_code(run_runner: RunRunner) -> None:
    res = run_runner(make_input("$ echo oops >&2; exit 3"))

    assert res.returncode == 0, res.stderr
    (result,) = res.of_type("tool_result")
    assert result["exit_code"] == 3
    assert result["output"] == "oops\n"  # stderr is merged into the output
    assert "exit 3" in res.of_type("assistant")[0]["text"]


def test_timeout_kills_command_with_exit_124(run_runner: RunRunner) -> None:
    started = time.monotonic()
    res = run_runner(make_input("$ sleep 5", limits={"bash_timeout_s": 0.5}))

    assert time.monotonic() - started < 4
    (result,) = res.of_type("tool_result")
    assert result["exit_code"] == 124
    assert "timed out" in result["output"]
    assert res.types[-1] == "result"


def test_commands_run_in_the_workspace(run_runner: RunRunner, workspace: Path) -> None:
    res = run_runner(make_input("$ pwd && touch made-here"))

    assert res.of_type("tool_result")[0]["output"].strip() == str(workspace)
    assert (workspace / "made-here").exists()


def test_several_command_lines_become_several_tool_calls(run_runner: RunRunner) -> None:
    res = run_runner(make_input("please:\n$ echo one\n$ echo two"))

    assert res.types == [
        "tool_use",
        "tool_use",
        "tool_result",
        "tool_result",
        "assistant",
        "result",
    ]
    outputs = [r["output"] for r in res.of_type("tool_result")]
    assert outputs == ["one\n", "two\n"]
    text = res.of_type("assistant")[0]["text"]
    assert "`echo one`" in text and "`echo two`" in text


def test_invalid_json_is_an_error_event_and_exit_2(run_runner: RunRunner) -> None:
    res = run_runner("this is not json")

    assert res.returncode == 2
    assert res.types == ["error"]
    assert "invalid ContainerInput" in res.events[0]["message"]
    assert res.events[0]["retryable"] is False


def test_schema_violation_names_the_field(run_runner: RunRunner) -> None:
    doc = make_input("hi")
    del doc["assistant_name"]
    res = run_runner(doc)

    assert res.returncode == 2
    assert "assistant_name" in res.events[0]["message"]


def test_empty_history_is_bad_input() -> None:
    events: list[Event] = []
    code = run(json.dumps(make_input()).encode(), events.append, Path("."))

    assert code == 2
    assert [e.type for e in events] == ["error"]


# --- prompt and conversation building ---------------------------------------------


class RecordingOffline(OfflineProvider):
    """The real offline model, also keeping what the loop sent it."""

    def __init__(self) -> None:
        super().__init__(assistant_name="Andy")
        self.calls: list[tuple[str, list[ProviderMessage]]] = []

    def complete(
        self, system: str, messages: list[ProviderMessage], tools: list[ToolSpec], on_text: TextSink | None = None
    ) -> ProviderResponse:
        self.calls.append((system, list(messages)))
        return super().complete(system, messages, tools, on_text)


def test_system_notices_are_appended_to_the_system_prompt(tmp_path: Path) -> None:
    inp = decode_input(
        json.dumps(
            make_input(
                "hello",
                assistant_name="Bob",
                system_notices=["Notice one: the date is 2025-01-01.", "Notice two: be brief."],
            )
        )
    )
    provider = RecordingOffline()
    events: list[Event] = []
    run_agent(inp, provider, events.append, workspace=tmp_path)

    system = provider.calls[0][0]
    assert system == build_system_prompt(inp, tmp_path)
    assert "You are Bob" in system
    assert system.index("Notice one") < system.index("Notice two")
    assert system.endswith("Notice two: be brief.")
    # notices are context for the model, never chat messages
    assert all("Notice" not in m.text() for m in provider.calls[0][1])


def test_history_roles_are_mapped_and_merged() -> None:
    history = [
        SdkMessage(role="user", content="first"),
        SdkMessage(role="user", content="second"),
        SdkMessage(role="system", content="Carol joined"),
        SdkMessage(role="assistant", content="hello all"),
        SdkMessage(role="tool_result", content="boom", metadata={"exit_code": 3}),
        SdkMessage(role="user", content="why?"),
    ]
    messages = build_messages(history)

    assert [m.role for m in messages] == ["user", "assistant", "user"]
    assert messages[0].text() == "first\n\nsecond\n\n[system]\nCarol joined"
    assert messages[1].text() == "hello all"
    assert messages[2].text() == "[tool_result exit_code=3]\nboom\n\nwhy?"


def test_history_starting_with_assistant_gets_a_user_turn_first() -> None:
    messages = build_messages([SdkMessage(role="assistant", content="hi"), SdkMessage(role="user", content="yo")])
    assert [m.role for m in messages] == ["user", "assistant", "user"]


# --- the loop with a scripted model -----------------------------------------------


class ScriptedProvider:
    """Plays fixed responses; records the conversation it was given each time."""

    def __init__(self, *responses: ProviderResponse) -> None:
        self.responses = list(responses)
        self.seen: list[list[ProviderMessage]] = []

    def complete(
        self, system: str, messages: list[ProviderMessage], tools: list[ToolSpec], on_text: TextSink | None = None
    ) -> ProviderResponse:
        self.seen.append(list(messages))
        return self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]


def _calls(name: str, args: dict) -> ProviderResponse:
    return ProviderResponse([ToolUseBlock("t1", name, args)], "tool_use", TokenUsage(3, 2))


def test_unknown_tool_becomes_an_error_result(tmp_path: Path) -> None:
    provider = ScriptedProvider(
        _calls("teleport", {"to": "mars"}),
        ProviderResponse([TextBlock("sorry")], "end_turn", TokenUsage(5, 1)),
    )
    events: list[Event] = []
    result = run_agent(decode_input(json.dumps(make_input("go"))), provider, events.append, workspace=tmp_path)

    assert [e.type for e in events] == ["tool_use", "tool_result", "assistant", "result"]
    tool_result = events[1]
    assert isinstance(tool_result, ToolResultEvent)
    assert tool_result.is_error and tool_result.exit_code == 127
    fed_back = provider.seen[1][-1].content[0]
    assert isinstance(fed_back, ToolResultBlock) and fed_back.is_error
    assert result.usage.input_tokens == 8 and result.usage.output_tokens == 3


def test_loop_stops_at_max_turns(tmp_path: Path) -> None:
    provider = ScriptedProvider(_calls("bash", {"command": "true"}))  # calls a tool forever
    events: list[Event] = []
    inp = decode_input(json.dumps(make_input("loop", limits={"max_turns": 3})))
    result = run_agent(inp, provider, events.append, workspace=tmp_path)

    assert result.num_turns == 3 and result.stop_reason == "max_turns"
    assert [e.type for e in events].count("tool_result") == 3
    assert events[-1] is result


# --- the bash tool ----------------------------------------------------------------


def test_escaped_background_process_does_not_hang_the_call(tmp_path: Path) -> None:
    # setsid leaves our process group, so it survives; we must still return.
    started = time.monotonic()
    output, code = run_bash(
        "setsid sleep 4 & echo started",
        cwd=tmp_path,
        timeout_s=10,
        output_cap_bytes=1000,
        drain_grace_s=0.2,
    )
    assert code == 0 and output.startswith("started")
    assert time.monotonic() - started < 2


def test_output_is_capped_with_a_note(tmp_path: Path) -> None:
    output, code = run_bash("head -c 100000 /dev/zero | tr '\\0' x", cwd=tmp_path, timeout_s=10, output_cap_bytes=256)
    assert code == 0
    assert output.startswith("x" * 256) and "x" * 257 not in output
    assert "truncated" in output and "100000 bytes" in output


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    started = time.monotonic()
    output, code = run_bash("sleep 30 & echo $!; wait", cwd=tmp_path, timeout_s=0.5, output_cap_bytes=1000)
    assert code == 124
    # The background child holds the output pipe: only killing it ends the call.
    assert time.monotonic() - started < 3
    child = int(output.splitlines()[0])
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    if _alive(child):
        raise AssertionError(f"background child {child} survived the timeout")


def _alive(pid: int) -> bool:
    """Running and not a zombie (an orphan waits for init to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
