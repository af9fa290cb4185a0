"""``orchestrator groups set`` and ``orchestrator groups show``: a group's profile changed
(``orchestrator/run/profile.py``, as ``PATCH /api/groups/{chat_jid}`` changes it, with the
same checks and the same host message in the chat) and shown, with what is in effect."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from orchestrator.cli.support import echo, fail, setup
from orchestrator.core.errors import OrchestratorError

if TYPE_CHECKING:
    from orchestrator.run.profile import InEffect
    from orchestrator.sandbox.config import EffectiveLimits
    from orchestrator.store.groups import Group

# 2**31 - 1: store.groups.MAX_QUOTA (not imported: --help loads no store).
_MAX = 2**31 - 1
# The options' word for "back to the installation's setting".
DEFAULT = "default"


def register(groups_app: typer.Typer) -> None:
    groups_app.command("set")(groups_set)
    groups_app.command("show")(groups_show)


def groups_set(
    chat_jid: str,
    container_config: Annotated[
        Optional[str],
        typer.Option(
            "--container-config",
            help="JSON: memory, cpus, pids, run_timeout_s, bash_timeout_s, workspace_quota, extra_mounts "
            '([{"host_path": ..., "name": ..., "read_write": false}]); checked against the mount allowlist.',
        ),
    ] = None,
    clear: Annotated[bool, typer.Option("--clear-container-config", help="Back to the settings' defaults.")] = False,
    runs_per_hour: Annotated[
        Optional[str],
        typer.Option(
            "--runs-per-hour",
            metavar="N|default",
            help="Runs the group may start per hour (0: no limit; 'default': ORCHESTRATOR_GROUP_RUNS_PER_HOUR).",
        ),
    ] = None,
    tokens_per_day: Annotated[
        Optional[str],
        typer.Option(
            "--tokens-per-day",
            metavar="N|default",
            help="Model tokens the group may spend per UTC day (0: no limit; 'default': "
            "ORCHESTRATOR_GROUP_TOKENS_PER_DAY).",
        ),
    ] = None,
    model: Annotated[
        Optional[str],
        typer.Option(
            "--model",
            metavar="PROVIDER:MODEL|default",
            help="The group's model, spelled as ORCHESTRATOR_MODEL (offline, anthropic:<id>, openai:<id>, "
            "claude-code:<id>); its provider must be configured here, and claude-code's image built. A change "
            "of model starts the group's session afresh. 'default': ORCHESTRATOR_MODEL.",
        ),
    ] = None,
    max_tokens: Annotated[
        Optional[str],
        typer.Option(
            "--max-tokens",
            metavar="N|default",
            help="Output tokens of one model answer ('default': ORCHESTRATOR_MAX_TOKENS).",
        ),
    ] = None,
    thinking_budget: Annotated[
        Optional[str],
        typer.Option(
            "--thinking-budget",
            metavar="N|default",
            help="Tokens each answer may think with, for a model that thinks: 0 (off), or 1024 and up, below the "
            "max tokens ('default': ORCHESTRATOR_THINKING_BUDGET).",
        ),
    ] = None,
    trigger_names: Annotated[
        Optional[list[str]],
        typer.Option(
            "--trigger-name",
            metavar="NAME",
            help="A name whose @NAME wakes the group (repeat it for more); the group's names replace the "
            "installation's (ORCHESTRATOR_ASSISTANT_NAME, ORCHESTRATOR_TRIGGER_ALIASES); its assistant name "
            "wakes it either way.",
        ),
    ] = None,
    default_trigger_names: Annotated[
        bool, typer.Option("--default-trigger-names", help="Back to the installation's trigger names.")
    ] = False,
    tools: Annotated[
        Optional[str],
        typer.Option(
            "--tools",
            metavar="TOOL,...|all|none",
            help="The optional tools the group's agent has (send_message, send_file, schedules, questions), "
            "comma separated; 'all': every one, 'none': none of them.",
        ),
    ] = None,
    approvers: Annotated[
        Optional[list[str]],
        typer.Option(
            "--approver",
            metavar="ID",
            help="Who may answer the agent's questions: a sender id as its channel gives it (slack:U123 for a Slack "
            "user, tg:42 for a Telegram user); repeat it for more.  The API and this command line answer as the operator.",
        ),
    ] = None,
    anyone_answers: Annotated[
        bool, typer.Option("--anyone-answers", help="Anyone in the chat may answer the agent's questions.")
    ] = False,
    network: Annotated[
        Optional[str],
        typer.Option(
            "--network",
            metavar="off|allowlist:HOST,...",
            help="What the sandbox may reach through the host's egress proxy: off (nothing), or "
            "allowlist:HOST[,HOST...] (a name, *.name for the names below it, either with :port; "
            "preset:package-indexes or preset:git-hosts for a preset).  Kept in the sandbox's "
            "container_config (egress).",
        ),
    ] = None,
) -> None:
    """Change a group's profile: its sandbox (limits and allowlisted extra mounts), quotas,
    model, output cap, thinking budget, trigger names and optional tools.  What changed is
    stated in the group's chat as a host message."""
    from orchestrator.run.profile import change_profile, in_effect
    from orchestrator.sandbox.config import effective_limits, workspace_quota
    from orchestrator.store.groups import get_group

    try:
        changes = _changes(
            container_config=container_config,
            clear=clear,
            runs_per_hour=runs_per_hour,
            tokens_per_day=tokens_per_day,
            model=model,
            max_tokens=max_tokens,
            thinking_budget=thinking_budget,
            trigger_names=trigger_names,
            default_trigger_names=default_trigger_names,
            tools=tools,
            approvers=approvers,
            anyone_answers=anyone_answers,
            network=network,
        )
    except OrchestratorError as exc:
        raise fail(exc) from exc
    root = setup()
    settings, db = root.settings, root.db
    try:
        if network is not None:
            # On the config this change gives (cleared: none), else on the one stored.
            base = (
                changes["container_config"]
                if "container_config" in changes
                else get_group(db, chat_jid).container_config
            )
            changes["container_config"] = _with_network(base, network)
        changed = change_profile(db, settings, chat_jid, changes, signal_delivery=root.signals.delivery)
        g = changed.group
        limits = effective_limits(settings, g.container_config)
        quota = workspace_quota(settings, g.container_config)
    except OrchestratorError as exc:
        raise fail(exc) from exc
    if "container_config" in changes:
        echo(f"{g.chat_jid}: container_config {json.dumps(g.container_config or {})}")
        typer.echo(f"  effective: {_limits_line(limits, quota)}")
    if {"runs_per_hour", "tokens_per_day"} & set(changes):
        runs = quota_text(g.runs_per_hour, settings.quotas.group_runs_per_hour)
        tokens = quota_text(g.tokens_per_day, settings.quotas.group_tokens_per_day)
        echo(f"{g.chat_jid}: runs per hour {runs}, tokens per day {tokens}")
    if {"model", "max_tokens", "thinking_budget", "trigger_names", "tools", "approvers"} & set(changes):
        echo(f"{g.chat_jid}:")
        for line in _profile_lines(g, in_effect(settings, g)):
            echo(line)
    if changed.new_session:
        echo(
            f"{g.chat_jid}: the model changed: session forgotten, {changed.stopped} warm container(s) stopped",
            err=True,
        )
    if changed.message is None:
        echo(f"{g.chat_jid}: nothing changed", err=True)


