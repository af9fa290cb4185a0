"""Task-queue agent orchestrator: the host side.

Public API::

    from orchestrator import store_message_direct, get_messages_since, format_messages_for_sdk

The names are imported when first used (PEP 562): the package root stays
free of SQLAlchemy, Celery and pydantic, so ``orchestrator --help`` and any
module that only needs a corner of the package start at once.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .errors import OrchestratorError

if TYPE_CHECKING:
    from .messages import MessageType, StoredMessage
    from .store import get_messages_after, get_messages_since, store_message_direct
    from .views import format_messages_for_sdk

_LAZY = {
    "MessageType": ".messages",
    "StoredMessage": ".messages",
    "format_messages_for_sdk": ".views",
    "get_messages_after": ".store",
    "get_messages_since": ".store",
    "store_message_direct": ".store",
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
