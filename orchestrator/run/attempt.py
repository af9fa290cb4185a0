"""One attempt at a run in its container: what a chat run and a replay share.

:func:`run_attempt` builds the container spec (the mounts and limits the caller's
``mounts`` hook checks just now, the image the model needs, the host's fence), starts
the model gateway, starts the container on the run's input, reads its events and
reaches the verdict (:class:`Verdict`): cancelled, the lease lost, an output limit,
timed out, the agent's error, a crash, or success.

Everything the container writes is hostile: its lines, their number and what they would
store are bounded by the run's :class:`~orchestrator.sandbox.bounded_io.OutputBudget`,
shared by its attempts; past it the container is killed and nothing more is read.

What differs between a chat run (``run/pipeline.py``) and a replay (``run/replay.py``)
comes in with the :class:`AttemptContext`: what to do with each output
(:class:`RunOutputs`: stored in the chat and delivered, or kept for the replay's record),
with the streamed text (:class:`Draft`: the chat's live view, or nothing), and what the
container mounts (``mounts``: the group's workspace under its volume hold, or a
replay's scratch copy).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from agent_runner.protocol import (
    AssistantEvent,
    ContainerInput,
    EditEvent,
    ErrorEvent,
    KeepEvent,
    ProtocolError,
    QuestionEvent,
    ReactEvent,
    ResultEvent,
    SendFileEvent,
    SendMessageEvent,
    TaskEvent,
    TextDeltaEvent,
    Usage,
    parse_event,
)
from orchestrator.core import metrics, tracing
from orchestrator.core.clock import SYSTEM_CLOCK, Clock
from orchestrator.core.errors import ConfigError, LeaseLost, MountRefused, OutputLimitExceeded
from orchestrator.core.settings import Settings
from orchestrator.run.assembly import input_bytes
from orchestrator.run.outputs import OutputMessage, event_to_message, sent_file_message, stored_size
from orchestrator.run.run_files import place_run_files
from orchestrator.run.stop_notice import STOP_REASON_LIMITS, Limit
from orchestrator.run.stop_watch import StopWatch
from orchestrator.sandbox.bounded_io import OutputBudget
from orchestrator.sandbox.config import EffectiveLimits
from orchestrator.sandbox.containers import GATEWAY_MOUNT, ContainerExit, ContainerSpec
from orchestrator.sandbox.egress import EGRESS_CA_BUNDLE, EGRESS_SOCKET, EgressProxy, egress_proxy
from orchestrator.sandbox.egress_ca import sandbox_bundle
from orchestrator.sandbox.egress_policy import EgressPolicy, opened_tools, search_domains
from orchestrator.sandbox.gateway import ModelGateway
from orchestrator.sandbox.image import image_name, model_variant
from orchestrator.sandbox.port import AgentProcess, Sandbox
from orchestrator.sandbox.providers import PROVIDERS
from orchestrator.sandbox.warm import gateway_dir, host_only_dir
from orchestrator.store.db import Connection, Database
from orchestrator.store.file_rows import StoredFile
from orchestrator.store.files import FileStore
from orchestrator.store.groups import Group
from orchestrator.store.runs import Run, RunState, finish_run, set_container

log = logging.getLogger(__name__)

GATEWAY_SOCKET = "model.sock"
# Lines that are not events, logged one by one up to this many: a flood must not flood the log.
GARBAGE_LOGGED = 5


@dataclass
class Verdict:
    """How one attempt at a run ended."""

    state: RunState
    error: str | None = None
    usage: Usage = field(default_factory=Usage)
    retryable: bool = False
    session_id: str | None = None
    # Another worker took the group over (store/leases.py): this one neither ends
    # the run nor says anything; the new holder closes it (sweeper.recover_group).
    lease_lost: bool = False
    # How the model's side ended (the runner's result), and the limit that stopped
    # the run, if one did (orchestrator/run/stop_notice.py): the chat is told.
    stop_reason: str | None = None
    num_turns: int = 0
    limit: Limit | None = None

    def end_run(self, db: Database, run_id: str, conn: Connection | None = None) -> Run:
        """End the run's row as this verdict says (in the caller's transaction ``conn``, if given)."""
        return finish_run(
            db,
            run_id,
            state=self.state,
            error=self.error,
            input_tokens=self.usage.input_tokens,
            output_tokens=self.usage.output_tokens,
            conn=conn,
        )


class RunOutputs(Protocol):
    """What an attempt does with what its run says, as it says it.  May raise
    :class:`LeaseLost` (the group was taken over): the attempt stops its container."""

    def output(self, out: OutputMessage) -> None:
        """One output of the run, numbered ``<run id>-NNNN`` across its attempts."""
        ...

    def send_message(self, chat_jid: str, out: OutputMessage | None, index: int) -> None:
        """The agent asked to post ``out`` (None: nothing to post) in ``chat_jid``; ``index``
        is the number it was given."""
        ...

    def send_file(self, workspace: Path, path: str, out: OutputMessage) -> None:
        """The agent asked to hand its chat the file at ``path`` below ``workspace`` (hostile),
        with ``out`` (its caption) as the message that carries it."""
        ...

    def task(self, event: TaskEvent, index: int) -> None:
        """The agent asked to make or change a scheduled task; ``index`` is the number its
        answer in the chat was given."""
        ...

    def egress(self, proxy: EgressProxy) -> None:
        """The run's egress proxy closed: its decisions, for the run's record."""
        ...

    def edit(self, event: EditEvent, index: int) -> None:
        """The agent asked to change the words of one of its own earlier messages; ``index``
        is the number a refusal's message in the chat is given."""
        ...

    def react(self, event: ReactEvent, index: int) -> None:
        """The agent asked to react to a person's message; ``index`` is the number a refusal's
        message in the chat is given."""
        ...

    def question(self, event: QuestionEvent, index: int) -> bool:
        """The agent asked its group a question (``ask_user``) and its run ends; ``index`` is
        the number the question's message was given.  True when it was asked (the run then
        ends ``awaiting_answer``), False when the host refused it (and said why)."""
        ...


