"""Routing: which stored messages wake the agent.

The trigger is ``@Name`` at the very start of a message, case-insensitive,
for the assistant's name and each alias.  ``Hey @Andy`` does not trigger.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from orchestrator.model.messages import StoredMessage
from orchestrator.store.groups import Group


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
    if group is None:
        return False
    return wakes(message, is_main=group.is_main, requires_trigger=group.requires_trigger,
                 assistant_name=group.assistant_name, names=names)


def wakes(
    message: StoredMessage, *, is_main: bool, requires_trigger: bool, assistant_name: str | None,
    names: Sequence[str],
) -> bool:
    """:func:`wakes_agent` for a registered group given by the columns the rule reads
    (the ingest path reads just those)."""
    if message.message_type != "user" or message.is_from_me:
        return False
    if requires_trigger and not is_main:
        own = [assistant_name] if assistant_name else []
        return has_trigger(message.content, [*own, *names])
    return True
