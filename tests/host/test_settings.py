"""The settings object: what it reads from the environment and the .env file,
how it converts and checks, and the errors people see (orchestrator/core/settings.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core.errors import OrchestratorError, SettingsError
from orchestrator.core.settings import Settings


def test_environment_strings_become_typed_values(tmp_path: Path) -> None:
    s = Settings.load(
        env_file=None,
        environ={
            "ORCHESTRATOR_DATA_DIR": str(tmp_path / "a" / ".." / "b"),
            "ORCHESTRATOR_MAX_TOKENS": "77",
            "ORCHESTRATOR_RUN_TIMEOUT_S": "12.5",
            "ORCHESTRATOR_CONTEXT_URL_ALLOW_PRIVATE": "yes",
            "ORCHESTRATOR_API_REQUIRE_REGISTERED_CHAT": "0",
            "ORCHESTRATOR_WORKSPACE_QUOTA_MODE": "checked",
            "ORCHESTRATOR_WORKSPACE_QUOTA": " 2G ",
            "ORCHESTRATOR_OPENAI_BASE_URL": "https://api.openai.com/v1/",
            "orchestrator_assistant_name": "Bo",  # names are case-insensitive
            "ORCHESTRATOR_NOT_A_SETTING": "ignored",
            "OTHER_MAX_TOKENS": "5",
        },
    )
    assert s.data_dir == (tmp_path / "b").resolve()
    assert (s.provider.max_tokens, s.runs.run_timeout_s) == (77, 12.5)
    assert s.context.url_allow_private is True and s.api.require_registered_chat is False
    assert (s.sandbox.workspace_quota_mode, s.sandbox.workspace_quota) == ("checked", "2g")
    assert s.provider.openai_base_url == "https://api.openai.com"
    assert s.assistant_name == "Bo"


def test_the_env_file_then_the_environment_then_code(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text(
        "ORCHESTRATOR_MAX_TOKENS=10\nORCHESTRATOR_MAX_TURNS=4\n# a comment\nORCHESTRATOR_LOG_LEVEL='DEBUG'\n"
    )
    s = Settings.load(env_file=env_file, environ={"ORCHESTRATOR_MAX_TURNS": "6"}, max_attempts=9)
    assert (s.provider.max_tokens, s.provider.max_turns, s.runs.max_attempts, s.telemetry.log_level) == (
        10,
        6,
        9,
        "DEBUG",
    )
    assert Settings.load(env_file=tmp_path / "missing.env", environ={}).provider.max_tokens == 1024


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("ORCHESTRATOR_MAX_TOKENS", "zero", "ORCHESTRATOR_MAX_TOKENS='zero': expected `int`"),
        ("ORCHESTRATOR_MAX_TOKENS", "0", "ORCHESTRATOR_MAX_TOKENS='0': expected `int` >= 1"),
        ("ORCHESTRATOR_API_PORT", "70000", "ORCHESTRATOR_API_PORT='70000': expected `int` <= 65535"),
        ("ORCHESTRATOR_WORKSPACE_QUOTA_MODE", "maybe", "ORCHESTRATOR_WORKSPACE_QUOTA_MODE='maybe'"),
        ("ORCHESTRATOR_WORKSPACE_QUOTA", "lots", "ORCHESTRATOR_WORKSPACE_QUOTA: 'lots' is not a size"),
        ("ORCHESTRATOR_CONTEXT_URL_ALLOW_PRIVATE", "perhaps", "ORCHESTRATOR_CONTEXT_URL_ALLOW_PRIVATE='perhaps'"),
        ("ORCHESTRATOR_FLOWER_BASIC_AUTH", "ops", "ORCHESTRATOR_FLOWER_BASIC_AUTH must be user:password"),
        ("ORCHESTRATOR_FLOWER_BASIC_AUTH", "ops:", "ORCHESTRATOR_FLOWER_BASIC_AUTH must be user:password"),
        ("ORCHESTRATOR_FLOWER_BASIC_AUTH", "a:b,c:d", "ORCHESTRATOR_FLOWER_BASIC_AUTH must be user:password"),
    ],
)
def test_a_bad_value_names_the_variable(name: str, value: str, says: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.load(env_file=None, environ={name: value})
    assert says in str(err.value)
    assert isinstance(err.value, OrchestratorError) and isinstance(err.value, ValueError)


def test_replace_keeps_the_rest_and_normalizes() -> None:
    s = Settings.load(env_file=None, environ={}, max_tokens=5)
    t = s.replace(openai_base_url="http://x:1/v1/", run_timeout_s=3.0)
    assert (t.provider.max_tokens, t.runs.run_timeout_s, t.provider.openai_base_url) == (5, 3.0, "http://x:1")
    assert (s.runs.run_timeout_s, s.provider.openai_base_url) == (300.0, "http://127.0.0.1:11434")


def test_a_cli_command_with_a_bad_variable_says_so_in_one_line(tmp_path: Path) -> None:
    cli = str(Path(sys.executable).parent / "orchestrator")
    env = {"PATH": "/usr/bin:/bin", "ORCHESTRATOR_DATA_DIR": str(tmp_path), "ORCHESTRATOR_MAX_TURNS": "many"}
    for argv in (["groups", "list"], ["send", "x@local", "hi"]):
        done = subprocess.run([cli, *argv], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1
        assert done.stderr.strip() == "error: ORCHESTRATOR_MAX_TURNS='many': expected `int`, got `str`"


def test_warm_sessions_are_on_by_default_and_the_cap_is_sized_by_memory() -> None:
    from orchestrator.sandbox.warm import MAX_AUTO_WARM, MIN_WARM, warm_cap

    # environ={}: the defaults themselves (the test session turns warm sessions off for its own runs).
    default = Settings.load(environ={}, env_file=None)
    assert default.sandbox.warm_idle_s > 0 and default.sandbox.warm_max == 0
    gib = 1024**3
    # Half the memory, at the container's memory limit each: 24 GiB at 512m is 24.
    assert warm_cap(default.replace(container_memory="512m").sandbox, memory=24 * gib) == 24
    assert warm_cap(default.replace(container_memory="2g").sandbox, memory=24 * gib) == 6
    assert warm_cap(default.replace(container_memory="2g").sandbox, memory=2 * gib) == MIN_WARM
    assert warm_cap(default.replace(container_memory="64m").sandbox, memory=4096 * gib) == MAX_AUTO_WARM
    assert warm_cap(default.replace(warm_max=7).sandbox, memory=24 * gib) == 7  # set: taken as it is
    assert warm_cap(default.sandbox) >= MIN_WARM  # this machine's own memory
    with pytest.raises(SettingsError, match="WARM_MAX"):
        Settings.load(environ={"ORCHESTRATOR_WARM_MAX": "-1"}, env_file=None)


def test_flowers_login_is_a_secret() -> None:
    settings = Settings.load(env_file=None, environ={"ORCHESTRATOR_FLOWER_BASIC_AUTH": "ops:s3cret-word"})
    assert settings.api.flower_basic_auth == "ops:s3cret-word"
    assert "s3cret-word" not in repr(settings) and "ops:s3cret-word" in settings.secrets()
