"""Replay a recorded run against another model.

Choosing or upgrading a model safely means asking the new one the very
questions the old one answered.  Every run records the exact ContainerInput
it sent (``assembly.record_input``); a replay decodes it, swaps the model for
the one asked (resolved as ``ORCHESTRATOR_MODEL`` is, the host's output cap
and the gateway's model policy unchanged), gives it a fresh run id and no
session, and runs it in a real, hardened run container on a **scratch copy**
of the group's workspace: the group's own workspace, session and IPC are never
mounted, so whatever the replayed agent writes is thrown away with the copy.

A replay is a row of ``runs`` with ``replay_of`` set.  It is no run of the
chat's: it takes no lease, moves no cursor or session, is not the chat's
pending work (the sweeper and the recovery leave such rows alone), and the
page's event stream never shows it.  It does take one of
``ORCHESTRATOR_MAX_CONCURRENT_RUNS``'s slots while it runs, behind every
group that waits for one (``slots.take_replay_slot``): a fleet that is full
refuses it when a worker would start it, and a group whose quota is spent
refuses it when it is made (:class:`ReplayLimited`).  It runs as an attempt
of a chat run does (``run/attempt.py``: the same container spec, gateway,
output caps and verdicts).  What it says is stored in ``replay_outputs`` as
the messages it would have been (:class:`KeptOutputs`), never in
``messages``: no view, model input or channel ever sees it, and a
``send_message`` it asks for is recorded, not sent.  It and its tokens count
against the group's quotas (runs per hour, tokens per day): they are spent on
the group's behalf, at the same price.

The workspace is hostile (everything the agent left there is), so the copy
(:func:`copy_workspace`) walks it by descriptor with ``O_NOFOLLOW``
(``sandbox/hostile_fs.py``): a symlink is copied as the link it is, never
followed (inside the container it points where it pointed in the run); FIFOs,
sockets and devices are skipped, named in the replay's record; files are
opened non-blocking and read at most to the copy's byte bound.  Each folder is
read as it is copied, never listed whole (a folder can hold millions of hard
links at no inode cost), and every entry met counts toward
``ORCHESTRATOR_REPLAY_MAX_FILES``, skipped ones too.  A workspace over
``ORCHESTRATOR_REPLAY_MAX_BYTES`` or ``ORCHESTRATOR_REPLAY_MAX_FILES`` is
refused rather than copied in part.

``orchestrator/run/run_diff.py`` sets any two runs side by side.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from agent_runner.protocol import (
    EditEvent,
    ModelSettings,
    ProtocolError,
    QuestionEvent,
    ReactEvent,
    TaskEvent,
    TextDeltaEvent,
    decode_input,
)
from orchestrator.core.errors import ConfigError, MountRefused, ReplayLimited, ReplayRefused, StoreError
from orchestrator.core.settings import Settings
from orchestrator.model.messages import SENDER_BOT
from orchestrator.run.assembly import input_bytes, record_input, stored_input
from orchestrator.run.attempt import AttemptContext, Mounts, Verdict, run_attempt
from orchestrator.run.live_draft import FREE_LINES_PER_EVENT
from orchestrator.run.model_choice import model_settings
from orchestrator.run.outputs import OutputMessage, host_message
from orchestrator.run.questions import question_text
from orchestrator.run.result_meta import result_meta_message
from orchestrator.sandbox.bounded_io import OutputBudget
from orchestrator.sandbox.config import effective_limits, parse_container_config, workspace_quota
from orchestrator.sandbox.egress import EgressProxy
from orchestrator.sandbox.hostile_fs import MAX_DEPTH, opened_root
from orchestrator.sandbox.mounts import group_workspace, prepare_mountpoints, resolve_mounts
from orchestrator.sandbox.port import Sandbox
from orchestrator.sandbox.quota import Volume, scratch_volume
from orchestrator.store.db import Database
from orchestrator.store.groups import Group, get_group
from orchestrator.store.hosts import process_owner
from orchestrator.store.replays import add_replay, save_outputs, seconds_running
from orchestrator.store.runs import Run, finish_run, get_run, new_run_id
from orchestrator.store.slots import take_replay_slot
from orchestrator.store.usage import quota_wait

log = logging.getLogger(__name__)

# As hostile_fs opens them: never through a symlink; a FIFO cannot block the open.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20
# Skipped entries named in a copy's report (the rest only counted).
SKIPPED_KEPT = 100


# -- the scratch copy ------------------------------------------------------------------


@dataclass
class CopyReport:
    """What :func:`copy_workspace` copied, and what it left out (relative paths, with why:
    the first :data:`SKIPPED_KEPT`, all of them counted in ``skipped_count``)."""

    files: int = 0
    folders: int = 0
    symlinks: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    skipped_count: int = 0
    seen: int = 0  # every entry met, copied or not: what ORCHESTRATOR_REPLAY_MAX_FILES bounds

    @property
    def entries(self) -> int:
        return self.files + self.folders + self.symlinks

    def skip(self, why: str) -> None:
        self.skipped_count += 1
        if len(self.skipped) < SKIPPED_KEPT:
            self.skipped.append(why)

    def as_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "folders": self.folders,
            "symlinks": self.symlinks,
            "bytes": self.bytes,
            "skipped": self.skipped[:SKIPPED_KEPT],
            "skipped_count": self.skipped_count,
        }


def copy_workspace(source: Path, dest: Path, *, max_bytes: int, max_files: int) -> CopyReport:
    """Copy the hostile folder ``source`` to the new folder ``dest``, bounded (see the module's doc).

    Raises :class:`ReplayRefused` past ``max_bytes`` bytes or ``max_files`` entries (every
    entry met counts, a FIFO, socket or device it skips too; ``dest`` is left for the
    caller to remove).  A ``source`` that does not exist copies as an empty folder.

    Depth first, each folder read as it is copied (never listed whole): one listing and
    three descriptors a level (the source, its listing, the copy), at most ``MAX_DEPTH``
    levels (deeper folders are skipped, named in the report), so memory and descriptors
    stay flat however many names a folder holds.
    """
    report = CopyReport()
    dest.mkdir(parents=True, exist_ok=False)
    if not os.path.lexists(source):
        return report
    with opened_root(source) as src, opened_root(dest) as dst:
        _copy_folder(src, dst, "", 0, report, max_bytes, max_files)
    return report


def _copy_folder(
    src: int, dst: int, where: str, depth: int, report: CopyReport, max_bytes: int, max_files: int
) -> None:
    if depth > MAX_DEPTH:
        report.skip(f"{where}: more than {MAX_DEPTH} levels deep")
        return
    with os.scandir(src) as it:
        for entry in it:  # read as it is copied: never the whole listing in memory
            _copy_entry(entry, src, dst, where, depth, report, max_bytes, max_files)


def _copy_entry(
    entry: os.DirEntry[str],
    src: int,
    dst: int,
    where: str,
    depth: int,
    report: CopyReport,
    max_bytes: int,
    max_files: int,
) -> None:
    name = entry.name
    path = f"{where}{name}"
    report.seen += 1
    if report.seen > max_files:
        raise ReplayRefused(
            f"the workspace holds more than {max_files} entries (ORCHESTRATOR_REPLAY_MAX_FILES); nothing was replayed"
        )
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return  # gone since the listing
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        try:
            target = os.readlink(name, dir_fd=src)
        except OSError:
            return
        try:
            os.symlink(target, name, dir_fd=dst)  # the link itself, never what it names
        except FileExistsError:
            report.skip(f"{path}: changed while it was copied")
            return
        report.symlinks += 1
    elif stat.S_ISDIR(mode):
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=src)  # swapped for a symlink since: refused
        except OSError:
            report.skip(f"{path}/: changed while it was copied")
            return
        try:
            try:
                os.mkdir(name, 0o755, dir_fd=dst)
            except FileExistsError:  # met twice: the folder changed while it was read
                report.skip(f"{path}/: changed while it was copied")
                return
            made = os.open(name, _DIR_FLAGS, dir_fd=dst)
            report.folders += 1
            try:
                _copy_folder(child, made, f"{path}/", depth + 1, report, max_bytes, max_files)
            finally:
                os.close(made)
        finally:
            os.close(child)
    elif stat.S_ISREG(mode):
        _copy_file(src, dst, name, path, report, max_bytes)
    else:
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        report.skip(f"{path}: {kind}, not copied")


def _copy_file(src: int, dst: int, name: str, path: str, report: CopyReport, max_bytes: int) -> None:
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=src)
    except OSError:
        report.skip(f"{path}: changed while it was copied")
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped since the listing
            report.skip(f"{path}: not a regular file when opened")
            return
        left = max_bytes - report.bytes
        if st.st_size > left:
            raise ReplayRefused(_too_big(max_bytes))
        try:
            out = os.open(name, _NEW_FILE_FLAGS, st.st_mode & 0o777, dir_fd=dst)
        except FileExistsError:  # met twice: the folder changed while it was read
            report.skip(f"{path}: changed while it was copied")
            return
        try:
            while True:
                # A file that grows while it is read still stops at the bound.
                chunk = os.read(fd, min(_CHUNK, left + 1))
                if not chunk:
                    break
                if len(chunk) > left:
                    raise ReplayRefused(_too_big(max_bytes))
                left -= len(chunk)
                report.bytes += len(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view) :]
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))  # `make`, git's index: times matter
        finally:
            os.close(out)
        report.files += 1
    finally:
        os.close(fd)


def _too_big(max_bytes: int) -> str:
    return f"the workspace holds more than {max_bytes} bytes (ORCHESTRATOR_REPLAY_MAX_BYTES); nothing was replayed"


# -- making and running a replay -------------------------------------------------------------


def resolve_model(settings: Settings, spec: str) -> ModelSettings:
    """``spec`` ("offline", "anthropic:<id>", "openai:<id>") as the pipeline resolves
    ``ORCHESTRATOR_MODEL``: the host's output cap and thinking budget with it."""
    return model_settings(settings.replace(model=spec))


def create_replay(db: Database, settings: Settings, run_id: str, model: str) -> Run:
    """A queued replay of ``run_id`` (an id or a unique prefix) with ``model``; its input recorded.

    Raises :class:`StoreError` for no such run, :class:`ConfigError` for a model
    spelled wrong, :class:`ReplayRefused` for a run without a usable recorded input.
    """
    original = get_run(db, run_id)
    check_quota(db, settings, get_group(db, original.chat_jid))
    resolved = resolve_model(settings, model)
    raw = stored_input(db, original.id)
    if raw is None:
        raise ReplayRefused(f"run {original.id} has no recorded input (it failed before assembling one)")
    try:
        recorded = decode_input(raw)
    except ProtocolError as exc:
        raise ReplayRefused(f"run {original.id}'s recorded input does not decode: {exc}") from None
    replay_id = new_run_id()
    # The same messages, notices, send targets and limits, byte for byte; another model;
    # no session (the original's is the chat's, and a replay must never resume it).
    payload = recorded.replace(run_id=replay_id, session_id=None, model=resolved, traceparent=msgspec.UNSET)
    add_replay(db, replay_id=replay_id, original=original, model=model.strip())
    record_input(db, replay_id, input_bytes(payload))
    return get_run(db, replay_id)


def check_quota(db: Database, settings: Settings, group: Group) -> None:
    """Raise :class:`ReplayLimited` while ``group`` waits for a quota (runs per hour, tokens per
    day): a replay is spent on its behalf, and counts as one of its runs."""
    wait = quota_wait(db, settings, group)
    if wait is None:
        return
    spent = "runs in the last hour" if wait.quota == "runs_per_hour" else "model tokens today (UTC)"
    raise ReplayLimited(
        f"{group.chat_jid} has used {wait.used:,} of its {wait.limit:,} {spent}; a replay counts against the "
        f"group's quotas: try again after {wait.until:%Y-%m-%d %H:%M:%S} UTC",
        wait.wait_s,
    )


def fail_replay(db: Database, run_id: str, why: str) -> Run:
    """End a replay that could not start (its task could not be sent, say)."""
    return finish_run(db, run_id, state="failed", error=why)


class KeptOutputs:
    """A replay's outputs (its :class:`~orchestrator.run.attempt.RunOutputs`): kept for
    ``replay_outputs`` as the messages they would have been, none stored as one; a
    ``send_message`` is recorded with where it would have gone, never sent."""

    def __init__(self) -> None:
        self.kept: list[OutputMessage] = []

    def output(self, out: OutputMessage) -> None:
        self.kept.append(out)

    def send_message(self, chat_jid: str, out: OutputMessage | None, index: int) -> None:
        if out is not None:
            self.kept.append(out.model_copy(update={"metadata": {"via": "send_message", "to_chat": chat_jid}}))

    def task(self, event: TaskEvent, index: int) -> None:
        # A replay schedules nothing: the request is kept as the host message it would have been.
        said = f"🗓 (replay) the agent asked to {event.action} a task: {event.kind or ''} {event.spec or ''} {event.prompt or ''}"
        self.kept.append(host_message(run_id=f"task-{index:04d}", text=said.strip()))

    def egress(self, proxy: EgressProxy) -> None:
        # A replay's sandbox gets no egress proxy (its mounts leave the policy off).
        return None

    def edit(self, event: EditEvent, index: int) -> None:
        # A replay changes nothing in the chat: the request is kept as the host message it would be.
        said = f"✏️ (replay) the agent asked to change its message {event.nth_last} back to: {event.text}"
        self.kept.append(host_message(run_id=f"edit-{index:04d}", text=said))

    def react(self, event: ReactEvent, index: int) -> None:
        # As an edit: the request is kept, nothing shown changes.
        said = f"{event.emoji} (replay) the agent asked to react to the message {event.nth_last} back"
        self.kept.append(host_message(run_id=f"react-{index:04d}", text=said))

    def question(self, event: QuestionEvent, index: int) -> bool:
        # A replay asks nobody: the question is kept as the message it would have been, and
        # the replay ends as the run would have (awaiting an answer).
        text = question_text(event.question, event.options, multiple=event.multiple, allow_other=event.allow_other)
        self.kept.append(
            OutputMessage(
                id=f"question-{index:04d}",
                sender=SENDER_BOT,
                sender_name="agent",
                content=text,
                message_type="assistant",
                metadata={"via": "ask_user"},
            )
        )
        return True

    def send_file(self, workspace: Path, path: str, out: OutputMessage) -> None:
        # A replay stores no file (its workspace is a scratch copy): where it would have come from.
        self.kept.append(out.model_copy(update={"metadata": {"via": "send_file", "path": path}}))


class UnshownDraft:
    """A replay's streamed text (its :class:`~orchestrator.run.attempt.Draft`): neither shown
    (a replay has no chat) nor kept; as in a chat run, free up to the live draft's allowance
    (``run/live_draft.py``), past which each delta line counts."""

    def __init__(self, settings: Settings) -> None:
        self.free_lines = FREE_LINES_PER_EVENT * settings.runs.max_run_events
        self.free_bytes = settings.runs.max_run_stored_bytes
        self.lines = 0
        self.bytes = 0

    def add(self, event: TextDeltaEvent) -> bool:
        self.lines += 1
        self.bytes += len(event.text.encode("utf-8"))
        return self.lines <= self.free_lines and self.bytes <= self.free_bytes

    def stored(self) -> None:
        pass

    def close(self) -> None:
        pass


def execute_replay(db: Database, settings: Settings, sandbox: Sandbox, run_id: str) -> Run:
    """Run the queued replay ``run_id`` to its end; returns its row.

    Idempotent: a replay that another process took, that ended, or that was
    cancelled while queued is returned as it is (a task delivered twice runs it once).
    """
    run = get_run(db, run_id)
    if run.replay_of is None:
        raise ReplayRefused(f"run {run.id} is not a replay")
    owner = process_owner(settings.fleet.effective_host_id)
    try:
        taken = take_replay_slot(db, settings.fleet.max_concurrent_runs, run_id=run.id, owner=owner)
    except ReplayLimited as exc:  # taken, and ended at once: nothing ran
        return finish_run(db, run.id, state="failed", error=str(exc))
    if not taken:
        run = get_run(db, run.id)
        if run.state == "cancelled" and run.finished_at is None:  # cancelled while it waited
            return finish_run(db, run.id, state="cancelled", error=run.error)
        return run
    run = get_run(db, run.id)
    outputs = KeptOutputs()
    raw = stored_input(db, run.id)
    assert raw is not None  # create_replay recorded it
    payload = decode_input(raw)
    copy_report: CopyReport | None = None
    try:
        group = get_group(db, run.chat_jid)
        with scratch_workspace(settings, run, group) as (mounts, copy_report):
            # A cold container on the image the replayed model needs (claude-code: its variant; no
            # session folder is mounted, so Claude Code starts a throw-away session and resumes nothing).
            verdict = run_attempt(
                AttemptContext(
                    db=db,
                    settings=settings,
                    sandbox=sandbox,
                    group=group,
                    run=run,
                    payload=payload,
                    assistant=payload.assistant_name,
                    mounts=lambda: mounts,
                    outputs=outputs,
                    draft=UnshownDraft(settings),
                    budget=OutputBudget(settings.runs.max_run_events, settings.runs.max_run_stored_bytes),
                    name_prefix="orch-replay",
                    labels={"orchestrator.replay_of": run.replay_of or ""},
                )
            )
    except (ConfigError, MountRefused, ReplayRefused, StoreError) as exc:
        verdict = Verdict("failed", str(exc))
    except Exception as exc:  # the replay still ends, saying why
        log.exception("replay %s failed", run.id)
        verdict = Verdict("failed", f"{type(exc).__name__}: {exc}")
    except BaseException:
        # Ctrl-C in the CLI, the worker's hard stop: the container is gone with the context;
        # the row must not stay unfinished (nothing else closes a replay).
        finish_run(db, run.id, state="failed", error="the replay was interrupted")
        raise
    outputs.kept.append(
        result_meta_message(
            run_id=run.id,
            provider=payload.model.provider,
            model=payload.model.model,
            state=verdict.state,
            stop_reason=verdict.stop_reason,
            limit=verdict.limit,
            num_turns=verdict.num_turns,
            attempts=1,
            duration_s=seconds_running(db, run.id),
            usage=verdict.usage,
        )
    )
    save_outputs(
        db, run.id, [o.model_dump() for o in outputs.kept], None if copy_report is None else copy_report.as_json()
    )
    done = verdict.end_run(db, run.id)
    log.info(
        "replay %s of run %s with %s:%s ended %s",
        run.id,
        run.replay_of,
        payload.model.provider,
        payload.model.model,
        done.state,
    )
    return done


@contextlib.contextmanager
def scratch_workspace(settings: Settings, run: Run, group: Group) -> Iterator[tuple[Mounts, CopyReport]]:
    """What the replay ``run``'s container mounts: a scratch copy of ``group``'s workspace (removed
    on the way out) and the group's extra folders, all read-only; with the copy's report."""
    workspace = group_workspace(settings, group.folder)
    volume = Volume.of(settings, group.folder, workspace)
    if volume.image.exists() and volume.mounted() != "ours":
        # Its files are in a volume not mounted here: the folder under it is not the workspace.
        raise ReplayRefused(
            f"the workspace of {group.folder!r} lives in the volume {volume.image}, not mounted "
            "on this host; replay where the group's runs go"
        )
    cfg = parse_container_config(group.container_config)
    limits = effective_limits(settings, cfg)
    # The copy lives in a throw-away volume of the group's workspace quota where the host
    # can loop-mount one (sandbox/quota/scratch.py): what the replayed agent writes stops there, as
    # in the group's own workspace, instead of filling the data dir's disk.
    scratch_root = settings.runs_dir / f"{run.id}.scratch"
    scratch = scratch_root / "workspace"
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, scratch_root, ignore_errors=True)
        scratch_root.mkdir(mode=0o700, parents=True, exist_ok=False)
        cleanup.enter_context(scratch_volume(settings, run.id, scratch_root, workspace_quota(settings, cfg)))
        report = copy_workspace(
            workspace, scratch, max_bytes=settings.runs.replay_max_bytes, max_files=settings.runs.replay_max_files
        )
        # The group's extra folders, re-checked against the allowlist, and read-only
        # whatever the group's config says: a replay writes nothing that outlives it.
        mounts = resolve_mounts(
            settings, cfg.extra_mounts, folder=group.folder, is_main=group.is_main, chat_jid=group.chat_jid
        )
        prepare_mountpoints(scratch, mounts)
        yield Mounts(scratch, limits, read_only={str(m.host): m.container for m in mounts}), report
