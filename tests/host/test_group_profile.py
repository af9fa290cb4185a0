"""A profile per group (issue 32, item 1), on both databases: a group's own model, output cap,
thinking budget, trigger names and optional tools, set with ``orchestrator groups set`` and
``PATCH /api/groups/{chat_jid}`` (one check for both: orchestrator/run/profile.py), shown by
``orchestrator groups show`` and ``GET /api/groups/{chat_jid}``, each change told in the chat
as a host message the group's channels deliver.

The issue's own check first: a group set to ``openai:test-model`` has its run ask for
``test-model`` through the real model gateway (a fake OpenAI-compatible upstream on
loopback; the agent played on the gateway's socket), and the gateway refuses another model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from agent_runner.protocol import AssistantEvent, ResultEvent, SendFileEvent, SendMessageEvent
from fakes.channel import attach_recorder
from fakes.clock import FakeClock
from fakes.openai_api import FakeOpenAI, chat
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.errors import BadInput, ConfigError, InvalidMessage, UnknownGroup
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.http.endpoint import CLIENT_HEADER
from orchestrator.root import Orchestrator
from orchestrator.run.assembly import stored_input
from orchestrator.run.attempt import GATEWAY_SOCKET
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.model_choice import model_settings
from orchestrator.run.outbound import ChannelRegistry, Deliverer
from orchestrator.run.pipeline import Pipeline
from orchestrator.run.profile import change_profile, check_changes, docker_image_check
from orchestrator.sandbox.containers import GATEWAY_MOUNT
from orchestrator.store.db import Database
from orchestrator.store.groups import Group, add_group, ensure_main_group, get_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.tables import GroupRow
from orchestrator.store.transfer import export_json, import_chat, parse_export
from tests.conftest import TEST_ENV, docker_available, require_service

MAIN = "main@local"
JID = "team@local"


def _cli(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The real ``orchestrator`` command, on the test's database."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")} | TEST_ENV
    base |= {"ORCHESTRATOR_DATA_DIR": str(settings.data_dir), "ORCHESTRATOR_DATABASE_URL": settings.database_url}
    cli = str(Path(sys.executable).parent / "orchestrator")
    return subprocess.run([cli, *args], env=base | env, capture_output=True, text=True, timeout=120)


def _host_messages(db: Database, chat_jid: str) -> list[str]:
    return [m.content for m in get_messages_after(chat_jid, 0, db=db) if m.message_type == "host"]


def _gateway_socket(sandbox: FakeSandbox) -> str:
    """The run's gateway socket on the host, as a short path (the run folder's may be long)."""
    spec = sandbox.started[-1][0]
    folder = next(host for host, inside in spec.readonly_mounts.items() if inside == GATEWAY_MOUNT)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{GATEWAY_SOCKET}"


# -- the check ------------------------------------------------------------------------


def test_a_groups_model_is_what_its_run_asks_for_and_the_gateway_holds_it(settings: Settings, db: Database) -> None:
    fake = FakeOpenAI(chat("from test-model", n=2))
    answers: list[tuple[int, str]] = []

    def agent(index: int) -> None:
        # The agent, on the run's gateway socket: the group's model, then another one.
        if index != 0:
            return
        uds = _gateway_socket(sandbox)
        with httpx.Client(transport=httpx.HTTPTransport(uds=uds), base_url="http://gateway", timeout=10) as c:
            for model in ("test-model", "gpt-expensive"):
                body = {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
                resp = c.post("/v1/chat/completions", json=body)
                answers.append((resp.status_code, resp.json().get("error", {}).get("type", "")))

    sandbox = FakeSandbox(Script([AssistantEvent(text="ok"), ResultEvent()], before_event=agent))
    ensure_main_group(db)
    with fake.serve() as upstream:
        # The installation's model stays the offline one: only the group's is openai's.
        env = {"ORCHESTRATOR_OPENAI_BASE_URL": upstream}
        done = _cli(settings, "groups", "set", MAIN, "--model", "openai:test-model", **env)
        assert done.returncode == 0, done.stderr
        assert "  model:       openai:test-model (the group's own)" in done.stdout.splitlines()
        s = settings.replace(openai_base_url=upstream, max_attempts=1)
        p = Pipeline(s, db, ChannelRegistry([attach_recorder(db, MAIN)]), sandbox, clock=FakeClock())
        ingest(db, s, IncomingMessage(chat_jid=MAIN, sender="u", content="hello"), signal=None)
        [outcome] = p.drain_group(MAIN)
        shown = _cli(settings, "groups", "show", MAIN, **env)
    assert answers == [(200, ""), (403, "model_not_allowed")]
    assert [c.body["model"] for c in fake.calls] == ["test-model"]  # the other never went upstream
    sent = sandbox.started[0][1]
    assert (sent.model.provider, sent.model.model) == ("openai", "test-model")
    assert outcome.run.state == "succeeded"
    recorded = json.loads(stored_input(db, outcome.run.id) or b"{}")
    assert recorded["model"]["model"] == "test-model"  # what the run asked for is on its record
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "  model:       openai:test-model (the group's own)" in lines
    assert "  max tokens:  1,024 (the installation's)" in lines
    # The change was told in the chat, as a host message.
    assert _host_messages(db, MAIN)[0] == (
        "⚙️ This group's settings changed: model the installation's (offline) -> openai:test-model. "
        "The model changed: the group's session starts afresh."
    )


# -- the API -----------------------------------------------------------------------------------


@pytest.fixture
def configured(settings: Settings) -> Settings:
    """An installation configured for every provider but Claude Code's image."""
    return settings.replace(anthropic_api_key="sk-ant-test", openai_base_url="http://127.0.0.1:9")