def _changes(
    *,
    container_config: str | None,
    clear: bool,
    runs_per_hour: str | None,
    tokens_per_day: str | None,
    model: str | None,
    max_tokens: str | None,
    thinking_budget: str | None,
    trigger_names: list[str] | None,
    default_trigger_names: bool,
    tools: str | None,
    approvers: list[str] | None = None,
    anyone_answers: bool = False,
    network: str | None = None,
) -> dict[str, object]:
    """The options as a change of the profile (its values checked by run/profile.py)."""
    if container_config is not None and clear:
        raise OrchestratorError("give one of --container-config JSON, --clear-container-config, not both")
    if trigger_names and default_trigger_names:
        raise OrchestratorError("give one of --trigger-name NAME, --default-trigger-names, not both")
    if approvers and anyone_answers:
        raise OrchestratorError("give one of --approver ID, --anyone-answers, not both")
    changes: dict[str, object] = {}
    if container_config is not None or clear:
        changes["container_config"] = None if clear else container_config
    for key, value in (
        ("runs_per_hour", runs_per_hour),
        ("tokens_per_day", tokens_per_day),
        ("max_tokens", max_tokens),
        ("thinking_budget", thinking_budget),
    ):
        if value is not None:
            changes[key] = whole_option(key, value)
    if model is not None:
        changes["model"] = None if model.strip().lower() == DEFAULT else model
    if trigger_names:
        changes["trigger_names"] = list(trigger_names)
    elif default_trigger_names:
        changes["trigger_names"] = None
    if tools is not None:
        word = tools.strip().lower()
        changes["tools"] = None if word == "all" else [] if word == "none" else [t.strip() for t in tools.split(",")]
    if approvers:
        changes["approvers"] = list(approvers)
    elif anyone_answers:
        changes["approvers"] = None
    if not changes and network is None:
        raise OrchestratorError(
            "nothing to change: give --container-config JSON, --clear-container-config, --runs-per-hour, "
            "--tokens-per-day, --model, --max-tokens, --thinking-budget, --trigger-name, --default-trigger-names, "
            "--tools, --approver, --anyone-answers or --network"
        )
    return changes


def _with_network(base: object, network: str) -> dict[str, object]:
    """The container_config ``base`` (a JSON text, a mapping, or None) with ``network`` as its egress policy."""
    from orchestrator.sandbox.egress_policy import parse_network_option

    try:
        policy = parse_network_option(network)
    except ValueError as exc:
        raise OrchestratorError(f"--network: {exc}") from exc
    if isinstance(base, str):
        try:
            config = json.loads(base)
        except json.JSONDecodeError as exc:
            raise OrchestratorError(f"--container-config: not JSON: {exc}") from exc
    else:
        config = dict(base) if isinstance(base, dict) else {}
    if not isinstance(config, dict):
        raise OrchestratorError("--container-config: a JSON object")
    egress = policy.model_dump(mode="json", exclude_defaults=True)
    if egress:
        config["egress"] = egress
    else:
        config.pop("egress", None)
    return config


