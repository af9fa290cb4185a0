"""What the model gateway's clients send, recorded: the source of its allowlists.

The gateway forwards only the request headers, ``anthropic-beta`` values,
top-level fields and tool types its clients were seen to send
(``orchestrator/sandbox/gateway/allowlists.py``: ``ANTHROPIC_HEADERS``,
``ANTHROPIC_BETAS``, ``ANTHROPIC_FIELDS``, ``OPENAI_HEADERS``,
``OPENAI_FIELDS``, ...).  This module records them: it runs each client in
the real agent image, hardened as a run is (no network, read-only root),
with a recording fake (``fakes``) on the socket where the gateway
would be, and the fake playing a model that calls a tool, so that a first
request and one carrying a tool's result are both seen:

* the pinned Claude Code CLI (the claude-code image variant), for each model
  name in ``--model`` (the CLI's betas depend on the model), with thinking
  on and off;
* our own providers, ``anthropic`` and ``openai`` (the agent image).

When the pin moves (``container/requirements-claude-code.txt``), rebuild the
images and run it, then bring the lists in allowlists.py up to date::

    .venv/bin/python -m tests.gateway_wire [--model M]...

It prints the recorded sets (less the headers the gateway sets itself) and
what allowlists.py does not allow of them;
tests/integration/test_gateway_allowlist_sandbox.py proves that the CLI
passes the gateway as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_runner.protocol import ContainerInput, ModelSettings, SdkMessage
from fakes.anthropic_api import FakeAnthropic, Recorded, Reply, message
from fakes.openai_api import FakeOpenAI, chat, tool_call
from orchestrator.core.settings import Settings
from orchestrator.sandbox.containers import GATEWAY_MOUNT, ContainerSpec, DockerSandbox
from orchestrator.sandbox.image import ensure_agent_image, image_name

SOCKET = "model.sock"
PROMPT = "please run the command"
# The CLI's betas and fields differ by model: names it knows, of each family and generation, and
# one it does not (what a model newer than the pin is to it: it sends the most).
CLI_MODELS = (
    "claude-sonnet-4-5",
    "claude-sonnet-4-6",
    "claude-sonnet-4-20250514",
    "claude-opus-4-1",
    "claude-opus-4-5",
    "claude-opus-4-6",
    "claude-haiku-4-5",
    "claude-3-7-sonnet-20250219",
    "claude-next-1",
)
THINKING_BUDGET = 2048


@dataclass
class Wire:
    """Everything one API's clients were seen to send."""

    paths: set[str] = field(default_factory=set)  # with their query strings
    headers: set[str] = field(default_factory=set)  # lower-cased names
    betas: set[str] = field(default_factory=set)  # anthropic-beta values, one by one
    fields: set[str] = field(default_factory=set)  # top-level keys of the JSON body
    tool_types: set[str | None] = field(default_factory=set)  # each tool's "type" (None: none)
    tool_keys: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def see(self, rec: Recorded) -> None:
        with self.lock:
            self.paths.add(rec.path)
            self.headers.update(rec.headers)
            for value in rec.headers.get("anthropic-beta", "").split(","):
                if value.strip():
                    self.betas.add(value.strip())
            if isinstance(rec.body, dict):
                self.fields.update(rec.body)
                for tool in rec.body.get("tools") or []:
                    if isinstance(tool, dict):
                        self.tool_types.add(tool.get("type"))
                        self.tool_keys.update(tool)

    def merge(self, other: Wire) -> None:
        for name in ("paths", "headers", "betas", "fields", "tool_types", "tool_keys"):
            getattr(self, name).update(getattr(other, name))


def _last_user(body: Any) -> dict[str, Any]:
    """The request's last user message (the CLI may send a system message after it)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    users = [m for m in messages or [] if isinstance(m, dict) and m.get("role") == "user"]
    return users[-1] if users else {}


def anthropic_model(rec: Recorded) -> Reply:
    """A model that has the agent run one command, then answers (any number of requests)."""
    last = _last_user(rec.body)
    content = last.get("content")
    if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
        return message([{"type": "text", "text": "done: recorded"}], "end_turn", n=2)
    if PROMPT in json.dumps(last):
        name = "Bash" if any(t.get("name") == "Bash" for t in rec.body.get("tools") or []) else "bash"
        call = {
            "type": "tool_use",
            "id": f"toolu_{uuid.uuid4().hex[:8]}",
            "name": name,
            "input": {"command": "echo recorded", "description": "Echo"},
        }
        return message([{"type": "text", "text": "running it"}, call], "tool_use", n=1)
    return message([{"type": "text", "text": "(not scripted)"}], "end_turn", n=1)


def openai_model(rec: Recorded) -> tuple[int, Any, dict[str, str]]:
    messages = rec.body.get("messages", []) if isinstance(rec.body, dict) else []
    if messages and messages[-1].get("role") == "tool":
        return chat("done: recorded", n=2)
    return chat(None, [tool_call("call_1", "bash", {"command": "echo recorded"})], n=1)


@contextmanager
def _open_to_the_sandbox(fake: FakeAnthropic | FakeOpenAI, path: Path) -> Iterator[None]:
    """``fake`` served on the unix socket ``path``, which the container's user may connect to."""
    with fake.serve_unix(str(path)):
        os.chmod(path, 0o666)
        yield


