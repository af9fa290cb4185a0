"""Task-queue agent orchestrator: the host side.

Public API::

    from orchestrator import OrchestratorError       # the root of every error raised
    from orchestrator import MessageType, StoredMessage
    from orchestrator import store_message_direct
    from orchestrator import get_messages_after, get_messages_since
    from orchestrator import format_messages_for_sdk

The package is a house of rooms, each a folder that says in its own
docstring what it owns and what it may import (the layer contract in
``pyproject.toml``, checked by import-linter; the map is
``docs/architecture.md``), from the ground up::

    core      errors, settings, sizes: what every room may import
    model     the typed messages, envelopes, views, rendering, context items
    store     the database: tables, migrations, messages, runs, leases, ledger
    sandbox   the Docker sandbox, warm containers, the model gateway, quotas
    run       the run path: ingest, queue, pipeline, assembly, outputs, sweeper
    channels  the channel adapters: log, webhook, Telegram
    http      the HTTP API, its event stream and the web page
    cli       the command line, the terminal chat and the supervisor

The names are imported when first used (PEP 562): the package root stays
free of SQLAlchemy, Celery and pydantic, so ``orchestrator --help`` and any
module that only needs a corner of the package start at once.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from orchestrator.core.errors import OrchestratorError

if TYPE_CHECKING:
    from orchestrator.model.messages import MessageType, StoredMessage
    from orchestrator.model.views import format_messages_for_sdk
    from orchestrator.store.message_log import get_messages_after, get_messages_since, store_message_direct

# Imports by name, which import-linter cannot see: tests/host/test_layers.py reads this
# table and holds each module to the floors (tests/host/loaded_by_name.py).
_LAZY = {
    "MessageType": ".model.messages",
    "StoredMessage": ".model.messages",
    "format_messages_for_sdk": ".model.views",
    "get_messages_after": ".store.message_log",
    "get_messages_since": ".store.message_log",
    "store_message_direct": ".store.message_log",
}

__all__ = [
    "MessageType",
    "OrchestratorError",
    "StoredMessage",
    "format_messages_for_sdk",
    "get_messages_after",
    "get_messages_since",
    "store_message_direct",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value  # once: later lookups do not come back here
    return value
