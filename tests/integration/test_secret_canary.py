"""The secret canary: every secret set to a unique value, hunted everywhere the system writes.

A real worker process (logging at DEBUG), a real agent container, the model gateway and a fake
Messages API that answers 401 *echoing the key it was sent*, as some providers do; the CLI;
the HTTP API (on a real uvicorn server, its event stream included) answering right and wrong
tokens, a webhook signed with the outbound secret, exports and runs.  No canary may appear in
the worker's log, the CLI's output, the run's error, the stored messages, the exports, the
recorded input, the event stream or any answer.  (The host-side units of the same rule:
tests/host/test_secrets.py.)
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from fakes.anthropic_api import FakeAnthropic, Recorded, api_error
from orchestrator.channels.webhook import INBOUND_PATH, inbound_headers
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.root import Orchestrator
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.runs import list_runs
from tests.live_server import serve

from .conftest import Stack

CHAT = "main@local"
CANARIES = {
    "ORCHESTRATOR_ANTHROPIC_API_KEY": "sk-ant-canary-anthropic-3f9d",
    "ORCHESTRATOR_OPENAI_API_KEY": "sk-canary-openai-3f9d",
    "ORCHESTRATOR_API_TOKEN": "canary-api-token-3f9d",
    "ORCHESTRATOR_WEBHOOK_SECRET": "canary-webhook-out-3f9d",
    "ORCHESTRATOR_WEBHOOK_INBOUND_SECRET": "canary-webhook-in-3f9d",
    "ORCHESTRATOR_TELEGRAM_BOT_TOKEN": "123456:canary-telegram-3f9d",
}


def leaks(text: str) -> list[str]:
    return [name for name, value in CANARIES.items() if value in text]


def _echo_the_key(rec: Recorded) -> tuple[int, object, dict[str, str]]:
    # As an OpenAI-compatible server does: "Incorrect API key provided: <the key>".
    return api_error(401, "authentication_error", f"invalid x-api-key: {rec.headers.get('x-api-key')}")


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_no_secret_appears_anywhere(stack: Stack) -> None:
    stack.env.update(CANARIES)
    stack.env["ORCHESTRATOR_LOG_LEVEL"] = "DEBUG"
    fake = FakeAnthropic(_echo_the_key, _echo_the_key, _echo_the_key)
    with fake.serve() as base_url:
        stack.env["ORCHESTRATOR_MODEL"] = "anthropic:claude-fake-1"
        stack.env["ORCHESTRATOR_ANTHROPIC_BASE_URL"] = base_url
        stack.start_worker()
        ensure_main_group(stack.db)
        sent = stack.cli("send", CHAT, "hello, what is the key?", "--wait", "90", "--json")
    # The attack reached the gateway: the key went upstream and came back in the error.
    assert fake.calls and all(
        c.headers.get("x-api-key") == CANARIES["ORCHESTRATOR_ANTHROPIC_API_KEY"] for c in fake.calls
    )
    [run] = list_runs(stack.db, chat_jid=CHAT)
    assert run.state == "failed" and "invalid x-api-key" in (run.error or ""), run.error
    seen: dict[str, str] = {
        "send": sent.stdout + sent.stderr,
        "run.error": run.error or "",
    }
    for name, args in {
        "history": ("history", CHAT, "--all", "--json"),
        "export json": ("export", CHAT, "--format", "json"),
        "export md": ("export", CHAT, "--format", "md"),
        "runs show": ("runs", "show", run.id, "--input"),
        "runs waiting": ("runs", "waiting", "--json"),
    }.items():
        done = stack.cli(*args)
        assert done.returncode == 0, (name, done.stderr)
        seen[name] = done.stdout + done.stderr
    assert "Agent error" in seen["history"]  # the failure is shown, cleaned

    settings = Settings.load(environ=stack.env, env_file=None)
    token = CANARIES["ORCHESTRATOR_API_TOKEN"]
    good, wrong = {"authorization": f"Bearer {token}"}, {"authorization": "Bearer not-the-token"}
    with serve(create_app(Orchestrator(settings))) as base:
        stream_text = _read_stream(f"{base}/api/chats/{CHAT}/stream", good)
        answers = {
            path: httpx.get(f"{base}{path}", headers=good, timeout=10)
            for path in [
                "/health",
                "/metrics",
                "/openapi.json",
                "/api/info",
                "/api/groups",
                f"/api/groups/{CHAT}",
                f"/api/chats/{CHAT}/messages?include_superseded=true",
                f"/api/chats/{CHAT}/export",
                f"/api/chats/{CHAT}/export?format=md",
                "/api/runs",
                f"/api/runs/{run.id}",
                f"/api/runs/{run.id}/input",
                "/api/hosts",
                "/api/runs/waiting",
            ]
        }
        for path, r in answers.items():
            assert r.status_code == 200, (path, r.status_code, r.text)
            seen[f"GET {path}"] = r.text + json.dumps(dict(r.headers))
        refused = {
            "wrong token": httpx.get(f"{base}/api/groups", headers=wrong),
            "no token": httpx.post(f"{base}/api/messages", content=b"{}"),
            "webhook with the outbound secret": httpx.post(
                f"{base}{INBOUND_PATH}",
                content=b'{"chat_jid":"main@local","sender":"x","content":"y"}',
                headers=inbound_headers(CANARIES["ORCHESTRATOR_WEBHOOK_SECRET"], b"{}"),
            ),
            "bad body": httpx.post(f"{base}/api/messages", content=b"{not json", headers=good),
        }
        for name, r in refused.items():
            assert 400 <= r.status_code < 500, (name, r.status_code)
            seen[name] = r.text + json.dumps(dict(r.headers))
    seen["stream"] = stream_text
    assert "Agent error" in stream_text, stream_text  # the stream did carry the chat
    seen["worker log"] = "\n".join(p.read_text(errors="replace") for p in stack.logs)
    assert "DEBUG" in seen["worker log"] and run.id in seen["worker log"]

    found = {where: leaks(text) for where, text in seen.items() if leaks(text)}
    assert found == {}, found


def _read_stream(url: str, headers: dict[str, str], seconds: float = 2.0) -> str:
    """What a chat's event stream sends in ``seconds`` (it never ends by itself)."""
    text: list[str] = []

    def read() -> None:
        try:
            with httpx.stream("GET", url, headers=headers, timeout=seconds + 5) as r:
                for chunk in r.iter_text():
                    text.append(chunk)
        except httpx.HTTPError:
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(seconds)
    return "".join(text)