def run_in_sandbox(
    settings: Settings,
    image: str,
    model: ModelSettings,
    fake: FakeAnthropic | FakeOpenAI,
    timeout_s: float = 240,
) -> list[dict[str, Any]]:
    """One run of the real runner in ``image``, hardened as the pipeline starts it, its model
    reached on ``/run/gateway/model.sock`` where ``fake`` answers (no gateway); returns its events."""
    folder = Path(tempfile.mkdtemp(prefix="wire", dir="/tmp"))  # short: a socket's path has ~107 bytes
    os.chmod(folder, 0o755)
    workspace = settings.groups_dir / f"wire-{uuid.uuid4().hex[:6]}"
    workspace.mkdir(parents=True)
    payload = ContainerInput(
        run_id=f"wire-{uuid.uuid4().hex[:8]}",
        chat_jid="wire@local",
        group_folder=workspace.name,
        assistant_name="Andy",
        messages=[SdkMessage(role="user", content=PROMPT)],
        model=model.replace(socket_path=f"{GATEWAY_MOUNT}/{SOCKET}"),
    )
    spec = ContainerSpec(
        image=image,
        name=f"orch-wire-{payload.run_id}",
        workspace=workspace,
        run_id=payload.run_id,
        group_folder=workspace.name,
        memory="1g",
        timeout_s=timeout_s,
        install_id=settings.install_id,
        readonly_mounts={str(folder): GATEWAY_MOUNT},
    )
    try:
        with (
            _open_to_the_sandbox(fake, folder / SOCKET),
            DockerSandbox(settings).start(spec, payload.to_json()) as container,
        ):
            events = [json.loads(line) for line in container.lines() if line.strip()]
            ended = container.finish()
    finally:
        for made in (folder, workspace):
            shutil.rmtree(made, ignore_errors=True)
    scripted = any(e.get("type") == "tool_result" and "recorded" in str(e.get("output")) for e in events)
    if ended.status_code != 0 or not events or events[-1].get("type") != "result" or not scripted:
        raise RuntimeError(f"the {model.provider} run failed ({ended.status_code}): {events[-3:]}\n{ended.stderr_tail}")
    return events


def record_claude_code(settings: Settings, image: str, models: tuple[str, ...] = CLI_MODELS) -> Wire:
    wire = Wire()
    for name in models:
        for thinking in (THINKING_BUDGET, None):
            fake = FakeAnthropic(*([anthropic_model] * 20), on_request=wire.see)
            model = ModelSettings(provider="claude-code", model=name, max_tokens=8192)
            if thinking:
                model = model.replace(thinking_budget=thinking)
            run_in_sandbox(settings, image, model, fake)
    return wire


def record_providers(settings: Settings, image: str) -> tuple[Wire, Wire]:
    """What our anthropic (thinking on and off) and openai providers send."""
    anthropic_wire, openai_wire = Wire(), Wire()
    for thinking in (THINKING_BUDGET, None):
        fake = FakeAnthropic(*([anthropic_model] * 4), on_request=anthropic_wire.see)
        model = ModelSettings(provider="anthropic", model="claude-sonnet-4-5", max_tokens=8192)
        if thinking:
            model = model.replace(thinking_budget=thinking)
        run_in_sandbox(settings, image, model, fake)
    openai = FakeOpenAI(*([openai_model] * 4), on_request=openai_wire.see)
    run_in_sandbox(settings, image, ModelSettings(provider="openai", model="llama3.1:8b", max_tokens=1024), openai)
    return anthropic_wire, openai_wire


# Headers the gateway sets itself (the framing, its own client's encodings, the key): never passed on.
GATEWAY_OWN = frozenset({"host", "content-length", "connection", "accept-encoding", "x-api-key", "authorization"})


def _show(title: str, wire: Wire, allowed: dict[str, frozenset[Any]]) -> None:
    print(f"== {title}")
    for name in ("paths", "headers", "betas", "fields", "tool_types", "tool_keys"):
        seen = getattr(wire, name) - (GATEWAY_OWN if name == "headers" else set())
        print(f"{name}: {json.dumps(sorted(seen, key=str))}")
        if name in allowed and (missing := seen - allowed[name]):
            print(f"  NOT ALLOWED by allowlists.py: {sorted(missing, key=str)}")


def main(argv: list[str] | None = None) -> None:
    from orchestrator.sandbox.containers import docker_client
    from orchestrator.sandbox.gateway import allowlists as gw

    parser = argparse.ArgumentParser(prog="python -m tests.gateway_wire", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", help=f"a model name for the CLI (default: {CLI_MODELS})")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="wire-data") as data:
        settings = Settings.load(data_dir=Path(data), env_file=None)
        settings.ensure_dirs()
        client = docker_client(settings)
        ensure_agent_image(client, settings)
        ensure_agent_image(client, settings, variant="claude-code")
        cli = record_claude_code(settings, image_name(settings, "claude-code"), tuple(args.model or CLI_MODELS))
        anthropic_wire, openai_wire = record_providers(settings, settings.sandbox.agent_image)
    both = Wire()
    both.merge(cli)
    both.merge(anthropic_wire)
    _show("Claude Code CLI", cli, {})
    _show("our anthropic provider", anthropic_wire, {})
    _show(
        "Messages API, both (what allowlists.py must allow)",
        both,
        {
            "headers": gw.ANTHROPIC_HEADERS,
            "betas": gw.ANTHROPIC_BETAS,
            "fields": gw.ANTHROPIC_FIELDS,
            "tool_types": gw.ANTHROPIC_TOOL_TYPES,
        },
    )
    _show(
        "our openai provider (what allowlists.py must allow)",
        openai_wire,
        {"headers": gw.OPENAI_HEADERS, "fields": gw.OPENAI_FIELDS, "tool_types": gw.OPENAI_TOOL_TYPES},
    )


if __name__ == "__main__":
    main()