class Draft(Protocol):
    """The run's streamed text (``text_delta`` events): shown, never stored (``run/live_draft.py``)."""

    def add(self, event: TextDeltaEvent) -> bool:
        """Take one delta; False when it is past the run's free allowance (its line is counted)."""
        ...

    def stored(self) -> None:
        """The reply was kept as an output: the text so far is done with."""
        ...

    def close(self) -> None:
        """The attempt is over."""
        ...


@dataclass(frozen=True)
class Mounts:
    """What a run's container gets of the host, checked just before it starts."""

    workspace: Path
    limits: EffectiveLimits
    read_write: dict[str, str] = field(default_factory=dict)  # host path -> container path
    read_only: dict[str, str] = field(default_factory=dict)
    # What the sandbox may reach through the run's egress proxy (off: no proxy at all).
    egress: EgressPolicy = field(default_factory=EgressPolicy)


@dataclass
class AttemptContext:
    """One attempt at ``run`` of ``group`` on ``payload`` (the run's recorded input)."""

    db: Database
    settings: Settings
    sandbox: Sandbox
    group: Group
    run: Run
    payload: ContainerInput
    assistant: str  # the name the run's outputs are stored under
    # Called in the attempt (a refusal is its failure): the workspace, limits and mounts as they are now.
    mounts: Callable[[], Mounts]
    outputs: RunOutputs
    draft: Draft
    # The run's output caps, shared by its attempts (orchestrator/sandbox/bounded_io.py).
    budget: OutputBudget
    # The container's name: <prefix>-<group folder>-<run id>-<random>; its labels beyond the sandbox's own.
    name_prefix: str = "orch"
    labels: dict[str, str] = field(default_factory=dict)
    # The group's warm container (orchestrator/sandbox/warm/): its gateway folder is mounted for good.
    warm: bool = False
    # The last output number given: outputs are numbered across the run's attempts (their ids must never repeat).
    indexed: int = 0
    # The tokens the run spent through the gateway: the earlier attempts' when the attempt starts (the
    # budget is the run's: a retry must not start from zero), all of them once it ended.
    spent: Usage = field(default_factory=Usage)
    lease_lost: threading.Event | None = None  # set: the group's lease is lost, stop the container
    clock: Clock = SYSTEM_CLOCK
    # Exceptions that mean "out of time" (Celery's soft time limit).
    deadline_exceptions: tuple[type[BaseException], ...] = ()
    # The files of the messages the run answers, placed under the workspace's inbox/ once
    # it is held (run/run_files.py), from this store.
    files: list[StoredFile] = field(default_factory=list)
    file_store: FileStore | None = None

    def record(self, gateway: ModelGateway | None) -> None:
        """What the gateway counted (not what the sandbox claims) is what the run spent."""
        if gateway is not None:
            self.spent = gateway.usage


