"""The host's side of the claude-code provider: the model setting, the image
variant's name, and the group's session folder (hostile: the agent writes it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import msgspec
import pytest

from orchestrator.core.errors import ConfigError, ImageBuildError, MountRefused, SettingsError, WorkspaceQuotaError
from orchestrator.core.settings import Settings
from orchestrator.run.model_choice import model_settings
from orchestrator.sandbox import quota
from orchestrator.sandbox.image import image_name, model_variant, settings_variant
from orchestrator.sandbox.sessions import (
    AUTO_SESSION_QUOTA_BYTES,
    forget_session,
    session_dir,
    session_mount,
    session_quota_bytes,
    session_volume,
)
from tests.conftest import require_service
from tests.quota_support import (  # fixtures
    _no_volume_left_mounted,  # noqa: F401
    fill,
    mounts_under,
    release_everything,
    require_volumes,
)

MiB = 1024 * 1024


def _settings(tmp_path: Path, **kw: object) -> Settings:
    return Settings.load(data_dir=tmp_path / "data", env_file=None, **kw)  # type: ignore[arg-type]


def test_claude_code_models_run_in_the_variant_image(tmp_path: Path) -> None:
    settings = _settings(tmp_path, model="claude-code:claude-sonnet-4-5", max_tokens=2048, thinking_budget=1024)
    chosen = model_settings(settings)
    assert (chosen.provider, chosen.model, chosen.max_tokens, chosen.thinking_budget) == (
        "claude-code",
        "claude-sonnet-4-5",
        2048,
        1024,
    )
    assert settings_variant(settings) == "claude-code"
    assert image_name(settings, model_variant(chosen.provider)) == "orchestrator-agent:claude-code"
    plain = _settings(tmp_path, model="anthropic:claude-sonnet-4-5", agent_image="registry:5000/team/agent:v3")
    assert settings_variant(plain) is None and model_variant("anthropic") is None
    assert image_name(plain, None) == "registry:5000/team/agent:v3"
    assert image_name(plain, "claude-code") == "registry:5000/team/agent:claude-code"
    assert image_name(_settings(tmp_path, agent_image="registry:5000/agent"), "claude-code") == (
        "registry:5000/agent:claude-code"
    )
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


# -- the session folder's quota: it sits beside the database and the broker ----------------


def test_the_session_quota_setting() -> None:
    assert session_quota_bytes(Settings.load(env_file=None, session_quota="auto")) == AUTO_SESSION_QUOTA_BYTES
    assert session_quota_bytes(Settings.load(env_file=None, session_quota=" 64M ")) == 64 * MiB
    assert session_quota_bytes(Settings.load(env_file=None, session_quota="0")) == 0
    with pytest.raises(SettingsError, match="ORCHESTRATOR_SESSION_QUOTA"):
        Settings.load(env_file=None, session_quota="lots")


def test_a_session_folder_is_a_volume_of_its_quota_and_a_reset_removes_it(tmp_path: Path) -> None:
    """``fallocate -l 500G /session/x`` used to fill the data dir's filesystem for every
    group: the session folder is now a volume of its own, ENOSPC at its quota."""
    require_volumes()
    settings = _settings(tmp_path, session_quota="16m", workspace_quota="0")
    folder = session_dir(settings, "team")
    try:
        folder.parent.mkdir(parents=True)
        folder.mkdir()
        (folder / "claude").mkdir()
        (folder / "claude" / "s.jsonl").write_text("{}\n")  # a transcript from before the quota: kept
        assert session_mount(settings, "team", "claude-code") == {str(folder): "/session"}
        vol = session_volume(settings, "team")
        assert vol.image.name == "session.team.img" and vol.mounted() == "ours"
        assert (folder / "claude" / "s.jsonl").read_text() == "{}\n"
        assert folder.stat().st_uid == 1000  # the new volume's root was handed over
        assert shutil.disk_usage(folder).total <= 16 * MiB
        assert fill(folder / "x", 64 * MiB) < 16 * MiB
        # Mounted once: the next attempt finds it in place.
        session_mount(settings, "team", "claude-code")
        assert mounts_under(folder) == [str(folder.resolve())]
        # The CLI's unmount takes session volumes too; the next run mounts it again.
        assert "session.team" in quota.unmount_all(settings)
        assert not mounts_under(folder)
        session_mount(settings, "team", "claude-code")
        assert vol.mounted() == "ours" and (folder / "claude" / "s.jsonl").exists()
        # A reset forgets the session: its volume unmounted and its image deleted.
        assert forget_session(settings, "team")
        assert not folder.exists() and not vol.image.exists() and not mounts_under(tmp_path)
    finally:
        release_everything(tmp_path)


def test_checked_mode_refuses_a_session_folder_over_its_quota(tmp_path: Path) -> None:
    settings = _settings(tmp_path, session_quota="16m", workspace_quota_mode="checked")
    session_mount(settings, "team", "claude-code")
    (session_dir(settings, "team") / "big").write_bytes(b"x" * 17 * MiB)
    with pytest.raises(WorkspaceQuotaError, match="session folder quota exceeded.*ORCHESTRATOR_SESSION_QUOTA"):
        session_mount(settings, "team", "claude-code")
    (session_dir(settings, "team") / "big").unlink()
    session_mount(settings, "team", "claude-code")


def test_the_session_folder_is_handed_over_once_not_walked_every_attempt(tmp_path: Path) -> None:
    """Everything below the folder is the container user's own: root walks it only while
    its top is not (a million files there made every attempt walk them as root)."""
    require_service(os.geteuid() == 0, "root (the hand-over lchowns)")
    settings = _settings(tmp_path)
    session_mount(settings, "team", "claude-code")
    folder = session_dir(settings, "team")
    (folder / "deep").mkdir()
    os.lchown(folder / "deep", 0, 0)  # stands for an entry the walk would have handed over
    session_mount(settings, "team", "claude-code")
    assert (folder / "deep").stat().st_uid == 0, "the session folder was walked again"
    os.lchown(folder, 0, 0)  # a folder that is not the user's (a data dir from a non-root install)
    session_mount(settings, "team", "claude-code")
    assert folder.stat().st_uid == 1000 and (folder / "deep").stat().st_uid == 1000
