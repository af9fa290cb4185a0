"""Task-queue agent orchestrator: the host side.

Public API::

    from orchestrator import store_message_direct, get_messages_since, format_messages_for_sdk
"""

from .errors import OrchestratorError
from .messages import MessageType, StoredMessage
from .store import get_messages_after, get_messages_since, store_message_direct
from .views import format_messages_for_sdk

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
