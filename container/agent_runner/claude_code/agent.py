"""Run Claude Code (the Claude Agent SDK) as the agent of one run.

The CLI brings its own tool loop (Bash, Read, Write, Edit, Glob, Grep,
TodoWrite, ...) and runs inside the same hardened container as our own loop:
no network, a non-root user, a read-only root, the run's limits.  It reaches
the model only through the host's gateway (``relay.UnixRelay``): the
container holds a placeholder key, never a real one.  Every model name the
CLI may use (its small/fast model included) is set to the run's model, and
its output cap to the run's, so the gateway's policy holds without
rewriting; the CLI's nonessential traffic, telemetry, error reports and
update checks are off.

Our chat tools, ``send_message``, ``send_file``, the schedule tools and ``ask_user``,
are offered as in-process MCP tools (``mcp__chat__send_message``, ...): the same
code (``tools.run_tool``) and the same host-side checks as in our own loop, and
only those of them the group's profile enables (``ContainerInput.tools``; none
enabled: no MCP server at all).
The session (the CLI's transcript) lives in the group's session folder,
mounted at ``SESSION_MOUNT``; its id goes back to the host in the
``ResultEvent`` and comes back as ``ContainerInput.session_id`` to be
resumed.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from ..conversation import build_system_prompt
from ..egress import EGRESS_ENV
from ..errors import InputError, ProviderError
from ..protocol import SESSION_MOUNT, ContainerInput, KeepEvent, ResultEvent
from ..providers.base import ToolSpec
from ..relay import kept_relay
from ..text_stream import DeltaCoalescer
from ..tools import ToolContext, disabled_tools, run_tool
from ..tools.add_reaction import SPEC as ADD_REACTION_SPEC
from ..tools.ask_user import SPEC as ASK_USER_SPEC
from ..tools.edit_message import SPEC as EDIT_MESSAGE_SPEC
from ..tools.schedule_tools import SPECS as SCHEDULE_SPECS
from ..tools.send_file import SPEC as SEND_FILE_SPEC
from ..tools.send_message import SPEC as SEND_MESSAGE_SPEC
from ..workspace_notices import workspace_notices
from .live import KEPT, LOOP, CliSession, Turn, closing_on_failure
from .mapping import EDIT_TOOLS, Emit, EventMapper
from .prompt import build_prompt, session_file

log = logging.getLogger(__name__)

PLACEHOLDER_API_KEY = "via-gateway"
MCP_SERVER = "chat"
# Our tools offered to the CLI on that server (as mcp__chat__<name>).
CHAT_TOOLS = (
    SEND_MESSAGE_SPEC,
    SEND_FILE_SPEC,
    *SCHEDULE_SPECS.values(),
    ASK_USER_SPEC,
    EDIT_MESSAGE_SPEC,
    ADD_REACTION_SPEC,
)
# The provider's web search (a server tool, which only the gateway may open, on the group's
# policy), the CLI's own schedulers, which die with the run (the host
# schedules: the scheduled tasks of the chat), and its own question tool, which waits in
# the run for an answer nobody could give (ours, ask_user, ends the run and asks the chat).
DISALLOWED_TOOLS = [
    "WebSearch",
    "CronCreate",
    "CronDelete",
    "CronList",
    "ScheduleWakeup",
    "AskUserQuestion",
]


# WebFetch fetches from the container through the run's egress proxy, so it is offered only
# when the run has one (a group whose network policy is not off); without, it would only fail.
NO_NETWORK_TOOLS = ["WebFetch"]
# With a proxy, WebFetch would first ask the provider's domain check
# (https://api.anthropic.com/api/web/domain_info, fixed in the CLI, not through the gateway):
# a request out of the sandbox that no group's allowlist names. The group's allowlist, held by
# the proxy, is the domain check instead. The flag-settings layer (--settings) is this run's
# alone: nothing is written in the session folder, which the next run's policy may not share.
EGRESS_SETTINGS = {"skipWebFetchPreflight": True}


def disallowed_tools(inp: ContainerInput) -> list[str]:
    """The CLI's tools this run does not offer: WebFetch too when the run has no way out."""
    return [*DISALLOWED_TOOLS] if has_egress(inp) else [*NO_NETWORK_TOOLS, *DISALLOWED_TOOLS]


def has_egress(inp: ContainerInput) -> bool:
    """Does the run reach the network through the host's egress proxy?"""
    return inp.egress_socket is not msgspec.UNSET


def chat_tools(disabled: frozenset[str]) -> list[ToolSpec]:
    """Our chat tools the run offers the CLI: ``CHAT_TOOLS`` but the ``disabled`` ones."""
    return [spec for spec in CHAT_TOOLS if spec.name not in disabled]


