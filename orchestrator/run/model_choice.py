"""The model a run asks for: ``ORCHESTRATOR_MODEL`` (or a replay's model, spelled the same) as
the ``ModelSettings`` of the run's input, with the host's output cap and thinking budget."""

from __future__ import annotations

import msgspec

from agent_runner.protocol import ModelSettings
from orchestrator.core.errors import ConfigError
from orchestrator.core.settings import Settings


def model_settings(settings: Settings) -> ModelSettings:
    spec = settings.model.strip()
    if spec == "offline":
        return ModelSettings(provider="offline", model="offline", max_tokens=settings.max_tokens)
    provider, _, model = spec.partition(":")
    if provider == "anthropic" and model:
        thinking = settings.thinking_budget or msgspec.UNSET  # unset: off, and left out of the input
        return ModelSettings(
            provider="anthropic", model=model, max_tokens=settings.max_tokens, thinking_budget=thinking
        )
    if provider == "openai" and model:
        return ModelSettings(provider="openai", model=model, max_tokens=settings.max_tokens)
    if provider == "claude-code" and model:
        return ModelSettings(
            provider="claude-code",
            model=model,
            max_tokens=settings.max_tokens,
            thinking_budget=settings.thinking_budget or msgspec.UNSET,
        )
    raise ConfigError(
        f"ORCHESTRATOR_MODEL={spec!r}: use 'offline', 'anthropic:<model id>', "
        "'openai:<model id>' or 'claude-code:<model id>'"
    )
