"""The model: which provider runs the agent, and the gateway that holds every request to it."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from msgspec import Meta

from orchestrator.core.errors import SettingsError
from orchestrator.core.settings.env import ENV_PREFIX
from orchestrator.core.settings.section import Section


class ProviderSettings(Section, kw_only=True):
    """Which model runs the agent and how it is reached: the provider, its keys (the gateway's alone) and what one run may ask of it."""

    prefix: ClassVar[str] = ""

    # "offline" (no network, deterministic), "anthropic:<model id>",
    # "openai:<model id>" (any OpenAI-compatible Chat Completions server) or
    # "claude-code:<model id>" (Claude Code, the Claude Agent SDK, drives the
    # run in the agent image's claude-code variant; reaches the Messages API
    # through the same gateway with the anthropic_* settings below).
    model: Annotated[str, Meta(description="`offline`, `anthropic:MODEL`, `openai:MODEL` or `claude-code:MODEL`")] = (
        "offline"
    )
    anthropic_base_url: Annotated[
        str, Meta(description="the Messages API's root the gateway sends Anthropic requests to")
    ] = "https://api.anthropic.com"
    anthropic_api_key: Annotated[
        str, Meta(description="the Anthropic key the gateway adds (never inside a sandbox)")
    ] = ""
    # The OpenAI-compatible server's root (a trailing /v1 is accepted): a
    # local Ollama by default; vLLM, llama.cpp's server or
    # https://api.openai.com work the same.  The key is optional (sent as a
    # bearer token by the gateway; local servers need none).
    openai_base_url: Annotated[
        str, Meta(description="an OpenAI-compatible server's root (a trailing /v1 is accepted)")
    ] = "http://127.0.0.1:11434"
    openai_api_key: Annotated[
        str, Meta(description="the bearer token the gateway adds for the OpenAI-compatible server (optional)")
    ] = ""
    # Output tokens of one model answer.  The gateway holds every request to it
    # (and to the model above), whatever the container asks for.
    max_tokens: Annotated[int, Meta(ge=1, description="output tokens of one model answer, held by the gateway")] = 1024
    # Model calls in one run: enough for a real task's dozens of tool calls.  The
    # token budget and the run's time limit are what bound a run in practice; a
    # run stopped by any of them says so in the chat, naming the setting.
    max_turns: Annotated[int, Meta(ge=1, description="model calls in one run")] = 50
    # Tokens (input + output) one run may spend through the model gateway; 0: no
    # limit.  A million: some 50 turns over a 20k-token context.
    run_token_budget: Annotated[
        int, Meta(ge=0, description="tokens (input + output) one run may spend; 0: no limit")
    ] = 1_000_000
    # Anthropic extended thinking: the tokens each answer may think with (the API's
    # budget_tokens, at least 1024 and below max_tokens); 0: off.  Thinking is
    # stored (sender "thinking") and shown muted on the page, never sent to
    # channels nor shown to the model again.  Other providers ignore it.
    thinking_budget: Annotated[
        int,
        Meta(ge=0, description="Anthropic extended thinking's tokens per answer (1024 up to below max_tokens); 0: off"),
    ] = 0
    # The models that see images (comma-separated shell patterns, matched against the model
    # id without its provider, case-insensitive): a person's images go to them as image
    # blocks, scaled in the sandbox (agent_runner/images.py); any other model reads the
    # images' names and paths only.  "offline" reports what it was shown (/images).
    vision_models: Annotated[str, Meta(description="models that see images, as shell patterns (comma separated)")] = (
        "claude-*,gpt-4o*,gpt-4.1*,gpt-5*,offline"
    )

    def __post_init__(self) -> None:
        # The gateway appends the request's path (/v1/chat/completions).
        self.openai_base_url = self.openai_base_url.strip().rstrip("/").removesuffix("/v1")
        if self.thinking_budget and not 1024 <= self.thinking_budget < self.max_tokens:
            # The API's own bounds: refused here rather than by every request of every run.
            raise SettingsError(
                f"{ENV_PREFIX}THINKING_BUDGET={self.thinking_budget}: at least 1024 and below "
                f"{ENV_PREFIX}MAX_TOKENS ({self.max_tokens}), which bounds thinking and answer together; "
                "0 turns thinking off"
            )


class GatewaySettings(Section, kw_only=True):
    """The model gateway's limits on what a sandbox can make the host spend (orchestrator/sandbox/gateway/)."""

    prefix: ClassVar[str] = "gateway_"

    # What the model gateway does with a request that names another model, or
    # asks for more than max_tokens: "refuse" it (403, saying what is allowed),
    # or "rewrite" it to the host's model and cap (for clients that pick models
    # themselves).  Either way the container never chooses what a run costs.
    model_policy: Annotated[
        Literal["refuse", "rewrite"],
        Meta(description="a request naming another model or more tokens: refuse it (403) or rewrite it"),
    ] = "refuse"
    # The model gateway's limits on what a sandbox can make the host spend
    # (orchestrator/sandbox/gateway/).  The largest request body it reads; a larger
    # Content-Length is refused (413) before any byte of the body is read.
    max_request_bytes: Annotated[int, Meta(ge=1024, description="the largest request body the model gateway reads")] = (
        32 * 1024 * 1024
    )
    # Connections served at once (one host thread each); more are closed at once.
    max_connections: Annotated[int, Meta(ge=1, description="connections the model gateway serves at once")] = 16
    # How long a connection may send nothing (request line, headers, body, the
    # wait for a keep-alive's next request) before the gateway closes it.
    read_timeout_s: Annotated[
        float, Meta(gt=0, description="seconds a gateway connection may send nothing before it is closed")
    ] = 30.0
    # Requests with a server tool a group's network policy opens (the provider's web search)
    # one run may make: their fees are not tokens, so the token budget does not bound them.
    max_server_tool_requests: Annotated[
        int, Meta(ge=0, description="requests with a provider's server tool (web search) one run may make")
    ] = 20
