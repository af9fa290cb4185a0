"""The host's side of the claude-code provider: the model setting, the image
variant's name, and the group's session folder (hostile: the agent writes it)."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from orchestrator.core.errors import ConfigError, ImageBuildError, MountRefused
from orchestrator.core.settings import Settings
from orchestrator.run.pipeline import model_settings
from orchestrator.sandbox.image import image_name, model_variant, settings_variant
from orchestrator.sandbox.sessions import forget_session, session_dir, session_mount


def _settings(tmp_path: Path, **kw: object) -> Settings:
    return Settings.load(data_dir=tmp_path / "data", env_file=None, **kw)  # type: ignore[arg-type]


def test_claude_code_models_run_in_the_variant_image(tmp_path: Path) -> None:
    settings = _settings(tmp_path, model="claude-code:claude-sonnet-4-5", max_tokens=2048, thinking_budget=1024)
    chosen = model_settings(settings)
    assert (chosen.provider, chosen.model, chosen.max_tokens, chosen.thinking_budget) == (
        "claude-code", "claude-sonnet-4-5", 2048, 1024)
    assert settings_variant(settings) == "claude-code"
    assert image_name(settings, model_variant(chosen.provider)) == "orchestrator-agent:claude-code"
    plain = _settings(tmp_path, model="anthropic:claude-sonnet-4-5", agent_image="registry:5000/team/agent:v3")
    assert settings_variant(plain) is None and model_variant("anthropic") is None
    assert image_name(plain, None) == "registry:5000/team/agent:v3"
    assert image_name(plain, "claude-code") == "registry:5000/team/agent:claude-code"
    assert image_name(_settings(tmp_path, agent_image="registry:5000/agent"), "claude-code") == (
        "registry:5000/agent:claude-code")
    with pytest.raises(ImageBuildError, match="no image variant 'gpu'"):
        image_name(plain, "gpu")
    no_thinking = model_settings(_settings(tmp_path, model="claude-code:m"))
    assert no_thinking.thinking_budget is msgspec.UNSET
    with pytest.raises(ConfigError, match="claude-code:<model id>"):
        model_settings(_settings(tmp_path, model="claude-code:"))


def test_only_a_session_keeping_provider_gets_the_session_folder(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert session_mount(settings, "team", "anthropic") == {}
    assert not session_dir(settings, "team").exists()
    mount = session_mount(settings, "team", "claude-code")
    assert mount == {str(settings.data_dir / "sessions" / "team"): "/session"}
    assert session_dir(settings, "team").is_dir()
    if os.getuid() == 0:  # handed to the container's user, as the workspace is
        assert session_dir(settings, "team").stat().st_uid == 1000


def test_a_planted_link_in_place_of_the_session_folder_is_refused(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    (settings.data_dir / "sessions").mkdir(parents=True)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (settings.data_dir / "sessions" / "team").symlink_to(target)
    with pytest.raises(MountRefused, match="session folder refused"):
        session_mount(settings, "team", "claude-code")
    # Forgetting it drops the link and never touches what it pointed to.
    (target / "keep.txt").write_text("keep")
    assert forget_session(settings, "team")
    assert not (settings.data_dir / "sessions" / "team").exists()
    assert (target / "keep.txt").read_text() == "keep"


def test_forgetting_a_session_never_follows_what_the_agent_planted(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    session_mount(settings, "team", "claude-code")
    folder = session_dir(settings, "team")
    outside = tmp_path / "host-file"
    outside.write_text("the host's")
    outside_dir = tmp_path / "host-dir"
    outside_dir.mkdir()
    (outside_dir / "data").write_text("the host's")
    (folder / "claude" / "projects").mkdir(parents=True)
    (folder / "claude" / "projects" / "s.jsonl").write_text("{}")
    (folder / "claude" / "link-to-file").symlink_to(outside)
    (folder / "claude" / "link-to-dir").symlink_to(outside_dir)
    assert forget_session(settings, "team")
    assert not folder.exists()
    assert outside.read_text() == "the host's" and (outside_dir / "data").read_text() == "the host's"
    assert not forget_session(settings, "team")  # nothing left: nothing to do


def test_a_bad_folder_name_never_names_a_session_folder(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    for bad in ("../x", "a/b", ""):
        with pytest.raises(Exception, match="folder"):
            session_dir(settings, bad)
