"""The model providers as the host sees them: one row of facts each.

A run's recorded input names its provider (``agent_runner.protocol.ModelSettings.provider``),
and ``ORCHESTRATOR_MODEL`` spells it (``offline``, ``anthropic:<model id>``).  What the
host does differently for a provider is read from its row in :data:`PROVIDERS`, never
from a comparison of names: whether the run gets a model gateway and which upstream API
it forwards to (``sandbox/gateway/upstream.py``), which image variant its container runs
(``sandbox/image.py``), whether it keeps a session folder (``sandbox/sessions.py``),
whether it is sent image blocks (``run/run_files.py``), and how ``ORCHESTRATOR_MODEL``
names its model (``run/model_choice.py``).

Adding a provider is one row here and one in the runner's table
(``container/agent_runner/provider_registry.py``), with its name in
:data:`ProviderName` and in the protocol; ``tests/host/test_providers.py`` holds both
tables to the protocol's names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

# ``ModelSettings.provider``'s words (agent_runner/protocol/input.py; the test holds the two equal).
ProviderName = Literal["offline", "anthropic", "openai", "claude-code"]
# The APIs the model gateway forwards to (sandbox/gateway/upstream.py: ``UPSTREAMS``).
GatewayRoute = Literal["anthropic", "openai"]


@dataclass(frozen=True, slots=True)
class ProviderFacts:
    """What a run with one provider needs of the host."""

    # The API the run's model gateway forwards to; None: the run gets no gateway (its
    # model answers inside the container, with no network).
    gateway: GatewayRoute | None
    # ``ORCHESTRATOR_MODEL`` names a model after the provider (``anthropic:<model id>``);
    # False: the provider's name alone, which is also its model's.
    takes_model_id: bool = True
    # ``ORCHESTRATOR_THINKING_BUDGET`` is passed on (the Messages API's extended thinking).
    thinks: bool = False
    # The agent image variant its container runs (None: the agent image itself).
    image_variant: str | None = None
    # It keeps a transcript of its own, in the group's session folder (``/session``).
    keeps_session: bool = False
    # Its wire format takes image blocks from the runner (``run/run_files.py``); False:
    # it reads images itself, from the paths the notice names (Claude Code's Read tool).
    image_blocks: bool = True
    # It takes the answer to its ``ask_user`` as the call's result in the next run
    # (``run/questions.py``); False: as the next message (a resumed Claude Code session
    # cannot be handed a result for a call of an earlier process).
    answers_as_tool_result: bool = True


PROVIDERS: Mapping[ProviderName, ProviderFacts] = MappingProxyType(
    {
        "offline": ProviderFacts(gateway=None, takes_model_id=False),
        "anthropic": ProviderFacts(gateway="anthropic", thinks=True),
        # Any OpenAI-compatible Chat Completions server.
        "openai": ProviderFacts(gateway="openai"),
        # Claude Code speaks the Messages API too; its SDK and CLI are in an image variant.
        "claude-code": ProviderFacts(
            gateway="anthropic",
            thinks=True,
            image_variant="claude-code",
            keeps_session=True,
            image_blocks=False,
            answers_as_tool_result=False,
        ),
    }
)


def provider_named(word: str) -> ProviderName | None:
    """``word`` as a provider's name (None: no provider is called that)."""
    return next((name for name in PROVIDERS if name == word), None)


def facts_of(word: str) -> ProviderFacts | None:
    """The row of the provider called ``word`` (None: no provider is called that)."""
    name = provider_named(word)
    return None if name is None else PROVIDERS[name]


def split_spec(spec: str) -> tuple[str, str]:
    """An ``ORCHESTRATOR_MODEL`` value as (provider, model id): ``anthropic:claude-x`` is
    ``("anthropic", "claude-x")``, ``offline`` is ``("offline", "")``.  The words are not
    checked here (``run/model_choice.py`` refuses a value that names no provider)."""
    provider, _, model = spec.strip().partition(":")
    return provider, model


def model_spec(provider: str, model: str) -> str:
    """How ``ORCHESTRATOR_MODEL`` spells a provider's model: ``anthropic:claude-x``, or the
    name alone for a provider that takes no model id (``offline``)."""
    facts = facts_of(provider)
    return provider if facts is not None and not facts.takes_model_id else f"{provider}:{model}"


def spellings() -> str:
    """The values ``ORCHESTRATOR_MODEL`` takes, for an error message."""
    shown = [f"'{name}:<model id>'" if facts.takes_model_id else f"'{name}'" for name, facts in PROVIDERS.items()]
    return f"{', '.join(shown[:-1])} or {shown[-1]}"