@pytest.fixture
def client(db: Database, configured: Settings) -> Iterator[TestClient]:
    add_group(db, chat_jid=JID, name="Team", folder="team")
    with TestClient(create_app(Orchestrator(configured)), headers={CLIENT_HEADER: "tests"}) as c:
        yield c


def test_the_profile_is_changed_shown_and_given_back_to_the_installation(client: TestClient, db: Database) -> None:
    empty = client.get(f"/api/groups/{JID}").json()
    assert {k: empty[k] for k in ("model", "max_tokens", "thinking_budget", "trigger_names", "tools")} == dict.fromkeys(
        ("model", "max_tokens", "thinking_budget", "trigger_names", "tools")
    )
    assert empty["in_effect"] == {
        "model": "offline",
        "model_is_own": False,
        "max_tokens": 1024,
        "thinking_budget": 0,
        "trigger_names": ["Andy"],
        "tools": ["send_message", "send_file", "schedules", "questions", "message_changes"],
    }
    # What each null field gives (the page shows it as the field's default).
    installation = {
        "model": "offline",
        "max_tokens": 1024,
        "thinking_budget": 0,
        "trigger_names": ["Andy"],
        "tools": ["send_message", "send_file", "schedules", "questions", "message_changes"],
        "runs_per_hour": 0,
        "tokens_per_day": 0,
    }
    assert empty["installation"] == installation
    body = {
        "model": "anthropic:claude-test",
        "max_tokens": 4096,
        "thinking_budget": 2048,
        "trigger_names": ["Bee", "bee", "Robo"],
        "tools": ["send_file", "send_file"],
    }
    r = client.patch(f"/api/groups/{JID}", json=body)
    assert r.status_code == 200, r.text
    changed = r.json()
    assert (changed["model"], changed["max_tokens"], changed["thinking_budget"]) == (
        "anthropic:claude-test",
        4096,
        2048,
    )
    # Names are one name whatever their case (the trigger ignores it); tools once each.
    assert (changed["trigger_names"], changed["tools"]) == (["Bee", "Robo"], ["send_file"])
    shown = client.get(f"/api/groups/{JID}").json()
    assert shown["in_effect"] == {
        "model": "anthropic:claude-test",
        "model_is_own": True,
        "max_tokens": 4096,
        "thinking_budget": 2048,
        "trigger_names": ["Bee", "Robo"],
        "tools": ["send_file"],
    }
    assert get_group(db, JID).model == "anthropic:claude-test"
    # null: back to the installation's, each.
    back = client.patch(f"/api/groups/{JID}", json=dict.fromkeys(body)).json()
    assert [back[k] for k in body] == [None] * 5
    assert client.get(f"/api/groups/{JID}").json()["in_effect"] == empty["in_effect"]
    assert shown["installation"] == installation  # the group's own never changes it
    # No tool at all is a profile too; the other fields stay as they are.
    assert client.patch(f"/api/groups/{JID}", json={"tools": []}).json()["tools"] == []
    assert client.get(f"/api/groups/{JID}").json()["in_effect"]["tools"] == []


