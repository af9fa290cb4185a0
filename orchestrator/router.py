"""Routing: which stored messages wake the agent.

The trigger is ``@Name`` at the very start of a message, case-insensitive,
for the assistant's name and each alias.  ``Hey @Andy`` does not trigger.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .groups import Group
from .messages import StoredMessage


def trigger_pattern(names: Sequence[str]) -> re.Pattern[str]:
    alts = "|".join(re.escape(n) for n in names if n)
    # The name must end there: "@Andyx" is not "@Andy".
    return re.compile(rf"^\s*@(?:{alts})(?![\w-])", re.IGNORECASE)


def has_trigger(content: str, names: Sequence[str]) -> bool:
    return bool(names) and trigger_pattern(names).match(content) is not None


def wakes_agent(message: StoredMessage, group: Group | None, names: Sequence[str]) -> bool:
    """True if ``message`` should start a run for ``group``.

    Only user messages of registered groups wake the agent; a group that
    requires the trigger (never the main group) needs ``@Name`` first.
    Everything else is stored and becomes context for the next run.
    """
    if group is None or message.message_type != "user" or message.is_from_me:
        return False
    if group.requires_trigger and not group.is_main:
        own = [group.assistant_name] if group.assistant_name else []
        return has_trigger(message.content, [*own, *names])
    return True
