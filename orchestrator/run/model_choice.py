"""The model a run asks for: ``ORCHESTRATOR_MODEL`` (or a replay's model, spelled the same),
or the group's own (its profile: ``groups.model``, ``max_tokens``, ``thinking_budget``), as
the ``ModelSettings`` of the run's input, with the output cap and thinking budget.
How each provider's model is spelled, and whether it thinks, is its row in
``orchestrator/sandbox/providers.py``."""

from __future__ import annotations

import msgspec

from agent_runner.protocol import ModelSettings
from orchestrator.core.errors import ConfigError
from orchestrator.core.settings import Settings
from orchestrator.sandbox.providers import PROVIDERS, ProviderName, provider_named, spellings
from orchestrator.store.groups import Group

# The API's own bounds of a thinking budget: at least this, and below the output cap.
MIN_THINKING_BUDGET = 1024


def parse_model(spec: str) -> tuple[ProviderName, str] | None:
    """``spec`` as ``ORCHESTRATOR_MODEL`` spells a model: (provider, model id), the model id
    being the provider's name for a provider that takes none (``offline``); None when it
    names no provider or is spelled otherwise."""
    word, colon, model = spec.strip().partition(":")
    name = provider_named(word)
    if name is None:
        return None
    facts = PROVIDERS[name]
    # The name and a model id ("anthropic:<model id>"), or the name alone ("offline").
    if bool(model) if facts.takes_model_id else not colon:
        return name, model if facts.takes_model_id else name
    return None


def model_settings(settings: Settings, group: Group | None = None) -> ModelSettings:
    """The model of a run of ``group``: its own model, output cap and thinking budget where it
    has them, the settings' otherwise.  ConfigError for a model spelled wrong, or a thinking
    budget the output cap in effect leaves no room for (the settings changed since the
    group's profile was checked)."""
    own = group is not None and group.model is not None
    spec = group.model if group is not None and group.model is not None else settings.provider.model
    parsed = parse_model(spec)
    if parsed is None:
        where = "the group's model" if own else "ORCHESTRATOR_MODEL"
        raise ConfigError(f"{where}={spec.strip()!r}: use {spellings()}")
    name, model = parsed
    max_tokens = settings.provider.max_tokens if group is None or group.max_tokens is None else group.max_tokens
    thinking = (
        settings.provider.thinking_budget if group is None or group.thinking_budget is None else group.thinking_budget
    )
    if not PROVIDERS[name].thinks:
        thinking = 0
    if thinking and not MIN_THINKING_BUDGET <= thinking < max_tokens:
        raise ConfigError(
            f"a thinking budget of {thinking} with an output cap of {max_tokens}: the budget must be at "
            f"least {MIN_THINKING_BUDGET} and below the cap; change the group's with `orchestrator groups set "
            "--thinking-budget` or `--max-tokens`"
        )
    return ModelSettings(
        provider=name,
        model=model,
        max_tokens=max_tokens,
        # Unset: off, and left out of the input.
        thinking_budget=thinking or msgspec.UNSET,
    )