def test_bad_changes_are_refused_naming_the_field_and_change_nothing(
    client: TestClient, db: Database, configured: Settings
) -> None:
    client.patch(f"/api/groups/{JID}", json={"model": "anthropic:claude-test", "max_tokens": 4096})
    before = get_group(db, JID)
    messages = len(_host_messages(db, JID))
    for bad, field, words in [
        ({"model": "gemini:pro"}, "model", "is not a model; use 'offline'"),
        ({"model": "anthropic:"}, "model", "is not a model"),
        ({"model": "offline:x"}, "model", "is not a model"),
        ({"model": "openai:a b"}, "model", "model"),  # no spaces (the document's pattern)
        ({"max_tokens": 0}, "max_tokens", "max_tokens"),
        ({"max_tokens": 2**31}, "max_tokens", "max_tokens"),
        ({"max_tokens": "4096"}, "max_tokens", "max_tokens"),
        ({"thinking_budget": 500}, "thinking_budget", "at least 1024 and below max tokens"),
        ({"thinking_budget": 4096}, "thinking_budget", "with max tokens 4096"),
        ({"max_tokens": 2048, "thinking_budget": 2048}, "thinking_budget", "below max tokens"),
        ({"trigger_names": []}, "trigger_names", "trigger_names"),
        ({"trigger_names": ["two words"]}, "trigger_names[0]", "trigger_names"),
        ({"trigger_names": ["@Bee"]}, "trigger_names[0]", "trigger_names"),
        ({"trigger_names": [f"n{i}" for i in range(17)]}, "trigger_names", "trigger_names"),
        ({"tools": ["bash"]}, "tools", "'bash' is no optional tool; the optional tools are send_message, send_file"),
        ({"tools": "send_file"}, "tools", "tools"),
        # One bad field refuses the whole change: the good one is not made either.
        ({"name": "renamed", "tools": ["teleport"]}, "tools", "teleport"),
    ]:
        r = client.patch(f"/api/groups/{JID}", json=bad)
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["field"] == field and words in r.json()["detail"], (bad, r.text)
    # A thinking budget with the model in effect lowered under it: the field that broke it is named.
    client.patch(f"/api/groups/{JID}", json={"thinking_budget": 2048})
    r = client.patch(f"/api/groups/{JID}", json={"max_tokens": 2048})
    assert r.status_code == 400 and r.json()["field"] == "max_tokens", r.text
    r = client.patch(f"/api/groups/{JID}", json={"model": "openai:llama"})  # does not think
    assert r.status_code == 200, r.text
    r = client.patch(f"/api/groups/{JID}", json={"thinking_budget": 3000})
    assert r.status_code == 400 and r.json()["field"] == "thinking_budget", r.text
    assert "does not think; a thinking budget is for anthropic, claude-code" in r.json()["detail"]
    assert client.patch(f"/api/groups/{JID}", json={"thinking_budget": 0}).status_code == 200  # off: always
    after = get_group(db, JID)
    assert (after.name, after.tools, after.trigger_names) == (before.name, None, None)
    assert len(_host_messages(db, JID)) == messages + 3  # the three changes made, no refused one
    assert client.patch("/api/groups/nobody@local", json={"model": "offline"}).status_code == 404