def whole_option(name: str, value: str) -> int | None:
    """A whole-number option's value: a count >= 0, or None for 'default' (the installation's)."""
    if value.strip().lower() == DEFAULT:
        return None
    if not (value.strip().isascii() and value.strip().isdigit()) or int(value) > _MAX:
        raise OrchestratorError(
            f"--{name.replace('_', '-')}: {value!r} is not a whole number from 0 to {_MAX} or 'default'"
        )
    return int(value)


def quota_text(own: int | None, setting: int) -> str:
    limit = setting if own is None else own
    return (f"{limit:,}" if limit else "no limit") + (" (the setting's)" if own is None else "")


def _whose(own: object) -> str:
    return " (the installation's)" if own is None else " (the group's own)"


def _profile_lines(group: Group, effect: InEffect) -> list[str]:
    """The model, output cap, thinking budget, trigger names and tools in effect, and whose."""
    thinking = f"{effect.thinking_budget:,}" if effect.thinking_budget else "off"
    names = ", ".join(f"@{n}" for n in effect.trigger_names) or "none"
    return [
        f"  model:       {effect.model}{_whose(group.model)}",
        f"  max tokens:  {effect.max_tokens:,}{_whose(group.max_tokens)}",
        f"  thinking:    {thinking}{_whose(group.thinking_budget)}",
        f"  names:       {names}{_whose(group.trigger_names)}",
        f"  tools:       {', '.join(effect.tools) or 'none'}{' (all of them)' if group.tools is None else ''}",
        f"  answers:     {', '.join(group.approvers) if group.approvers else 'anyone in the chat'}",
    ]


def _network_line(config: object) -> str:
    """The group's egress policy on one line."""
    from orchestrator.sandbox.config import parse_container_config
    from orchestrator.sandbox.egress_policy import rules_of

    policy = parse_container_config(config if isinstance(config, dict) else None).egress
    if policy.mode == "off":
        return "off (the sandbox reaches nothing)"
    return f"{policy.mode}: " + (", ".join(rules_of(policy)) or "nothing")


def _limits_line(limits: EffectiveLimits, quota: int) -> str:
    from orchestrator.core.sizes import human_size

    return (
        f"memory {limits.memory}, cpus {limits.cpus:g}, pids {limits.pids}, "
        f"run timeout {limits.run_timeout_s:g}s, bash timeout {limits.bash_timeout_s:g}s, "
        f"workspace quota {human_size(quota) if quota else 'none'}"
    )


def groups_show(chat_jid: str, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """A group's profile: its registration, its sandbox and quotas (and the limits in effect),
    its model, output cap, thinking budget, trigger names and tools (its own or the
    installation's), and its scheduled tasks by state (``GET /api/groups/{chat_jid}``;
    --json prints its answer)."""
    from orchestrator.run.profile import profile_view
    from orchestrator.sandbox.config import effective_limits, workspace_quota

    root = setup()
    settings = root.settings
    try:
        p = profile_view(root.db, settings, chat_jid)
        limits = effective_limits(settings, p.container_config)
        quota = workspace_quota(settings, p.container_config)
    except OrchestratorError as exc:
        raise fail(exc) from exc
    if as_json:
        typer.echo(json.dumps(p.model_dump(mode="json"), indent=2))
        return
    name = p.assistant_name or settings.assistant_name
    wakes = f"messages starting with {' or '.join(f'@{n}' for n in p.in_effect.trigger_names)}"
    echo(f"{p.chat_jid}: {p.name}{' (main group)' if p.is_main else ''}")
    echo(f"  folder:      {p.folder}")
    echo(f"  wakes on:    {wakes if p.requires_trigger else 'every message'}")
    echo(f"  assistant:   {name}{'' if p.assistant_name else ' (the setting)'}")
    echo(f"  placed on:   {p.placed_host or '-'}")
    echo(f"  messages:    cursor {p.cursor_seq}, pending up to {p.pending_seq}")
    echo(f"  session:     {p.session_id or '-'}")
    echo(f"  sandbox:     {json.dumps(p.container_config) if p.container_config else 'the settings'}")
    typer.echo(f"    in effect: {_limits_line(limits, quota)}")
    echo(f"  network:     {_network_line(p.container_config)}")
    echo(f"  runs/hour:   {quota_text(p.runs_per_hour, settings.quotas.group_runs_per_hour)}")
    echo(f"  tokens/day:  {quota_text(p.tokens_per_day, settings.quotas.group_tokens_per_day)}")
    for line in _profile_lines(p, p.in_effect):
        echo(line)
    t = p.tasks
    echo(f"  tasks:       {t.active} active, {t.paused} paused, {t.done} done, {t.cancelled} cancelled")