def cli_env(inp: ContainerInput, base_url: str, config_dir: Path) -> dict[str, str]:
    """The CLI's environment: the gateway's address, the run's model everywhere, no phoning home."""
    model = inp.model.model
    env = {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": PLACEHOLDER_API_KEY,
        "CLAUDE_CONFIG_DIR": str(config_dir),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(inp.model.max_tokens),
        "BASH_DEFAULT_TIMEOUT_MS": str(int(inp.limits.bash_timeout_s * 1000)),
        "BASH_MAX_TIMEOUT_MS": str(int(inp.limits.bash_timeout_s * 1000)),
        # The whole to-do list in each call (TodoWrite, a TODO envelope) rather
        # than the task tools' one item at a time.
        "CLAUDE_CODE_ENABLE_TASKS": "0",
        # Every tool's schema up front: no ToolSearch round trip before a tool
        # (ours, send_message and send_file, included) can be called.
        "ENABLE_TOOL_SEARCH": "false",
        "MAX_THINKING_TOKENS": str(inp.model.thinking_budget) if isinstance(inp.model.thinking_budget, int) else "0",
    }
    for name in (
        "ANTHROPIC_MODEL",
        "ANTHROPIC_SMALL_FAST_MODEL",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL",
        "ANTHROPIC_DEFAULT_SONNET_MODEL",
        "ANTHROPIC_DEFAULT_OPUS_MODEL",
        "CLAUDE_CODE_SUBAGENT_MODEL",
    ):
        env[name] = model
    return env


def run_claude_code(
    inp: ContainerInput, emit: Emit, *, workspace: Path, session_root: Path = Path(SESSION_MOUNT)
) -> ResultEvent:
    """Run the conversation with Claude Code; emit every event, the ``ResultEvent`` last.

    In a serving runner, with the group's session folder, the CLI is kept for the next run
    (``live.py``); otherwise it ends with the run."""
    if not inp.model.socket_path and not inp.model.base_url:
        raise InputError("the claude-code provider needs the gateway's socket_path (or a base_url)")
    if not inp.messages:
        raise InputError("ContainerInput.messages is empty: nothing to answer")
    keep = KEPT.enabled and session_root.is_dir()
    if session_root.is_dir():
        config_dir = session_root / "claude"
        config_dir.mkdir(parents=True, exist_ok=True)
    else:
        # No session folder mounted (a replay, which must not touch the group's
        # session): a throw-away one on the tmpfs, so nothing is resumed.
        log.info("no session folder at %s: this run keeps no session", session_root)
        config_dir = Path(tempfile.mkdtemp(prefix="claude-session-"))
    # The relay stays for the process's life: a kept CLI was started with its address.
    base_url = kept_relay(inp.model.socket_path).base_url if inp.model.socket_path else inp.model.base_url
    assert base_url is not None
    result, kept = _converse(inp, emit, workspace, config_dir, base_url, keep=keep)
    if kept is not None:
        emit(kept)
    emit(result)
    return result


def session_key(inp: ContainerInput, workspace: Path, config_dir: Path, base_url: str) -> str:
    """Everything a CLI is started with that a session cannot change (``live.py``): a run
    whose key differs from the kept CLI's starts a new one."""
    return json.dumps(
        {
            "env": cli_env(inp, base_url, config_dir),
            "egress": {name: os.environ.get(name) for name in EGRESS_ENV},
            "system_prompt": build_system_prompt(inp.replace(system_notices=[]), workspace),
            "max_turns": inp.limits.max_turns,
            "disallowed": disallowed_tools(inp),
            "chat_tools": [spec.name for spec in chat_tools(disabled_tools(inp.tools))],
            "cwd": str(workspace),
        },
        sort_keys=True,
    )


def turn_prompt(inp: ContainerInput, workspace: Path, *, resuming: bool) -> str:
    """What this run asks: its system notices (the host's and the workspace's, for this turn
    only: a kept CLI's system prompt is fixed at its start), then the messages."""
    prompt = build_prompt(inp.messages, inp.assistant_name, resuming=resuming)
    notices = [n.strip() for n in [*inp.system_notices, *workspace_notices(workspace)] if n.strip()]
    if not notices:
        return prompt
    return "[system notices for this turn]\n\n" + "\n\n".join(notices) + "\n\n[messages]\n\n" + prompt


