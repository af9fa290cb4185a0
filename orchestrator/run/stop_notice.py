"""Which limit stopped a run, and how to raise it: the 🏠 message the chat gets.

A run is bounded by its turns (``ORCHESTRATOR_MAX_TURNS``), the output of
one answer (``ORCHESTRATOR_MAX_TOKENS``), its tokens through the gateway
(``ORCHESTRATOR_RUN_TOKEN_BUDGET``) and its time (``ORCHESTRATOR_RUN_TIMEOUT_S``,
which a group may only shorten, and the worker's task limit derived from
it).  A run that stops on one of them may have left its task unfinished;
the people in the chat are told which limit it was, its value, and the
setting that raises it.  (The output bounds of ``sandbox/bounded_io.py``
name their own settings in the run's error.)
"""

from __future__ import annotations

from typing import Literal

from orchestrator.core.settings import Settings
from orchestrator.sandbox.config import effective_limits, parse_container_config
from orchestrator.store.groups import Group

Limit = Literal["max_turns", "max_tokens", "token_budget", "timeout", "task_time_limit"]

# The model's stop reasons that are one of our limits.
STOP_REASON_LIMITS: dict[str, Limit] = {"max_turns": "max_turns", "max_tokens": "max_tokens"}


def stop_notice(
    limit: Limit,
    *,
    settings: Settings,
    group: Group,
    num_turns: int,
    max_tokens: int,
    tokens_spent: int,
) -> str:
    """The chat's message for a run that ``limit`` stopped."""
    if limit == "max_turns":
        return (
            f"⏹️ The run stopped after {num_turns} model calls, its turn limit, so the task may be "
            f"unfinished. Say “continue” to go on, or raise ORCHESTRATOR_MAX_TURNS "
            f"(now {settings.provider.max_turns}) for longer runs."
        )
    if limit == "max_tokens":
        return (
            f"✂️ The model's last answer was cut off at its output limit of {max_tokens} tokens. "
            f"Raise ORCHESTRATOR_MAX_TOKENS (now {settings.provider.max_tokens}) for longer answers."
        )
    if limit == "token_budget":
        budget = settings.provider.run_token_budget
        return (
            f"🪙 The run stopped at its token budget ({tokens_spent:,} of {budget:,} tokens spent, and its "
            f"next request did not fit), so the task may be unfinished. Say “continue” to go on in a new run, "
            f"or raise ORCHESTRATOR_RUN_TOKEN_BUDGET (0: no limit) for longer runs."
        )
    own = parse_container_config(group.container_config).run_timeout_s
    if limit == "task_time_limit":
        what = f"the worker's time limit for a run (ORCHESTRATOR_RUN_TIMEOUT_S + 30 s, {settings.runs.run_timeout_s + 30:g} s)"
    else:
        what = f"its time limit of {effective_limits(settings, group.container_config).run_timeout_s:g} s"
    how = f"raise ORCHESTRATOR_RUN_TIMEOUT_S (now {settings.runs.run_timeout_s:g} s)"
    if own is not None and own < settings.runs.run_timeout_s:
        how = (
            f"raise this group's container_config run_timeout_s (now {own:g} s) with "
            f"`orchestrator groups set {group.chat_jid} --container-config ...`, "
            f"up to ORCHESTRATOR_RUN_TIMEOUT_S ({settings.runs.run_timeout_s:g} s)"
        )
    return f"⏱️ The run stopped at {what}, so the task may be unfinished. To give runs longer, {how}."