def run_attempt(ctx: AttemptContext) -> Verdict:
    """One attempt at ``ctx.run`` in its container; every failure ends it with a verdict."""
    try:
        return _contained(ctx)
    except ctx.deadline_exceptions:
        # The task queue's own time limit: the container is already
        # stopped (the sandbox context exits on the way out); no retry.
        return Verdict(
            "timed_out", "the worker's time limit for this task was reached", ctx.spent, limit="task_time_limit"
        )
    except (ConfigError, MountRefused) as exc:
        # A bad container_config or a mount the allowlist refuses now: no retry helps.
        return Verdict("failed", str(exc), ctx.spent)
    except Exception as exc:  # every failure ends the attempt cleanly
        log.exception("run %s for %s failed", ctx.run.id, ctx.group.chat_jid)
        return Verdict("failed", f"{type(exc).__name__}: {exc}", ctx.spent, retryable=True)


def _container_spec(ctx: AttemptContext, mounts: Mounts) -> ContainerSpec:
    """The run container for ``ctx``: the image its model needs, ``mounts`` and their limits."""
    return ContainerSpec(
        image=image_name(ctx.settings, model_variant(ctx.payload.model.provider)),
        name=f"{ctx.name_prefix}-{ctx.group.folder}-{ctx.run.id[:8]}-{uuid.uuid4().hex[:4]}",
        workspace=mounts.workspace,
        run_id=ctx.run.id,
        group_folder=ctx.group.folder,
        memory=mounts.limits.memory,
        cpus=mounts.limits.cpus,
        pids=mounts.limits.pids,
        timeout_s=mounts.limits.run_timeout_s,
        # Gone with its worker (agent_runner/fence.py).
        fence_s=ctx.settings.sandbox.fence_s,
        install_id=ctx.settings.install_id,
        extra_labels=dict(ctx.labels),
        extra_mounts=dict(mounts.read_write),
        readonly_mounts=dict(mounts.read_only),
    )


def _contained(ctx: AttemptContext) -> Verdict:
    mounts = ctx.mounts()
    spec = _container_spec(ctx, mounts)
    payload = ctx.payload
    if ctx.files and ctx.file_store is not None:
        # Where they went is this attempt's to say: the recorded input stays as it was built.
        payload = place_run_files(mounts.workspace, ctx.files, ctx.file_store, payload)
    with contextlib.ExitStack() as cleanup:
        gateway: ModelGateway | None = None
        # Runs last, after the gateway closed (it waits for a request in
        # flight): the final count, kept when the attempt raised.
        cleanup.push(lambda *_: ctx.record(gateway))
        needs_gateway = PROVIDERS[payload.model.provider].gateway is not None
        egress = mounts.egress.mode != "off"
        if needs_gateway or egress:
            # The container has no network: its only ways out are the gateway's and the
            # egress proxy's sockets, bound in a host-only folder that is mounted read-only
            # (the run's own folder; for a warm container, the group's gateway folder,
            # mounted for good), so the container can connect but never plant a symlink
            # where the host binds, chmods or cleans up.
            if ctx.warm:
                gw_dir = host_only_dir(gateway_dir(ctx.settings, ctx.group.folder))
            else:
                gw_dir = host_only_dir(ctx.settings.runs_dir / ctx.run.id)
                cleanup.callback(shutil.rmtree, gw_dir, ignore_errors=True)
                spec = replace(spec, readonly_mounts={**spec.readonly_mounts, str(gw_dir): GATEWAY_MOUNT})
        if needs_gateway:
            # The run may ask for the model and output cap its recorded input names, no other.
            gateway = cleanup.enter_context(
                ModelGateway.for_provider(
                    gw_dir / GATEWAY_SOCKET,
                    ctx.settings,
                    payload.model.provider,
                    spent=ctx.spent,
                    model=payload.model.model,
                    max_tokens=payload.model.max_tokens,
                    # The provider's server tools the group's network policy opens, held to its domains.
                    server_tools=opened_tools(mounts.egress),
                    search_domains=search_domains(mounts.egress),
                )
            )
            socket_path = f"{GATEWAY_MOUNT}/{GATEWAY_SOCKET}"
            payload = payload.replace(model=payload.model.replace(socket_path=socket_path))
        if egress:
            # The group's network policy, decided per request by the run's own proxy.
            proxy = egress_proxy(ctx.settings, gw_dir / EGRESS_SOCKET, mounts.egress)
            # After the proxy closed (the stack unwinds backwards): every decision is in.
            cleanup.callback(ctx.outputs.egress, proxy)
            cleanup.enter_context(proxy)
            payload = payload.replace(egress_socket=f"{GATEWAY_MOUNT}/{EGRESS_SOCKET}")
            if proxy.ca is not None or proxy.sandbox_trust:
                # Brokered hosts' TLS is ended by the proxy: the sandbox trusts the installation's
                # CA beside the system's, and the operator's CA for hosts it reaches through a
                # tunnel (ORCHESTRATOR_EGRESS_UPSTREAM_CA_FILE); certificates, never a key.
                sandbox_bundle(proxy.ca, gw_dir / EGRESS_CA_BUNDLE, also=proxy.sandbox_trust)
                payload = payload.replace(egress_ca=f"{GATEWAY_MOUNT}/{EGRESS_CA_BUNDLE}")
        if spec.fence_s:  # the runner stops everything once this worker is gone (agent_runner/fence.py)
            payload = payload.replace(host_fence_s=spec.fence_s)
        # The container's span: what it writes is stored under it; the runner gets its context.
        with tracing.span(
            "agent container", attributes={"orchestrator.run_id": ctx.run.id, "orchestrator.warm": ctx.warm}
        ):
            if tracing.enabled():
                payload = payload.replace(traceparent=tracing.traceparent())
            return _stream(ctx, spec, payload, gateway)


