"""The model a run asks for: ``ORCHESTRATOR_MODEL`` (or a replay's model, spelled the same) as
the ``ModelSettings`` of the run's input, with the host's output cap and thinking budget.
How each provider's model is spelled, and whether it thinks, is its row in
``orchestrator/sandbox/providers.py``."""

from __future__ import annotations

import msgspec

from agent_runner.protocol import ModelSettings
from orchestrator.core.errors import ConfigError
from orchestrator.core.settings import Settings
from orchestrator.sandbox.providers import PROVIDERS, provider_named, spellings


def model_settings(settings: Settings) -> ModelSettings:
    spec = settings.model.strip()
    word, colon, model = spec.partition(":")
    name = provider_named(word)
    if name is not None:
        facts = PROVIDERS[name]
        # The name and a model id ("anthropic:<model id>"), or the name alone ("offline").
        if bool(model) if facts.takes_model_id else not colon:
            return ModelSettings(
                provider=name,
                model=model if facts.takes_model_id else name,
                max_tokens=settings.max_tokens,
                # Unset: off, and left out of the input.
                thinking_budget=(settings.thinking_budget or msgspec.UNSET) if facts.thinks else msgspec.UNSET,
            )
    raise ConfigError(f"ORCHESTRATOR_MODEL={spec!r}: use {spellings()}")