def test_a_provider_this_installation_is_not_configured_for_is_refused(db: Database, settings: Settings) -> None:
    group = add_group(db, chat_jid=JID, name="Team", folder="team")
    bare = settings.replace(anthropic_api_key="", openai_base_url="")

    def refused(spec: str) -> BadInput:
        with pytest.raises(BadInput) as err:
            check_changes(bare, group, {"model": spec}, image_exists=docker_image_check(bare))
        return err.value

    for spec, missing in [
        ("anthropic:claude-x", "ORCHESTRATOR_ANTHROPIC_API_KEY"),
        ("claude-code:claude-x", "ORCHESTRATOR_ANTHROPIC_API_KEY"),
        ("openai:llama", "ORCHESTRATOR_OPENAI_BASE_URL"),
    ]:
        err = refused(spec)
        assert err.field == "model" and f"is not configured on this installation ({missing} is not set)" in str(err)
    # An OpenAI-compatible server needs an address, no key; the offline model nothing at all.
    keyless = bare.replace(openai_base_url="http://127.0.0.1:11434", openai_api_key="")
    assert check_changes(keyless, group, {"model": "openai:llama"}, image_exists=docker_image_check(keyless)) == {
        "model": "openai:llama"
    }
    assert check_changes(bare, group, {"model": " offline "}, image_exists=docker_image_check(bare)) == {
        "model": "offline"
    }


def test_claude_code_needs_its_image_built_on_this_host(db: Database, settings: Settings) -> None:
    require_service(docker_available(), "a Docker engine")
    import docker

    engine = docker.from_env()
    repository = f"orchestrator-profile-test-{uuid.uuid4().hex[:8]}"
    s = settings.replace(anthropic_api_key="sk-ant-test", agent_image=f"{repository}:latest")
    group = add_group(db, chat_jid=JID, name="Team", folder="team")
    with pytest.raises(BadInput) as err:
        change_profile(db, s, JID, {"model": "claude-code:claude-x"})
    assert err.value.field == "model"
    assert f"runs in the image {repository}:claude-code, which is not built on this host" in str(err.value)
    assert "run `orchestrator image build --variant claude-code` first" in str(err.value)
    assert get_group(db, JID).model is None and not engine.images.list(name=repository)  # nothing built
    # Once the image is there (any image will do for the look), the model is taken.
    some_image = engine.images.list()[0]
    some_image.tag(repository, "claude-code")
    try:
        changed = change_profile(db, s, JID, {"model": "claude-code:claude-x"})
    finally:
        engine.images.remove(f"{repository}:claude-code", noprune=True)
    assert changed.group.model == "claude-code:claude-x" and group.model is None


# -- the host message of each change ------------------------------------------------------------


def test_each_change_is_told_in_the_chat_and_its_channels_deliver_it(db: Database, configured: Settings) -> None:
    add_group(db, chat_jid=JID, name="Team", folder="team")
    rec = attach_recorder(db, JID)
    signalled: list[str] = []
    s = configured.replace(trigger_aliases="Robo", group_runs_per_hour=5)
    steps: list[tuple[dict[str, object], str]] = [
        ({"model": "openai:llama"}, "model the installation's (offline) -> openai:llama"),
        ({"max_tokens": 4096}, "max tokens the installation's (1,024) -> 4,096"),
        ({"model": "anthropic:claude-x", "thinking_budget": 2048}, "thinking budget the installation's (off) -> 2,048"),
        ({"trigger_names": ["Bee", "Bo"]}, "trigger names the installation's (@Andy, @Robo) -> @Bee, @Bo"),
        (
            {"tools": ["send_file"]},
            "tools the installation's (send_message, send_file, schedules, questions, message_changes) -> send_file",
        ),
        ({"tools": []}, "tools send_file -> none"),
        ({"name": "The team"}, 'name "Team" -> "The team"'),
        ({"requires_trigger": False}, "trigger required yes -> no"),
        ({"assistant_name": "Zed"}, "assistant name the installation's (Andy) -> Zed"),
        ({"runs_per_hour": 0}, "runs per hour the installation's (5) -> no limit"),
        ({"tokens_per_day": 1000}, "tokens per day the installation's (no limit) -> 1,000"),
        ({"container_config": {"pids": 64}}, 'sandbox the installation\'s -> {"pids": 64}'),
        ({"thinking_budget": None, "max_tokens": None}, "max tokens 4,096 -> the installation's (1,024); "),
    ]
    for change, said in steps:
        changed = change_profile(db, s, JID, change, signal_delivery=signalled.append)
        assert changed.message is not None, change
        assert changed.message.message_type == "host" and said in changed.message.content, (
            change,
            changed.message.content,
        )
    texts = _host_messages(db, JID)
    assert len(texts) == len(steps) and signalled == [JID] * len(steps)
    assert texts[2] == (
        "⚙️ This group's settings changed: model openai:llama -> anthropic:claude-x; "
        "thinking budget the installation's (off) -> 2,048. The model changed: the group's session starts afresh."
    )
    # A change to what is there already says nothing, and stores nothing.
    same = change_profile(db, s, JID, {"tools": [], "max_tokens": None}, signal_delivery=signalled.append)
    assert same.message is None and len(_host_messages(db, JID)) == len(steps) and len(signalled) == len(steps)
    # Every channel of the group delivers them, as the host's (never the model's).
    report = Deliverer(db, s, ChannelRegistry([rec])).deliver_due(JID)
    assert report.sent == len(steps), report
    assert all("This group's settings changed" in text for text in rec.rendered)
    assert all(text.startswith("🏠") for text in rec.rendered)


