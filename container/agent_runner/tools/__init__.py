"""The tool registry: name -> (spec shown to the model, function that runs it).

Tools (one module each):

* ``bash`` - run a shell command in the workspace (``bash.py``);
* ``read_file`` - a text file's lines, numbered like ``cat -n`` (``read_file.py``);
* ``write_file`` - create or overwrite a file, parents included (``write_file.py``);
* ``edit_file`` - replace a unique (or every) occurrence of a string (``edit_file.py``);
* ``glob`` - workspace files matching a pattern such as ``**/*.py`` (``glob_tool.py``);
* ``grep`` - lines matching a Python regex, as ``file:line:text`` (``grep_tool.py``);
* ``todo_write`` - the model's task list for the run (``todo_write.py``);
* ``send_message`` - post into the chat (or, for the main group, another
  registered chat) during the run; the host authorizes (``send_message.py``);
* ``send_file`` - hand the chat a regular file of the workspace, with an
  optional caption; the host reads and checks it again (``send_file.py``);
* ``edit_message`` - change the words of one of the agent's own earlier
  messages, on every channel that shows it (``edit_message.py``);
* ``add_reaction`` - put an emoji of the shared table on a person's message, on
  every channel that shows it (``add_reaction.py``);
* ``ask_user`` - ask the chat a question with options; the run ends, the
  answer comes back in a later run (``ask_user.py``);
* ``schedule_task``, ``list_tasks``, ``update_task``, ``pause_task``,
  ``resume_task``, ``cancel_task`` - the group's scheduled tasks; the host
  decides and says in the chat what it did (``schedule_tools.py``).

File tools only touch paths inside the workspace (``paths.py``).  Shared
types live in ``base.py`` and are re-exported here.  Each tool's arguments are a
msgspec Struct (``ToolArgs``), decoded once by :func:`run_tool` (``base.decode_args``):
the built-in loop and Claude Code's MCP tools both call it, so both check alike.

The chat tools are optional (``protocol.OPTIONAL_TOOL_NAMES``): a group's profile on the
host names the ones its agent has (``ContainerInput.tools``), and a run is offered
only those (:func:`disabled_tools`, :func:`tool_specs`); a call to another is refused
like an unknown tool.  The host refuses their events again: this is the courtesy.

:func:`run_tool` never raises for a bad call: an unknown tool name, an
input that does not decode into the tool's Struct or a refused path becomes an ``is_error`` result that the
model can read and correct, rather than a crash of the whole run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import msgspec

from ..protocol import OPTIONAL_TOOL_NAMES
from ..providers.base import ToolSpec
from .add_reaction import SPEC as ADD_REACTION_SPEC
from .add_reaction import AddReactionArgs, add_reaction
from .ask_user import SPEC as ASK_USER_SPEC
from .ask_user import AskArgs, ask_user
from .base import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_FAILED_TO_START,
    EXIT_UNKNOWN_TOOL,
    RunState,
    Tool,
    ToolArgs,
    ToolContext,
    ToolOutcome,
    decode_args,
)
from .bash import BASH_SPEC, BashArgs, bash
from .edit_file import SPEC as EDIT_FILE_SPEC
from .edit_file import EditFileArgs, edit_file
from .edit_message import SPEC as EDIT_MESSAGE_SPEC
from .edit_message import EditMessageArgs, edit_message
from .glob_tool import SPEC as GLOB_SPEC
from .glob_tool import GlobArgs, glob_files
from .grep_tool import SPEC as GREP_SPEC
from .grep_tool import GrepArgs, grep_files
from .read_file import SPEC as READ_FILE_SPEC
from .read_file import ReadFileArgs, read_file
from .schedule_tools import SPECS as SCHEDULE_SPECS
from .schedule_tools import (
    ListTasksArgs,
    ScheduleTaskArgs,
    TaskIdArgs,
    UpdateTaskArgs,
    cancel_task,
    list_tasks,
    pause_task,
    resume_task,
    schedule_task,
    update_task,
)
from .send_file import SPEC as SEND_FILE_SPEC
from .send_file import SendFileArgs, send_file
from .send_message import SPEC as SEND_MESSAGE_SPEC
from .send_message import SendMessageArgs, send_message
from .todo_write import SPEC as TODO_WRITE_SPEC
from .todo_write import TodoWriteArgs, todo_write
from .write_file import SPEC as WRITE_FILE_SPEC
from .write_file import WriteFileArgs, write_file

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "EXIT_FAILED_TO_START",
    "EXIT_UNKNOWN_TOOL",
    "REGISTRY",
    "RunState",
    "Tool",
    "ToolArgs",
    "ToolContext",
    "ToolOutcome",
    "disabled_tools",
    "run_tool",
    "tool_specs",
]

log = logging.getLogger(__name__)


REGISTRY: dict[str, Tool[Any]] = {
    tool.spec.name: tool
    for tool in (
        Tool(BASH_SPEC, BashArgs, bash),
        Tool(READ_FILE_SPEC, ReadFileArgs, read_file),
        Tool(WRITE_FILE_SPEC, WriteFileArgs, write_file),
        Tool(EDIT_FILE_SPEC, EditFileArgs, edit_file),
        Tool(GLOB_SPEC, GlobArgs, glob_files),
        Tool(GREP_SPEC, GrepArgs, grep_files),
        Tool(TODO_WRITE_SPEC, TodoWriteArgs, todo_write),
        Tool(SEND_MESSAGE_SPEC, SendMessageArgs, send_message),
        Tool(SEND_FILE_SPEC, SendFileArgs, send_file),
        Tool(SCHEDULE_SPECS["schedule_task"], ScheduleTaskArgs, schedule_task),
        Tool(SCHEDULE_SPECS["list_tasks"], ListTasksArgs, list_tasks),
        Tool(SCHEDULE_SPECS["update_task"], UpdateTaskArgs, update_task),
        Tool(SCHEDULE_SPECS["pause_task"], TaskIdArgs, pause_task),
        Tool(SCHEDULE_SPECS["resume_task"], TaskIdArgs, resume_task),
        Tool(SCHEDULE_SPECS["cancel_task"], TaskIdArgs, cancel_task),
        Tool(ASK_USER_SPEC, AskArgs, ask_user),
        Tool(EDIT_MESSAGE_SPEC, EditMessageArgs, edit_message),
        Tool(ADD_REACTION_SPEC, AddReactionArgs, add_reaction),
    )
}


def disabled_tools(enabled: list[str] | msgspec.UnsetType) -> frozenset[str]:
    """The optional tools a run is not offered, from ``ContainerInput.tools`` (unset: none)."""
    if enabled is msgspec.UNSET:
        return frozenset()
    return frozenset(name for key, names in OPTIONAL_TOOL_NAMES.items() if key not in enabled for name in names)


def tool_specs(disabled: frozenset[str] = frozenset()) -> list[ToolSpec]:
    """The specs of the tools a run is offered: the registry's but ``disabled``."""
    return [tool.spec for name, tool in REGISTRY.items() if name not in disabled]


def run_tool(name: str, args: Mapping[str, Any], ctx: ToolContext) -> ToolOutcome:
    """Run one tool call from the model; failures become error outcomes."""
    tool = None if name in ctx.disabled else REGISTRY.get(name)
    if tool is None:
        known = ", ".join(sorted(n for n in REGISTRY if n not in ctx.disabled))
        return ToolOutcome(f"unknown tool {name!r}; available: {known}", EXIT_UNKNOWN_TOOL, True)
    if not isinstance(args, Mapping):
        return ToolOutcome(f"{name}: input must be a JSON object", EXIT_BAD_INPUT, True)
    decoded = decode_args(name, args, tool.args)
    if isinstance(decoded, ToolOutcome):
        return decoded
    try:
        return tool.run(decoded, ctx)
    except OSError as exc:  # e.g. bash missing or the workspace unreadable
        log.warning("tool %s failed to start: %s", name, exc)
        return ToolOutcome(f"{name}: failed to start: {exc}", EXIT_FAILED_TO_START, True)
    except Exception as exc:  # a bug in a tool: the model gets an error, the run goes on
        log.exception("tool %s crashed", name)
        return ToolOutcome(f"{name}: internal error: {type(exc).__name__}: {exc}", EXIT_FAILED, True)
