"""The model providers as the runner knows them: one row each, how it answers a run.

``ModelSettings.provider`` picks a row of :data:`PROVIDERS`, never a comparison of names.
A row is one of two kinds: a :class:`TurnLoop` provider makes one model call at a time
(a :class:`~agent_runner.providers.base.Provider`) and the runner's own turn loop
(``loop.py``) calls it, runs the tools and emits the events; an :class:`OwnLoop`
provider runs the whole turn loop itself (``claude-code``: the Claude Agent SDK).

Each row imports its code only when it is used: the offline model starts fast and
works where no SDK is installed, and the Claude Agent SDK is only in the ``claude-code``
image variant.  Adding a provider is one row here and one in the host's table
(``orchestrator/sandbox/providers.py``), with its name in :data:`ProviderName` and in
the protocol; ``tests/host/test_providers.py`` holds both tables to the protocol's names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from .loop import Emit, run_agent
from .protocol import ContainerInput, ModelSettings
from .providers.base import Provider

# ``ModelSettings.provider``'s words (protocol/input.py; the test holds the two equal).
ProviderName = Literal["offline", "anthropic", "openai", "claude-code"]


@dataclass(frozen=True, slots=True)
class TurnLoop:
    """A provider of one model call at a time, called by the runner's turn loop."""

    # The provider for a run's model settings and assistant name.
    build: Callable[[ModelSettings, str], Provider]

    def run(self, inp: ContainerInput, emit: Emit, workspace: Path) -> None:
        run_agent(inp, self.build(inp.model, inp.assistant_name), emit, workspace=workspace)


@dataclass(frozen=True, slots=True)
class OwnLoop:
    """A provider that runs the whole turn loop itself, tools included, and emits the events."""

    run_turns: Callable[[ContainerInput, Emit, Path], object]

    def run(self, inp: ContainerInput, emit: Emit, workspace: Path) -> None:
        self.run_turns(inp, emit, workspace)


def _offline(settings: ModelSettings, assistant_name: str) -> Provider:
    from .providers.offline import OfflineProvider

    return OfflineProvider(assistant_name=assistant_name)


def _anthropic(settings: ModelSettings, assistant_name: str) -> Provider:
    from .providers.anthropic import AnthropicProvider

    return AnthropicProvider(settings)


def _openai(settings: ModelSettings, assistant_name: str) -> Provider:
    from .providers.openai_compat import OpenAICompatProvider

    return OpenAICompatProvider(settings)


def _claude_code(inp: ContainerInput, emit: Emit, workspace: Path) -> object:
    from .claude_code.agent import run_claude_code

    return run_claude_code(inp, emit, workspace=workspace)


PROVIDERS: Mapping[ProviderName, TurnLoop | OwnLoop] = MappingProxyType(
    {
        "offline": TurnLoop(_offline),
        "anthropic": TurnLoop(_anthropic),
        # Any OpenAI-compatible Chat Completions server.
        "openai": TurnLoop(_openai),
        "claude-code": OwnLoop(_claude_code),
    }
)


def make_provider(settings: ModelSettings, *, assistant_name: str) -> Provider:
    """The :class:`Provider` ``settings.provider`` names, for the runner's turn loop;
    ``ValueError`` for a provider that runs its own loop."""
    row = PROVIDERS[settings.provider]
    if not isinstance(row, TurnLoop):
        raise ValueError(f"provider {settings.provider!r} is not a provider of the built-in loop")
    return row.build(settings, assistant_name)
