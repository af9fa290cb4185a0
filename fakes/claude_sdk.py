"""A stand-in for ``claude_agent_sdk`` with the few names ``agent_runner/claude_code/agent.py``
uses: it records what a run offered the CLI (its options, its MCP servers) and its client
plays the CLI calling our MCP tools.  The SDK itself is only in the claude-code image variant;
the real one is driven in tests/integration/test_claude_code_sandbox.py.

Put in ``sys.modules["claude_agent_sdk"]`` (``monkeypatch.setitem``) before a run.
"""

from __future__ import annotations

import types
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ResultMessage:
    subtype: str = "success"
    is_error: bool = False
    num_turns: int = 1
    session_id: str = "sess-1"
    stop_reason: str | None = "end_turn"
    usage: dict[str, Any] | None = field(default_factory=dict)
    result: str | None = None


@dataclass
class SdkTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    handler: Any


class FakeSdk(types.ModuleType):
    """Each turn, the fake CLI makes ``calls`` ((tool name, arguments), in order) of the tools
    the run's MCP server offers it (a call of a tool not offered is not made), then ends with
    a result."""

    def __init__(self, calls: list[tuple[str, dict[str, Any]]] | None = None) -> None:
        super().__init__("claude_agent_sdk")
        self.calls = calls if calls is not None else []
        self.options: Any = None
        self.servers: list[tuple[str, list[SdkTool]]] = []
        self.replies: list[dict[str, Any]] = []
        self.ClaudeSDKError = type("ClaudeSDKError", (Exception,), {})
        sdk = self

        class Client:
            def __init__(self, options: Any) -> None:
                sdk.options = options

            async def connect(self) -> None:
                return None

            async def disconnect(self) -> None:
                return None

            async def query(self, prompt: Any) -> None:
                return None

            async def receive_response(self) -> AsyncIterator[Any]:
                offered = {t.name: t for server in sdk.options.mcp_servers.values() for t in server["tools"]}
                for name, args in sdk.calls:
                    if name in offered:
                        sdk.replies.append(await offered[name].handler(args))
                yield ResultMessage()

        self.ClaudeSDKClient = Client

    @staticmethod
    def tool(name: str, description: str, input_schema: dict[str, Any]) -> Any:
        return lambda handler: SdkTool(name, description, input_schema, handler)

    def create_sdk_mcp_server(self, name: str, tools: list[SdkTool]) -> dict[str, Any]:
        self.servers.append((name, tools))
        return {"name": name, "tools": tools}

    @staticmethod
    def ClaudeAgentOptions(**kwargs: Any) -> Any:  # noqa: N802 - the SDK's class name
        return types.SimpleNamespace(**kwargs)

    @staticmethod
    def HookMatcher(**kwargs: Any) -> Any:  # noqa: N802 - the SDK's class name
        return types.SimpleNamespace(**kwargs)
