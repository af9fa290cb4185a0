"""The files a run brings into its workspace, and what its notice says of them.

A run's files are those of the people's messages it answers (its batch): each FILE
envelope's files, in the order the messages came, each once.  The attempt places them
under ``inbox/`` (``sandbox/inbox.py``) once the workspace is held for it, and tells the
agent where each went in a system notice: the model reads a message's files as a line
after its words (``model/views.py``), the notice adds the path.  A retried attempt places
them again; a file already there with the same bytes is reused, so a retry adds no copy.

Files that cannot be placed (the agent made ``inbox`` a symlink or a FIFO, a stored
content is missing) do not fail the run: the notice says which and why, so the agent can
tell its chat.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from orchestrator.core.errors import NotFound, OrchestratorError
from orchestrator.core.sizes import human_size
from orchestrator.model.envelopes import files_of
from orchestrator.model.messages import StoredMessage
from orchestrator.sandbox.inbox import PlacedFile, place_files
from orchestrator.store.files import FileStore, StoredFile

log = logging.getLogger(__name__)


def batch_files(store: FileStore, messages: Iterable[StoredMessage]) -> list[StoredFile]:
    """The files of the people's messages in ``messages``, in order, each once (a file
    whose row is gone since, by a truncate or a group's removal, is left out)."""
    found: dict[str, StoredFile] = {}
    for message in messages:
        if message.message_type != "user" or message.is_from_me:
            continue
        files = files_of(message.metadata)
        for ref in files.files if files is not None else ():
            if ref.id in found:
                continue
            try:
                found[ref.id] = store.get(ref.id, message.chat_jid)
            except NotFound:
                log.warning("message %s names file %s, which is gone", message.id, ref.id)
    return list(found.values())


def placed_notice(placed: list[PlacedFile]) -> str:
    """The system notice naming where each of the run's files is."""
    listed = "; ".join(f"{p.path} ({p.mime}, {human_size(p.size)})" for p in placed)
    return f"Files sent with the new messages are in your workspace: {listed}."


def place_run_files(workspace: Path, files: list[StoredFile], store: FileStore) -> list[str]:
    """Place ``files`` under the workspace's inbox; the notices that say where (or why not)."""
    if not files:
        return []
    try:
        # A group's first run: its workspace is made here (the sandbox hands it over after).
        workspace.mkdir(parents=True, exist_ok=True)
        placed = place_files(workspace, files, store)
    except OrchestratorError as exc:
        log.warning("the run's %d file(s) were not placed: %s", len(files), exc)
        names = ", ".join(f.name for f in files)
        return [f"Files were sent with the new messages ({names}) but could not be placed in the workspace: {exc}"]
    return [placed_notice(placed)]
