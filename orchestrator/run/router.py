"""Routing: which stored messages wake the agent.

The trigger is ``@Name`` at the very start of a message, case-insensitive,
for the assistant's name and each alias.  ``Hey @Andy`` does not trigger.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from orchestrator.model.messages import StoredMessage


def trigger_pattern(names: Sequence[str]) -> re.Pattern[str]:
    alts = "|".join(re.escape(n) for n in names if n)
    # The name must end there: "@Andyx" is not "@Andy".
    return re.compile(rf"^\s*@(?:{alts})(?![\w-])", re.IGNORECASE)


def has_trigger(content: str, names: Sequence[str]) -> bool:
    return bool(names) and trigger_pattern(names).match(content) is not None


def wakes(
    message: StoredMessage,
    *,
    is_main: bool,
    requires_trigger: bool,
    assistant_name: str | None,
    names: Sequence[str],
) -> bool:
    """True if ``message`` should start a run for the registered group whose
    columns are given (the ingest path reads just those).

    Only user messages wake the agent (messages of unregistered chats never
    get here); a group that requires the trigger (never the main group) needs
    ``@Name`` first.  Everything else is stored and becomes context for the
    next run.
    """
    if message.message_type != "user" or message.is_from_me:
        return False
    if requires_trigger and not is_main:
        own = [assistant_name] if assistant_name else []
        return has_trigger(message.content, [*own, *names])
    return True