# -- a new model, a new session ------------------------------------------------------------------


def _with_session(db: Database, settings: Settings) -> Path:
    with db.write() as session:
        session.execute(update(GroupRow).where(GroupRow.chat_jid == JID).values(session_id="sess-old"))
    transcript = settings.sessions_dir / "team" / "claude" / "t.jsonl"
    transcript.parent.mkdir(parents=True)
    transcript.write_text("{}\n")
    return transcript


@pytest.mark.docker  # change_profile removes the group's warm container through the engine before its session folder
def test_a_change_of_model_starts_the_groups_session_afresh(db: Database, configured: Settings) -> None:
    add_group(db, chat_jid=JID, name="Team", folder="team")
    transcript = _with_session(db, configured)
    # The output cap, or the installation's own model named as the group's: the model in effect is the same.
    for same in ({"max_tokens": 2048}, {"model": "offline"}, {"trigger_names": ["Bee"]}):
        kept = change_profile(db, configured, JID, same)
        assert not kept.new_session and kept.group.session_id == "sess-old" and transcript.exists(), same
        assert kept.message is not None and "session" not in kept.message.content
    changed = change_profile(db, configured, JID, {"model": "openai:llama"})
    assert changed.new_session and changed.group.session_id is None
    assert get_group(db, JID).session_id is None
    assert not transcript.exists() and not (configured.sessions_dir / "team").exists()  # as `groups reset`
    assert changed.message is not None
    assert changed.message.content.endswith("The model changed: the group's session starts afresh.")
    # The model id alone changes it too.
    _with_session(db, configured)
    again = change_profile(db, configured, JID, {"model": "openai:qwen"})
    assert again.new_session and get_group(db, JID).session_id is None


# -- triggers, through ingest -----------------------------------------------------------------


def _wakes(db: Database, settings: Settings, chat_jid: str, text: str) -> bool:
    return ingest(db, settings, IncomingMessage(chat_jid=chat_jid, sender="u", content=text), signal=None).triggered


def test_a_groups_own_trigger_names_replace_the_installations(db: Database, settings: Settings) -> None:
    s = settings.replace(assistant_name="Andy", trigger_aliases="Robo, Helper")
    add_group(db, chat_jid=JID, name="Team", folder="team")
    add_group(db, chat_jid="other@local", name="Other", folder="other")
    # Without names of its own, a group answers to the installation's (ORCHESTRATOR_TRIGGER_ALIASES too).
    for text in ("@Andy hi", "@robo hi", "@Helper, hi"):
        assert _wakes(db, s, JID, text), text
    assert not _wakes(db, s, JID, "@Bee hi")
    change_profile(db, s, JID, {"trigger_names": ["Bee"], "assistant_name": "Zed"})
    for text, woke in [
        ("@Andy hi", False),
        ("@Robo hi", False),
        ("@Helper hi", False),
        ("@Bee hi", True),
        ("@bee hi", True),
        ("@Zed hi", True),  # its assistant name is one of its names
        ("@Beetle hi", False),
        ("hey @Bee", False),
    ]:
        assert _wakes(db, s, JID, text) is woke, text
    # Another group is as it was.
    for text, woke in [("@Andy hi", True), ("@Robo hi", True), ("@Bee hi", False), ("@Zed hi", False)]:
        assert _wakes(db, s, "other@local", text) is woke, text
    # Back to the installation's.
    change_profile(db, s, JID, {"trigger_names": None})
    assert _wakes(db, s, JID, "@Andy hi") and not _wakes(db, s, JID, "@Bee hi")


