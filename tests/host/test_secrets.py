"""No secret where it can leak: canary values for every secret setting, hunted in what the
program writes (its settings' repr, log lines of a real process, run and delivery errors, host
messages, what the model gateway hands the container).  The end-to-end hunt, through a real
worker, an agent container and the API, is tests/integration/test_secret_canary.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fakes.anthropic_api import FakeAnthropic, api_error
from orchestrator.core import secrets
from orchestrator.core.settings import Settings
from orchestrator.core.settings.secrets import SECRET_FIELDS
from orchestrator.run.outputs import host_message
from orchestrator.sandbox.gateway import GatewayConfig, ModelGateway
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from orchestrator.store.runs import create_run, finish_run, get_run

# One canary per secret setting, and a database password: each unique, so a hit names its leak.
# (Flower's login is user:password: the canary has that shape, the user a canary too.)
CANARIES = {
    name: ("canary-user:" if name == "flower_basic_auth" else "") + f"canary-{name.replace('_', '-')}-7a41e"
    for name in SECRET_FIELDS
}
DB_PASSWORD = "canary-db-password-7a41e"
ENVIRON = {f"ORCHESTRATOR_{name.upper()}": value for name, value in CANARIES.items()} | {
    "ORCHESTRATOR_DATABASE_URL": f"postgresql://orchestrator:{DB_PASSWORD}@127.0.0.1:1/none"
}


def leaks(text: str) -> list[str]:
    return [c for c in [*CANARIES.values(), DB_PASSWORD] if c in text]


@pytest.fixture
def canary_settings(tmp_path: Path) -> Settings:
    return Settings.load(environ=ENVIRON, env_file=None, data_dir=tmp_path / "d")


def test_every_secret_setting_is_a_canary(canary_settings: Settings) -> None:
    # A new secret setting must be added to SECRET_FIELDS (and so to this hunt).
    import msgspec

    names = {
        f.name
        for f in msgspec.structs.fields(Settings)
        if f.type is str and any(w in f.name for w in ("secret", "token", "key", "password"))
    }
    assert names <= set(SECRET_FIELDS), names - set(SECRET_FIELDS)
    # The database password where a URL carries it only: a bare common word is left alone.
    assert sorted(canary_settings.secrets()) == sorted([*CANARIES.values(), f":{DB_PASSWORD}@"])
    plain = Settings.load(env_file=None, database_url="postgresql://orchestrator:orchestrator@db/orchestrator")
    secrets.hide(plain.secrets())
    assert secrets.redact("run `orchestrator groups set`") == "run `orchestrator groups set`"
    assert "orchestrator:orchestrator@" not in secrets.redact("could not connect to orchestrator:orchestrator@db")


def test_the_settings_repr_shows_no_secret(canary_settings: Settings) -> None:
    for shown in (repr(canary_settings), str(canary_settings), f"{canary_settings!r}", f"{[canary_settings]}"):
        assert leaks(shown) == [], shown
    assert "postgresql://orchestrator:********@127.0.0.1:1/none" in repr(canary_settings)
    assert "token='********'" in repr(canary_settings.api)
    assert "openai_api_key=''" in repr(Settings.load(env_file=None))  # unset is shown as unset


LOGGING_PROCESS = r"""
import logging, sys
from orchestrator.core.logs import configure
from orchestrator.core.settings import Settings
settings = Settings.load(env_file=None)
configure(settings)
log = logging.getLogger("canary")
# A library logging a URL with the bot token in its path, as httpx does for Telegram.
logging.getLogger("httpx").info('HTTP Request: POST https://api.telegram.org/bot%s/getUpdates "HTTP/1.1 200 OK"',
                                settings.telegram.bot_token)
log.warning("upstream said: invalid x-api-key %s", settings.provider.anthropic_api_key)
log.error("connecting to " + settings.database_url + " failed")
try:
    raise RuntimeError(f"bad token {settings.api.token} and {settings.webhook.inbound_secret}")
except RuntimeError:
    log.exception("it failed (%s)", settings.provider.openai_api_key)
log.info("settings: %r", settings)
log.warning("stack", stack_info=True, extra={})
log.info("a line with no secret")
"""


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_log_lines_of_a_real_process_carry_no_secret(tmp_path: Path, log_format: str) -> None:
    env = {**os.environ, **ENVIRON, "ORCHESTRATOR_LOG_FORMAT": log_format, "ORCHESTRATOR_DATA_DIR": str(tmp_path)}
    env = {
        k: v
        for k, v in env.items()
        if not (
            k.startswith("ORCHESTRATOR_")
            and k not in ENVIRON
            and k not in ("ORCHESTRATOR_LOG_FORMAT", "ORCHESTRATOR_DATA_DIR")
        )
    }
    done = subprocess.run(
        [sys.executable, "-c", LOGGING_PROCESS], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    assert leaks(out) == [], out
    assert out.count(secrets.MASK) >= 6, out  # the lines are there, cleaned, not dropped
    assert "a line with no secret" in out and "Traceback" in out and "RuntimeError: bad token" in out
    if log_format == "json":
        lines = [json.loads(line) for line in done.stderr.splitlines()]
        assert any("RuntimeError" in str(line.get("exc_info")) for line in lines)


@pytest.fixture
def hidden(canary_settings: Settings) -> Iterator[Settings]:
    secrets.hide(canary_settings.secrets())  # as every process's composition root does
    yield canary_settings


def test_run_errors_and_host_messages_carry_no_secret(db: Database, hidden: Settings) -> None:
    add_group(db, chat_jid="c@l", name="c", folder="c")
    run = create_run(db, chat_jid="c@l", cursor_from=0, cursor_to=0, celery_task_id=None)
    quoted = f"upstream: invalid key {hidden.provider.anthropic_api_key} (token {hidden.telegram.bot_token})"
    finish_run(db, run.id, state="failed", error=quoted)
    stored = get_run(db, run.id).error or ""
    assert leaks(stored) == [] and "upstream: invalid key [redacted]" in stored
    assert leaks(host_message(run_id=run.id, text=f"⚠️ Agent error: {quoted}").content) == []


def test_the_gateway_never_hands_the_container_its_key_in_an_upstream_error(tmp_path: Path) -> None:
    key = CANARIES["openai_api_key"]
    for fake_error in (
        api_error(401, "authentication_error", f"Incorrect API key provided: {key}."),
        api_error(403, "permission_error", f"key {key} has no access to this model"),
    ):
        fake = FakeAnthropic(fake_error)
        sock = tmp_path / f"g{fake_error[0]}.sock"
        with (
            fake.serve() as upstream,
            ModelGateway(sock, GatewayConfig(base_url=upstream, api_key=key, timeout_s=10)),
            httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://gateway") as client,
        ):
            r = client.post(
                "/v1/messages", json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
            )
        assert fake.calls[0].headers.get("x-api-key") == key  # it went upstream
        assert r.status_code == fake_error[0] and key not in r.text and "[redacted]" in r.text, r.text
