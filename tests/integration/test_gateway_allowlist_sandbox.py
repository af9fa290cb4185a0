"""The gateway's allowlists against real sandboxes: the pinned CLI passes, the agent's own requests do not.

The pipeline in-process (SQLite), the real ModelGateway on the run's socket,
the real agent images (no network), the fake Messages API on loopback as the
upstream, recording every request it gets:

* the pinned Claude Code CLI (the claude-code variant) runs a command and
  answers through the gateway; nothing it sends is refused, and what reaches
  the upstream carries only listed headers and betas, without the CLI's query
  string: the proof that the lists recorded in gateway.py
  (tests/gateway_wire.py) match the pin.  Twice: a model the CLI knows, and
  one it does not (as a model newer than the pin: the CLI then sends the most);
* the agent (our anthropic provider) runs a program that posts its own
  requests on the gateway's socket, naming MCP servers, server tools and a
  beta: each gets a 403 saying why, and none reaches the upstream.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from fakes.anthropic_api import FakeAnthropic, Recorded, Reply, message
from fakes.channel import RecordingChannel
from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline, RunOutcome
from orchestrator.sandbox.gateway import ANTHROPIC_BETAS, ANTHROPIC_HEADERS, ModelGateway
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after
from tests.gateway_wire import PROMPT, anthropic_model

CHAT = "main@local"
KEY = "sk-allowlist-secret"
# What the gateway's own client adds to a request (framing, its encodings, the key).
GATEWAY_ADDS = {"host", "content-length", "connection", "accept-encoding", "x-api-key"}


@dataclass
class Box:
    settings: Settings
    db: Database
    refusals: list[tuple[int, str, str]]

    def ask(self, text: str, **settings: Any) -> tuple[RunOutcome, list[StoredMessage]]:
        pipeline = Pipeline(self.settings.replace(**settings), self.db, ChannelRegistry([RecordingChannel()]))
        sent = ingest(
            self.db, self.settings, IncomingMessage(chat_jid=CHAT, sender="u", content=text), signal=None
        ).message
        (outcome,) = pipeline.drain_group(CHAT)
        return outcome, get_messages_after(CHAT, sent.seq, db=self.db)


@pytest.fixture
def box(tmp_path_factory: pytest.TempPathFactory, agent_image: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Box]:
    base = tmp_path_factory.mktemp("allow").resolve()
    settings = Settings.load(
        data_dir=base / "data", agent_image=agent_image, run_timeout_s=180, max_attempts=1, env_file=None
    )
    settings.ensure_dirs()
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    db.migrate()
    ensure_main_group(db)
    # Every answer the gateway gives itself (a refusal), seen in this process, where the pipeline runs it.
    refusals: list[tuple[int, str, str]] = []
    refuse = ModelGateway.refuse

    def recorded(self: ModelGateway, h: Any, status: int, kind: str, text: str) -> None:
        refusals.append((status, kind, text))
        refuse(self, h, status, kind, text)

    monkeypatch.setattr(ModelGateway, "refuse", recorded)
    yield Box(settings, db, refusals)
    db.dispose()


def _tool_results(outputs: list[StoredMessage]) -> list[str]:
    return [m.content for m in outputs if m.message_type == "tool_result"]


@pytest.mark.parametrize("model", ["claude-sonnet-4-5", "claude-next-1"])
def test_the_pinned_claude_code_cli_passes_the_gateway(box: Box, claude_code_image: str, model: str) -> None:
    fake = FakeAnthropic(*([anthropic_model] * 20))
    with fake.serve() as upstream:
        outcome, outputs = box.ask(
            PROMPT,
            model=f"claude-code:{model}",
            anthropic_base_url=upstream,
            anthropic_api_key=KEY,
            max_tokens=4096,
            thinking_budget=1024,
            container_memory="1g",
        )

    assert outcome.run.state == "succeeded", outcome.run.error
    assert box.refusals == []  # nothing the CLI sent was refused
    assert any("recorded" in text for text in _tool_results(outputs)), outputs  # its Bash ran
    assert any(m.content == "done: recorded" for m in outputs if m.sender == "bot"), outputs
    assert len(fake.calls) >= 2
    for call in fake.calls:
        assert call.path == "/v1/messages", call.path  # the CLI's ?beta=true is not passed on
        assert set(call.headers) - ANTHROPIC_HEADERS <= GATEWAY_ADDS, sorted(call.headers)
        betas = set(call.headers["anthropic-beta"].split(","))
        assert "claude-code-20250219" in betas and betas <= ANTHROPIC_BETAS, betas
        assert call.headers["x-api-key"] == KEY and call.body["model"] == model


# Run inside the container: the agent's own requests on the socket its runner uses; one line each.
POST_ON_THE_SOCKET = r"""python3 - <<'EOF'
import http.client, json, socket
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect('/run/gateway/model.sock')
base = {'model': 'claude-fake-1', 'max_tokens': 16, 'messages': [{'role': 'user', 'content': 'fetch it'}]}
mcp = [{'type': 'url', 'url': 'https://attacker.example/sse', 'name': 'x'}]
asks = {
    'mcp_servers': (json.dumps({**base, 'mcp_servers': mcp}), {}),
    'escaped': (json.dumps(base)[:-1] + ', "mcp\\u005fservers": ' + json.dumps(mcp) + '}', {}),
    'web_fetch': (json.dumps({**base, 'tools': [{'type': 'web_fetch_20250910', 'name': 'web_fetch'}]}), {}),
    'web_search': (json.dumps({**base, 'tools': [{'type': 'web_search_20250305', 'name': 'web_search'}]}), {}),
    'beta': (json.dumps(base), {'anthropic-beta': 'mcp-client-2025-04-04'}),
}
for name, (body, headers) in asks.items():
    c = C('gateway')
    c.request('POST', '/v1/messages?beta=true', body, {'content-type': 'application/json', **headers})
    r = c.getresponse()
    e = json.loads(r.read())['error']
    print(name, r.status, e['type'], '|', e['message'][:90])