def test_a_trigger_name_is_a_name_not_a_pattern(db: Database, settings: Settings) -> None:
    add_group(db, chat_jid=JID, name="Team", folder="team")
    change_profile(db, settings, JID, {"trigger_names": ["a.b", "c|d", "x+"]})
    assert _wakes(db, settings, JID, "@a.b hi") and _wakes(db, settings, JID, "@c|d hi")
    for text in ("@axb hi", "@c hi", "@d hi", "@xx hi", "@x hi"):
        assert not _wakes(db, settings, JID, text), text


# -- tools -------------------------------------------------------------------------------------


def test_the_groups_tools_reach_the_input_and_the_host_refuses_the_others(db: Database, settings: Settings) -> None:
    ensure_main_group(db)
    add_group(db, chat_jid=JID, name="Team", folder="team")
    # A hostile sandbox emits what its runner would not: a send_message and a send_file.
    hostile = Script(
        [
            SendMessageEvent(chat_jid=MAIN, text="pwned"),
            SendFileEvent(path="secret.txt"),
            AssistantEvent(text="done"),
            ResultEvent(),
        ]
    )
    sandbox = FakeSandbox(hostile, Script([AssistantEvent(text="ok"), ResultEvent()]))
    p = Pipeline(settings.replace(max_attempts=1), db, ChannelRegistry([]), sandbox, clock=FakeClock())
    change_profile(db, settings, MAIN, {"tools": []})
    ingest(db, settings, IncomingMessage(chat_jid=MAIN, sender="u", content="hello"), signal=None)
    p.drain_group(MAIN)
    sent = sandbox.started[0][1]
    assert sent.tools == []
    history = get_messages_after(MAIN, 0, db=db)
    refusals = [m.content for m in history if m.message_type == "host" and "refused" in m.content]
    assert refusals == [
        "🚫 send_message refused: send_message is not among this group's tools (orchestrator groups set --tools)",
        "🚫 send_file refused: send_file is not among this group's tools (orchestrator groups set --tools)",
    ]
    assert not any("pwned" in m.content for m in history)
    # A group with all of them (null): the field is left out of the input.
    ingest(db, settings, IncomingMessage(chat_jid=JID, sender="u", content="@Andy hello"), signal=None)
    p.drain_group(JID)
    assert sandbox.started[1][1].tools is msgspec.UNSET
    recorded = stored_input(db, _run_of(db, JID).id)
    assert recorded is not None and b'"tools"' not in recorded


def _run_of(db: Database, chat_jid: str) -> Any:
    from orchestrator.store.runs import list_runs

    (run,) = list_runs(db, chat_jid=chat_jid)
    return run


# -- the model of a run -------------------------------------------------------------------------


def _group(**profile: Any) -> Group:
    return Group(
        chat_jid=JID,
        name="Team",
        folder="team",
        is_main=False,
        requires_trigger=True,
        assistant_name=None,
        cursor_seq=0,
        pending_seq=0,
        session_id=None,
        **profile,
    )


def test_a_runs_model_is_the_groups_own_over_the_settings(settings: Settings) -> None:
    s = settings.replace(model="anthropic:claude-x", max_tokens=2048, thinking_budget=1024)
    assert model_settings(s).model == "claude-x"
    assert model_settings(s, _group()) == model_settings(s)
    own = model_settings(s, _group(model="openai:llama3.1:8b", max_tokens=512))
    assert (own.provider, own.model, own.max_tokens) == ("openai", "llama3.1:8b", 512)
    assert b"thinking_budget" not in own.to_json()  # openai does not think
    thinking = model_settings(s, _group(max_tokens=8192, thinking_budget=4096))
    assert (thinking.model, thinking.max_tokens, thinking.thinking_budget) == ("claude-x", 8192, 4096)
    assert b"thinking_budget" not in model_settings(s, _group(thinking_budget=0)).to_json()  # off for this group
    # The settings moved under a group's profile: the run fails saying so, it does not ask for nonsense.
    with pytest.raises(ConfigError, match="a thinking budget of 1024 with an output cap of 1000"):
        model_settings(s, _group(max_tokens=1000))
    with pytest.raises(ConfigError, match="the group's model='gemini:pro'"):
        model_settings(s, _group(model="gemini:pro"))