@dataclass
class _Heard:
    """What the container said that decides the verdict."""

    result: ResultEvent | None = None
    error: ErrorEvent | None = None
    limit: OutputLimitExceeded | None = None
    fenced: LeaseLost | None = None
    garbage: int = 0  # lines that are not events
    asked: bool = False  # a question was asked: the run ends awaiting its answer


def _stream(ctx: AttemptContext, spec: ContainerSpec, payload: ContainerInput, gateway: ModelGateway | None) -> Verdict:
    heard = _Heard()
    asked = time.perf_counter()
    with ctx.sandbox.start(spec, input_bytes(payload)) as container, contextlib.closing(ctx.draft):
        metrics.container_started(asked, container)
        if container.id != ctx.run.container_id:  # else the run's row was written running on it
            set_container(ctx.db, ctx.run.id, container.id)
        tracing.annotate(container_id=container.id, cold=getattr(container, "cold", True))
        with StopWatch(ctx.db, ctx.run.id, container.kill, ctx.lease_lost, clock=ctx.clock) as stop:
            try:
                _read(ctx, container, heard, spec.workspace)
            except OutputLimitExceeded as exc:
                # Stop reading and stop the agent: whatever it writes next is not read.
                heard.limit = exc
                log.warning("run %s: %s", ctx.run.id, exc)
                container.kill()
            except LeaseLost as exc:
                # Taken over (a pause or partition made this host look dead): the
                # output was not stored, and the agent must not go on beside the new run.
                heard.fenced = exc
                container.kill()
            exit_ = container.finish()
    tracing.annotate(exit_code=exit_.status_code, timed_out=exit_.timed_out, unreadable_lines=heard.garbage)
    if heard.garbage > GARBAGE_LOGGED:
        log.warning("run %s: %d lines that are not events in all", ctx.run.id, heard.garbage)
    return _verdict(heard, exit_, stop.reason, spec, gateway)


