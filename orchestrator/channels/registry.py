"""The channels a process knows, built from the settings.

Built in: ``log`` (the worker's log) and ``webhook`` (POST to the
attachment's URL, ``orchestrator/channels/webhook.py``).  More channels come
from ``ORCHESTRATOR_CHANNEL_PLUGINS``: ``module:factory`` entries, each
called with the settings and returning a channel or a list of channels
(Telegram and Slack are: ``orchestrator.channels.telegram:channel``,
``orchestrator.channels.slack:channel``).
"""

from __future__ import annotations

import importlib
import logging

from orchestrator.channels.base import LogChannel
from orchestrator.channels.webhook import WebhookChannel
from orchestrator.core.errors import ChannelError
from orchestrator.core.settings import Settings
from orchestrator.run.outbound import ChannelRegistry

log = logging.getLogger(__name__)

# Plugin paths from before the package was split into rooms; a settings file
# written then keeps working.  Our plugins are imports by name, which import-linter
# cannot see: tests/host/loaded_by_name.py lists them for tests/host/test_layers.py.
_RENAMED = {"orchestrator.telegram": "orchestrator.channels.telegram"}


def build_registry(settings: Settings) -> ChannelRegistry:
    """The built-in channels plus the configured plugins (what a worker, and the CLI, know)."""
    registry = ChannelRegistry([LogChannel(), WebhookChannel(settings)])
    for spec in filter(None, (s.strip() for s in settings.channel_plugins.split(","))):
        module, _, attr = spec.partition(":")
        module = _RENAMED.get(module, module)
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ChannelError(f"channel plugin {spec!r} cannot be loaded: {exc}") from exc
        made = factory(settings)
        for ch in made if isinstance(made, list | tuple) else [made]:
            registry.add(ch)
    return registry