# -- the command line ---------------------------------------------------------------------------


def test_groups_set_takes_every_profile_option(db: Database, settings: Settings) -> None:
    add_group(db, chat_jid=JID, name="Team", folder="team")
    done = _cli(
        settings,
        "groups",
        "set",
        JID,
        "--max-tokens",
        "4096",
        "--trigger-name",
        "Bee",
        "--trigger-name",
        "Bo",
        "--tools",
        "send_file",
        "--runs-per-hour",
        "3",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "  max tokens:  4,096 (the group's own)" in lines
    assert "  names:       @Bee, @Bo (the group's own)" in lines
    assert "  tools:       send_file" in lines and "runs per hour 3" in done.stdout
    g = get_group(db, JID)
    assert (g.max_tokens, g.trigger_names, g.tools, g.runs_per_hour) == (4096, ["Bee", "Bo"], ["send_file"], 3)
    (told,) = _host_messages(db, JID)  # one change, one message
    assert "trigger names the installation's (@Andy) -> @Bee, @Bo" in told and "runs per hour" in told
    back = _cli(settings, "groups", "set", JID, "--max-tokens", "default", "--default-trigger-names", "--tools", "all")
    assert back.returncode == 0, back.stderr
    g = get_group(db, JID)
    assert (g.max_tokens, g.trigger_names, g.tools) == (None, None, None)
    shown = _cli(settings, "groups", "show", JID).stdout.splitlines()
    assert "  wakes on:    messages starting with @Andy" in shown
    assert "  tools:       send_message, send_file, schedules, questions, message_changes (all of them)" in shown
    assert "  thinking:    off (the installation's)" in shown
    for bad, words in [
        (["--trigger-name", "Bee", "--default-trigger-names"], "give one of --trigger-name NAME"),
        (["--tools", "send_file,bash"], "tools: 'bash' is no optional tool"),
        (["--max-tokens", "lots"], "--max-tokens: 'lots' is not a whole number"),
        (["--model", "anthropic:claude-x"], "anthropic is not configured on this installation"),
        (["--thinking-budget", "100"], "thinking_budget"),
        (["--trigger-name", "two words"], "trigger_names: a name is 1 to 64 characters"),
    ]:
        r = _cli(settings, "groups", "set", JID, *bad)
        assert r.returncode == 1 and r.stderr.startswith("error: ") and words in r.stderr, (bad, r.stderr)
        assert len(r.stderr.splitlines()) == 1, r.stderr
    assert len(_host_messages(db, JID)) == 2
    missing = _cli(settings, "groups", "set", "nobody@local", "--tools", "all")
    assert missing.returncode == 1 and "no registered group" in missing.stderr


# -- an import never sets a profile ----------------------------------------------------------


def test_an_import_naming_a_groups_profile_is_refused(db: Database, configured: Settings) -> None:
    # An export never carries a profile, so importing one anywhere sets none.
    add_group(db, chat_jid=JID, name="Team", folder="team")
    change_profile(db, configured, JID, {"model": "openai:llama", "trigger_names": ["Bee"], "tools": []})
    exported = json.loads(export_json(db, JID))
    assert set(exported["group"]) == {"chat_jid", "name", "folder", "is_main", "requires_trigger", "assistant_name"}
    for field, value in [
        ("model", "anthropic:claude-opus"),
        ("max_tokens", 100000),
        ("thinking_budget", 50000),
        ("trigger_names", ["everyone"]),
        ("tools", ["send_message"]),
    ]:
        doc = {
            "format": "orchestrator-chat",
            "version": 1,
            "exported_at": "2026-11-27T09:00:00Z",
            "chat_jid": "evil@x",
            "group": {"chat_jid": "evil@x", "name": "Evil", "folder": "evil", field: value},
            "messages": [],
        }
        with pytest.raises(InvalidMessage, match=rf"group\.{field}: a group's profile is never imported"):
            import_chat(db, parse_export(json.dumps(doc)))
    with pytest.raises(UnknownGroup):
        get_group(db, "evil@x")  # nothing stored
