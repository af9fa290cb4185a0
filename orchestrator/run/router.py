"""Routing: which stored messages wake the agent.

The trigger is ``@Name`` at the very start of a message, case-insensitive,
for each of the group's names (:func:`group_names`): its own assistant name, if it
has one, and its own trigger names (``groups.trigger_names``, set with ``orchestrator
groups set --trigger-name``), or, when it has none of its own, the installation's
(``ORCHESTRATOR_ASSISTANT_NAME`` and ``ORCHESTRATOR_TRIGGER_ALIASES``).  ``Hey @Andy``
does not trigger.
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


def group_names(installation: Sequence[str], assistant_name: str | None, own: Sequence[str] | None) -> list[str]:
    """The names that wake a group that requires the trigger: its assistant name, then its
    own trigger names, which replace the ``installation``'s (None: it has none of its own)."""
    names = [*([assistant_name] if assistant_name else []), *(installation if own is None else own)]
    return list(dict.fromkeys(names))


def wakes(
    message: StoredMessage,
    *,
    is_main: bool,
    requires_trigger: bool,
    names: Sequence[str],
) -> bool:
    """True if ``message`` should start a run for the registered group whose
    columns are given (the ingest path reads just those); ``names``: the group's
    (:func:`group_names`).

    Only user messages wake the agent (messages of unregistered chats never
    get here); a group that requires the trigger (never the main group) needs
    ``@Name`` first.  Everything else is stored and becomes context for the
    next run.
    """
    if message.part.kind != "user_text" or message.is_from_me:
        return False
    if requires_trigger and not is_main:
        return has_trigger(message.content, names)
    return True