def _read(ctx: AttemptContext, container: AgentProcess, heard: _Heard, workspace: Path) -> None:  # noqa: C901 - the run's output loop: one branch per event kind, each bounded
    """The container's events, each line charged to the run's budget, until it ends."""
    budget = ctx.budget
    for line in container.lines(ctx.settings.runs.max_event_line_bytes):
        if not line.strip():
            budget.line()
            continue
        try:
            event = parse_event(line)
        except ProtocolError:
            budget.line()
            heard.garbage += 1
            if heard.garbage <= GARBAGE_LOGGED:
                log.warning("run %s: ignoring a line that is not an event: %.200r", ctx.run.id, line)
            continue
        if isinstance(event, TextDeltaEvent):
            # Shown, not stored: bounded by the draft's own allowance, past
            # which each delta line counts like any other line.
            if not ctx.draft.add(event):
                budget.line()
            continue
        budget.line()
        if isinstance(event, ResultEvent):
            heard.result = event
        elif isinstance(event, ErrorEvent):
            heard.error = event
        elif isinstance(event, SendMessageEvent):
            budget.store(len(event.text.encode("utf-8")))
            ctx.indexed += 1
            sent = event_to_message(
                AssistantEvent(text=event.text), run_id=ctx.run.id, index=ctx.indexed, assistant_name=ctx.assistant
            )
            ctx.outputs.send_message(event.chat_jid, sent, ctx.indexed)
        elif isinstance(event, SendFileEvent):
            budget.store(len(event.caption.encode("utf-8")) + len(event.path.encode("utf-8")))
            ctx.indexed += 1
            carrier = sent_file_message(
                run_id=ctx.run.id, index=ctx.indexed, assistant_name=ctx.assistant, caption=event.caption
            )
            ctx.outputs.send_file(workspace, event.path, carrier)
        elif isinstance(event, TaskEvent):
            budget.store(len(event.prompt.encode("utf-8")) if event.prompt else 0)
            ctx.indexed += 1
            ctx.outputs.task(event, ctx.indexed)
        elif isinstance(event, EditEvent):
            budget.store(len(event.text.encode("utf-8")))
            ctx.indexed += 1
            ctx.outputs.edit(event, ctx.indexed)
        elif isinstance(event, ReactEvent):
            budget.store(len(event.emoji.encode("utf-8")))
            ctx.indexed += 1
            ctx.outputs.react(event, ctx.indexed)
        elif isinstance(event, KeepEvent):
            # Not the chat's: the runner's process to keep for the next run (a warm container's).
            container.keep(event)
        elif isinstance(event, QuestionEvent):
            budget.store(len(event.question.encode("utf-8")) + sum(len(o.encode("utf-8")) for o in event.options))
            ctx.indexed += 1
            if heard.asked:
                # One question per run: the runner ends the run at the first (a second is hostile).
                log.warning("run %s: a second question ignored", ctx.run.id)
                continue
            heard.asked = ctx.outputs.question(event, ctx.indexed)
        else:
            ctx.indexed += 1
            out = event_to_message(
                event,
                run_id=ctx.run.id,
                index=ctx.indexed,
                assistant_name=ctx.assistant,
                max_tool_result_bytes=ctx.settings.runs.max_tool_result_bytes,
            )
            if out is not None:
                budget.store(stored_size(out))
                ctx.outputs.output(out)
                if isinstance(event, AssistantEvent):
                    ctx.draft.stored()  # the kept reply takes the draft's place


def _verdict(
    heard: _Heard, exit_: ContainerExit, stopped: str | None, spec: ContainerSpec, gateway: ModelGateway | None
) -> Verdict:
    """How the attempt ended, from what the container said, how it exited and why it was stopped."""
    result, error = heard.result, heard.error
    usage = result.usage if result else Usage()
    if gateway is not None:
        # Count what the gateway saw, not what the sandbox claims.
        usage = gateway.usage
    if stopped == "cancelled":
        return Verdict("cancelled", "cancelled by request", usage)
    if heard.fenced is not None or stopped == "lease_lost":
        why = str(heard.fenced) if heard.fenced is not None else "this worker lost the group's lease"
        return Verdict("failed", f"{why}; the run was stopped", usage, lease_lost=True)
    if heard.limit is not None:
        # The agent would break it again: no retry.
        return Verdict("failed", str(heard.limit), usage, retryable=False)
    if exit_.timed_out:
        return Verdict("timed_out", f"the run exceeded its {spec.timeout_s:.0f}s limit", usage, limit="timeout")
    spent_budget: Limit | None = "token_budget" if gateway is not None and gateway.budget_refusals else None
    if error is not None:
        # The container's words become a host message: keep them short.
        return Verdict("failed", error.message[:2000], usage, retryable=error.retryable, limit=spent_budget)
    if exit_.status_code != 0 or result is None:
        tail = exit_.stderr_tail.strip().splitlines()[-1:] or [""]
        why = f"the agent container exited with status {exit_.status_code}"
        if exit_.status_code == 137:
            why += " (killed: out of memory or stopped)"
        if heard.garbage:
            why += f" after {heard.garbage} unreadable output line(s)"
        if tail[0]:
            why += f": {tail[0][:300]}"
        # A crash is worth another try; the caller decides if it may.
        return Verdict("failed", why, usage, retryable=True)
    return Verdict(
        "awaiting_answer" if heard.asked else "succeeded",
        None,
        usage,
        session_id=result.session_id,
        stop_reason=result.stop_reason,
        num_turns=result.num_turns,
        limit=STOP_REASON_LIMITS.get(result.stop_reason or ""),
    )