def _converse(
    inp: ContainerInput, emit: Emit, workspace: Path, config_dir: Path, base_url: str, *, keep: bool
) -> tuple[ResultEvent, KeepEvent | None]:
    """The run's turn on the kept CLI when it may go on, else on a new one; the result, and
    the CLI to spare when it is kept for the next run."""
    key = session_key(inp, workspace, config_dir, base_url)
    mapper = EventMapper(
        emit=emit, workspace=workspace, deltas=DeltaCoalescer(emit), output_cap=inp.limits.output_cap_bytes
    )
    ctx = ToolContext(
        workspace=workspace,
        limits=inp.limits,
        chat_jid=inp.chat_jid,
        send_targets=frozenset(inp.send_targets),
        emit=emit,
        disabled=disabled_tools(inp.tools),
        tasks=tuple(inp.tasks) if isinstance(inp.tasks, list) else (),
    )
    turn = Turn(emit=emit, mapper=mapper, ctx=ctx)
    session = KEPT.take(key, inp.session_id) if keep else None
    going_on = session is not None
    if session is None:
        resume = inp.session_id if inp.session_id and session_file(config_dir, inp.session_id) else None
        if inp.session_id and not resume:
            log.info("session %s is not in the session folder: starting a new one", inp.session_id)
        session = CliSession(key, resume)
    else:
        resume = session.session_id
    prompt = turn_prompt(inp, workspace, resuming=resume is not None)
    # Only in the claude-code image variant (not on the host, where mypy runs): typed as Any here.
    import claude_agent_sdk as sdk  # type: ignore[import-not-found,unused-ignore]

    try:
        LOOP.run(_turn(session, inp, workspace, config_dir, base_url, prompt, turn, opened=going_on, keep=keep))
    except sdk.ClaudeSDKError as exc:
        raise ProviderError(f"Claude Code failed: {exc}", retryable=True) from exc
    if mapper.result is None:
        LOOP.run(session.close())
        raise ProviderError("Claude Code ended without a result", retryable=True)
    if not keep:
        return mapper.result, None
    session.session_id = mapper.result.session_id
    kept = session.kept()
    if kept is None or session.session_id is None:
        LOOP.run(session.close())
        return mapper.result, None
    KEPT.keep(session)
    return mapper.result, kept


async def _turn(
    session: CliSession,
    inp: ContainerInput,
    workspace: Path,
    config_dir: Path,
    base_url: str,
    prompt: str,
    turn: Turn,
    *,
    opened: bool,
    keep: bool,
) -> None:
    """Open the CLI unless it is kept open, then ask; the CLI closed after a failure, and
    after the turn when it is not to be kept."""

    async def work() -> None:
        if not opened:
            await session.open(_client(session, inp, workspace, config_dir, base_url))
        await session.ask(prompt, turn)
        if not keep:
            await session.close()

    await closing_on_failure(session, work)


def _client(session: CliSession, inp: ContainerInput, workspace: Path, config_dir: Path, base_url: str) -> Any:
    """A ``ClaudeSDKClient`` for a new CLI of ``session``: its tools and hooks act for
    whichever run the session answers (``session.turn``)."""
    # Only in the claude-code image variant (not on the host, where mypy runs): typed as Any here.
    import claude_agent_sdk as sdk  # type: ignore[import-not-found,unused-ignore]

    def current() -> Turn:
        if session.turn is None:  # the CLI acts only inside a turn; anything else is a bug
            raise ProviderError("Claude Code called a tool between runs", retryable=True)
        return session.turn

    def chat_tool(spec: ToolSpec) -> Any:
        @sdk.tool(spec.name, spec.description, spec.input_schema)  # type: ignore[untyped-decorator,unused-ignore]
        async def call(args: dict[str, Any]) -> dict[str, Any]:
            turn = current()
            outcome = run_tool(spec.name, args, turn.ctx)
            if outcome.question is not None:
                # The CLI cannot be handed this call's result across a resumed session: the
                # answer comes as the next message (the host stores it so), and the turn ends.
                turn.emit(outcome.question)
            return {"content": [{"type": "text", "text": outcome.output}], "is_error": outcome.is_error}

        return call

    async def before_edit(data: Any, tool_use_id: str | None, _context: Any) -> dict[str, Any]:
        if tool_use_id and isinstance(data, dict):
            current().mapper.snapshot_before(tool_use_id, str(data.get("tool_name", "")), data.get("tool_input") or {})
        return {}

    offered = [chat_tool(spec) for spec in chat_tools(disabled_tools(inp.tools))]
    options = sdk.ClaudeAgentOptions(
        model=inp.model.model,
        cwd=str(workspace),
        resume=session.session_id,
        max_turns=inp.limits.max_turns,
        # The container is the sandbox: nobody is there to approve a tool call.
        permission_mode="bypassPermissions",
        disallowed_tools=disallowed_tools(inp),
        settings=json.dumps(EGRESS_SETTINGS) if has_egress(inp) else None,
        mcp_servers={MCP_SERVER: sdk.create_sdk_mcp_server(MCP_SERVER, tools=offered)} if offered else {},
        system_prompt={
            "type": "preset",
            "preset": "claude_code",
            "append": build_system_prompt(inp.replace(system_notices=[]), workspace),
        },
        env=cli_env(inp, base_url, config_dir),
        hooks={"PreToolUse": [sdk.HookMatcher(matcher="|".join(sorted(EDIT_TOOLS)), hooks=[before_edit])]},
        stderr=lambda line: log.info("claude: %s", line.rstrip()),
        # The API's stream events too: the reply's text is shown as it is written.
        include_partial_messages=True,
    )
    return sdk.ClaudeSDKClient(options=options)
