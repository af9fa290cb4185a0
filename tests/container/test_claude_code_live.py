"""A Claude Code session kept open between warm runs (agent_runner/claude_code/live.py),
without the SDK: which run may go on with the kept CLI, what each turn is asked, and how
the CLI is named to the host.  The SDK and the CLI themselves are run, kept and spared in
tests/integration/test_claude_code_sandbox.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_runner.claude_code.agent import session_key, turn_prompt
from agent_runner.claude_code.live import LOOP, CliSession, Kept, process_started
from agent_runner.protocol import (
    ContainerInput,
    KeepEvent,
    Limits,
    ModelSettings,
    ProtocolError,
    SdkMessage,
    dump_event,
    parse_event,
)

BASE = "http://127.0.0.1:4100"


def _input(**changes: object) -> ContainerInput:
    inp = ContainerInput(
        run_id="r1",
        chat_jid="main@local",
        group_folder="main",
        assistant_name="Andy",
        messages=[SdkMessage(role="user", content="hello", sender_name="Ann")],
        instructions="Be brief.",
        memory="Ann likes tea.",
        session_id="s-1",
        model=ModelSettings(provider="claude-code", model="claude-sonnet-4-5", socket_path="/gateway/model.sock"),
    )
    return inp.replace(**changes)


def _key(inp: ContainerInput, workspace: Path) -> str:
    return session_key(inp, workspace, workspace / "session", BASE)


def test_a_run_goes_on_with_the_kept_cli_only_while_what_it_was_started_with_holds(tmp_path: Path) -> None:
    base = _key(_input(), tmp_path)
    # What each run brings (its messages, its notices, its id and session) changes no CLI.
    same = _input(
        run_id="r2",
        messages=[SdkMessage(role="user", content="and now?", sender_name="Bob")],
        system_notices=["3 files changed since your last run"],
    )
    assert _key(same, tmp_path) == base
    # What the CLI was started with does: each of these is a new CLI (resumed from disk).
    changed = {
        "instructions": _input(instructions="Be thorough."),
        "memory": _input(memory="Ann likes coffee."),
        "model": _input(model=_input().model.replace(model="claude-opus-4-1")),
        "max tokens": _input(model=_input().model.replace(max_tokens=2048)),
        "thinking": _input(model=_input().model.replace(thinking_budget=4096)),
        "turns": _input(limits=Limits(max_turns=7)),
        "bash timeout": _input(limits=Limits(bash_timeout_s=5)),
        "tools": _input(tools=["send_message"]),
        "network": _input(egress_socket="/gateway/egress.sock"),
        "assistant name": _input(assistant_name="Bea"),
    }
    keys = {why: _key(inp, tmp_path) for why, inp in changed.items()}
    assert all(key != base for key in keys.values()), [why for why, key in keys.items() if key == base]
    assert len(set(keys.values())) == len(keys)
    assert _key(_input(), tmp_path / "elsewhere") != base  # another workspace
    assert session_key(_input(), tmp_path, tmp_path / "session", "http://127.0.0.1:4200") != base


def test_the_proxy_the_cli_inherits_is_part_of_its_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = _key(_input(), tmp_path)
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:4300")
    proxied = _key(_input(), tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", "/gateway/egress-ca.pem")
    assert len({base, proxied, _key(_input(), tmp_path)}) == 3


def test_each_turn_is_asked_its_notices_before_its_messages(tmp_path: Path) -> None:
    inp = _input(system_notices=["The time is 10:00.", "  ", "A file was placed at inbox/a.pdf."])
    prompt = turn_prompt(inp, tmp_path, resuming=True)
    assert prompt.startswith("[system notices for this turn]")
    assert prompt.index("The time is 10:00.") < prompt.index("inbox/a.pdf") < prompt.index("Ann")
    assert prompt.rstrip().endswith("Ann: hello")
    assert turn_prompt(_input(), tmp_path, resuming=True) == "Ann: hello"  # nothing to tell: only the messages


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _session(proc: subprocess.Popen[bytes], key: str = "k", session_id: str | None = "s-1") -> CliSession:
    session = CliSession(key, session_id)
    started = process_started(proc.pid)
    assert started is not None
    session._pid, session._started = proc.pid, started  # as open() reads them off the SDK's child
    return session


def test_the_kept_cli_is_taken_only_for_its_key_and_session_while_it_runs(child: subprocess.Popen[bytes]) -> None:
    kept = Kept()
    kept.keep(session := _session(child))
    assert kept.take("k", "s-1") is session
    assert kept.session is None  # taken: a failed turn leaves nothing behind
    for key, session_id in (("other", "s-1"), ("k", "s-2"), ("k", None)):
        kept.keep(session)
        assert kept.take(key, session_id) is None, (key, session_id)
        assert kept.session is None
    kept.keep(session)
    child.kill()
    child.wait()
    assert not session.alive() and session.kept() is None
    assert kept.take("k", "s-1") is None  # the CLI is gone: a new one resumes from disk


def test_a_cli_is_named_by_pid_and_start_time_so_a_recycled_pid_is_not_it(child: subprocess.Popen[bytes]) -> None:
    session = _session(child)
    kept = session.kept()
    assert kept is not None and kept.pid == child.pid and kept.started == process_started(child.pid)
    assert parse_event(dump_event(kept)) == kept
    # Another process under the same pid (started later) is not the kept CLI.
    session._started = (process_started(child.pid) or 0) - 1
    assert not session.alive() and session.kept() is None
    assert process_started(os.getpid()) is not None and process_started(2**22 + 7) is None


def test_closing_a_session_whose_cli_will_not_go_kills_it(child: subprocess.Popen[bytes]) -> None:
    class Stuck:
        async def disconnect(self) -> None:
            raise RuntimeError("the CLI does not answer")

    session = _session(child)
    session._client = Stuck()
    LOOP.run(session.close())
    assert child.wait(timeout=5) == -9
    LOOP.run(session.close())  # twice is nothing


def test_a_keep_event_names_a_real_process_only() -> None:
    for bad in (b'{"type":"keep","pid":1,"started":5}', b'{"type":"keep","pid":7,"started":-1}'):
        with pytest.raises(ProtocolError):
            parse_event(bad)
    assert isinstance(parse_event(b'{"type":"keep","pid":7,"started":5}'), KeepEvent)
