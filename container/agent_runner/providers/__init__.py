"""Model providers and the factory that picks one from ``ModelSettings``."""

from __future__ import annotations

from ..protocol import ModelSettings
from .base import Provider


def make_provider(settings: ModelSettings, *, assistant_name: str) -> Provider:
    """Build the provider named by ``settings.provider``.

    The Anthropic SDK is imported lazily: the offline model then starts fast
    and works even where the SDK is not installed.
    """
    if settings.provider == "offline":
        from .offline import OfflineProvider

        return OfflineProvider(assistant_name=assistant_name)
    if settings.provider == "anthropic":
        from .anthropic import AnthropicProvider

        return AnthropicProvider(settings)
    if settings.provider == "openai":
        from .openai_compat import OpenAICompatProvider

        return OpenAICompatProvider(settings)
    # "claude-code" brings its own loop (one_run.run dispatches it): no Provider of ours.
    raise ValueError(f"provider {settings.provider!r} is not a provider of the built-in loop")
