"""Instructions and memory (orchestrator/run/instructions.py): the installation's and a
group's instructions, host-owned and bounded; the agent's MEMORY.md read by the
hostile-folder rule, bounded, with a notice when cut or not read; both in the run's input
and in the system prompt the runner builds."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent_runner.conversation import build_system_prompt
from agent_runner.protocol import AssistantEvent, ResultEvent, Usage
from fakes.clock import FakeClock
from fakes.sandbox import FakeSandbox, Script
from orchestrator.cli.main import app
from orchestrator.core.settings import Settings
from orchestrator.run.assembly import rebuild_input, stored_input
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.instructions import (
    group_instructions,
    instructions_path,
    read_memory,
    write_instructions,
)
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, ensure_main_group, get_group

TEAM = "team@test"


def run_once(settings: Settings, db: Database, jid: str = "main@local") -> FakeSandbox:
    sandbox = FakeSandbox(Script([AssistantEvent(text="ok"), ResultEvent(usage=Usage())]))
    ingest(db, settings, IncomingMessage(chat_jid=jid, sender="u", content="hi"), signal=None)
    Pipeline(settings, db, ChannelRegistry([]), sandbox, clock=FakeClock()).drain_group(jid)
    return sandbox


def test_instructions_are_the_installations_then_the_groups(db: Database, settings: Settings) -> None:
    ensure_main_group(db)
    add_group(db, chat_jid=TEAM, name="team", folder="team", requires_trigger=False)
    write_instructions(settings, None, "Answer in French.")
    write_instructions(settings, "team", "You help the team ship.")
    team, main = get_group(db, TEAM), get_group(db, "main@local")
    assert group_instructions(settings, team) == (
        "## Instructions for every group\nAnswer in French.\n\n## Instructions for this group\nYou help the team ship."
    )
    assert group_instructions(settings, main) == "## Instructions for every group\nAnswer in French."
    # Host-owned: this user's alone.
    assert stat.S_IMODE(instructions_path(settings, "team").stat().st_mode) == 0o600
    assert stat.S_IMODE(instructions_path(settings, "team").parent.stat().st_mode) == 0o700
    write_instructions(settings, "team", "")
    assert not instructions_path(settings, "team").exists()
    with pytest.raises(ValueError, match="INSTRUCTIONS_MAX_BYTES"):
        write_instructions(settings.replace(instructions_max_bytes=10), None, "x" * 11)


def test_the_run_carries_instructions_and_memory_and_rebuilds_the_same(db: Database, settings: Settings) -> None:
    ensure_main_group(db)
    write_instructions(settings, None, "Be brief.")
    workspace = settings.groups_dir / get_group(db, "main@local").folder
    workspace.mkdir(parents=True)
    (workspace / "MEMORY.md").write_text("- the deploy key is in vault\n")
    ((spec, sent),) = run_once(settings, db).started
    assert sent.instructions == "## Instructions for every group\nBe brief."
    assert sent.memory == "- the deploy key is in vault\n"
    prompt = build_system_prompt(sent, Path("/workspace"))
    assert prompt.index("Be brief.") < prompt.index("## Your memory") < prompt.index("the deploy key is in vault")
    recorded = stored_input(db, spec.run_id)
    assert recorded is not None and rebuild_input(db, settings, spec.run_id) == recorded


def test_no_instructions_and_no_memory_leave_the_input_as_it_was(db: Database, settings: Settings) -> None:
    ensure_main_group(db)
    ((spec, _),) = run_once(settings, db).started
    recorded = stored_input(db, spec.run_id)
    assert recorded is not None and b'"instructions"' not in recorded and b'"memory"' not in recorded


def test_a_long_memory_is_cut_and_the_notice_says_so(db: Database, settings: Settings) -> None:
    ensure_main_group(db)
    settings = settings.replace(memory_max_bytes=1024)
    workspace = settings.groups_dir / get_group(db, "main@local").folder
    workspace.mkdir(parents=True)
    (workspace / "MEMORY.md").write_text("é" * 2000)  # 4000 bytes, cut inside no character
    ((_, sent),) = run_once(settings, db).started
    assert isinstance(sent.memory, str) and sent.memory == "é" * 512
    assert any("MEMORY.md is longer than 1.0 KiB" in n for n in sent.system_notices)


@pytest.mark.parametrize(
    ("plant", "why"),
    [
        (lambda w: (w / "MEMORY.md").symlink_to("/etc/passwd"), "symlink"),
        (lambda w: os.mkfifo(w / "MEMORY.md"), "not a regular file"),
        (lambda w: (w / "MEMORY.md").mkdir(), "directory"),
    ],
    ids=["symlink", "fifo", "directory"],
)
def test_a_memory_that_is_no_plain_file_is_not_read(
    settings: Settings, tmp_path: Path, plant: Callable[[Path], object], why: str
) -> None:
    plant(tmp_path)
    memory, notice = read_memory(settings, tmp_path)
    assert memory == ""
    assert notice is not None and notice.startswith("MEMORY.md in your workspace was not read (") and why in notice


def test_a_missing_memory_or_workspace_says_nothing(settings: Settings, tmp_path: Path) -> None:
    assert read_memory(settings, tmp_path) == ("", None)
    assert read_memory(settings, tmp_path / "not-yet") == ("", None)


def test_the_commands_set_show_and_clear_instructions(db: Database, settings: Settings, tmp_path: Path) -> None:
    add_group(db, chat_jid=TEAM, name="team", folder="team")
    env = {
        "ORCHESTRATOR_DATA_DIR": str(settings.data_dir),
        "ORCHESTRATOR_DATABASE_URL": settings.effective_database_url,
    }
    (tmp_path / "i.md").write_text("Use metric units.\n")
    done = CliRunner().invoke(app, ["groups", "instructions", TEAM, "--file", str(tmp_path / "i.md")], env=env)
    assert done.exit_code == 0, done.output
    shown = CliRunner().invoke(app, ["groups", "instructions", TEAM], env=env)
    assert shown.stdout.strip() == "Use metric units."
    assert CliRunner().invoke(app, ["instructions", "--file", "-"], input="All of you.\n", env=env).exit_code == 0
    assert group_instructions(settings, get_group(db, TEAM)).endswith("Use metric units.")
    assert CliRunner().invoke(app, ["groups", "instructions", TEAM, "--clear"], env=env).exit_code == 0
    assert group_instructions(settings, get_group(db, TEAM)) == "## Instructions for every group\nAll of you."
    unknown = CliRunner().invoke(app, ["groups", "instructions", "nobody@test"], env=env)
    assert unknown.exit_code != 0