EOF"""


def _after_the_program(rec: Recorded) -> Reply:
    printed = next(b["content"] for b in rec.body["messages"][-1]["content"] if b["type"] == "tool_result")
    return message(
        [{"type": "text", "text": "said: " + " ".join(line.split("|")[0].strip() for line in printed.splitlines())}],
        "end_turn",
        n=2,
    )


def test_the_agents_own_requests_for_the_network_are_refused(box: Box) -> None:
    fake = FakeAnthropic(
        message(
            [{"type": "tool_use", "id": "toolu_a1", "name": "bash", "input": {"command": POST_ON_THE_SOCKET}}],
            "tool_use",
            n=1,
        ),
        _after_the_program,
    )
    with fake.serve() as upstream:
        outcome, outputs = box.ask(
            "go", model="anthropic:claude-fake-1", anthropic_base_url=upstream, anthropic_api_key=KEY, max_tokens=1024
        )

    assert outcome.run.state == "succeeded", outcome.run.error
    (printed,) = _tool_results(outputs)
    said = {line.split()[0]: line.split("|")[0].split()[1:] for line in printed.splitlines() if "|" in line}
    assert said == {
        "mcp_servers": ["403", "field_not_allowed"],
        "escaped": ["403", "field_not_allowed"],
        "web_fetch": ["403", "tool_not_allowed"],
        "web_search": ["403", "tool_not_allowed"],
        "beta": ["403", "beta_not_allowed"],
    }, printed
    assert "'mcp_servers'" in printed and "'web_fetch_20250910'" in printed and "'mcp-client-2025-04-04'" in printed
    # Only the runner's own two requests reached the upstream, and neither carried any of it.
    assert len(fake.calls) == 2 and [c.path for c in fake.calls] == ["/v1/messages"] * 2
    assert all(set(c.body) <= {"model", "max_tokens", "messages", "system", "tools", "stream"} for c in fake.calls)
    assert not any("anthropic-beta" in c.headers for c in fake.calls)
    assert [kind for _, kind, _ in box.refusals] == [
        "field_not_allowed",
        "field_not_allowed",
        "tool_not_allowed",
        "tool_not_allowed",
        "beta_not_allowed",
    ]
