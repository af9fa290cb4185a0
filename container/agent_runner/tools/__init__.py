"""The tool registry: name -> (spec shown to the model, function that runs it).

:func:`run_tool` never raises for a bad call: an unknown tool name or a
malformed input becomes an ``is_error`` result that the model can read and
correct, rather than a crash of the whole run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..protocol import Limits
from ..providers.base import ToolSpec
from .bash import BASH_SPEC, resolve_cwd, run_bash

log = logging.getLogger(__name__)

# Exit codes for calls that never ran, borrowed from shell conventions.
EXIT_UNKNOWN_TOOL = 127
EXIT_BAD_INPUT = 2
EXIT_FAILED_TO_START = 126


@dataclass(frozen=True)
class ToolContext:
    """What every tool may depend on, passed down from ``__main__``."""

    workspace: Path
    limits: Limits


@dataclass(frozen=True)
class ToolOutcome:
    output: str
    exit_code: int
    # True when the call never ran (unknown tool, bad input, spawn failure).
    # A command that ran and exited non-zero, or timed out (124, with a note
    # in the output), is a normal result the model reads like a shell user.
    is_error: bool = False


ToolFn = Callable[[Mapping[str, Any], ToolContext], ToolOutcome]


@dataclass(frozen=True)
class Tool:
    spec: ToolSpec
    run: ToolFn


def _bash(args: Mapping[str, Any], ctx: ToolContext) -> ToolOutcome:
    command = args.get("command")
    if not isinstance(command, str) or not command.strip():
        return ToolOutcome("bash: input needs a non-empty string 'command'", EXIT_BAD_INPUT, True)
    output, exit_code = run_bash(
        command,
        cwd=resolve_cwd(ctx.workspace),
        timeout_s=ctx.limits.bash_timeout_s,
        output_cap_bytes=ctx.limits.output_cap_bytes,
    )
    return ToolOutcome(output, exit_code)


REGISTRY: dict[str, Tool] = {BASH_SPEC.name: Tool(BASH_SPEC, _bash)}


def tool_specs() -> list[ToolSpec]:
    return [tool.spec for tool in REGISTRY.values()]


def run_tool(name: str, args: Mapping[str, Any], ctx: ToolContext) -> ToolOutcome:
    """Run one tool call from the model; failures become error outcomes."""
    tool = REGISTRY.get(name)
    if tool is None:
        known = ", ".join(sorted(REGISTRY))
        return ToolOutcome(f"unknown tool {name!r}; available: {known}", EXIT_UNKNOWN_TOOL, True)
    if not isinstance(args, Mapping):
        return ToolOutcome(f"{name}: input must be a JSON object", EXIT_BAD_INPUT, True)
    try:
        return tool.run(args, ctx)
    except OSError as exc:  # e.g. bash missing or the workspace unreadable
        log.warning("tool %s failed to start: %s", name, exc)
        return ToolOutcome(f"{name}: failed to start: {exc}", EXIT_FAILED_TO_START, True)
