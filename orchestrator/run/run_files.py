"""The files a run brings into its workspace, and what its notice says of them.

A run's files are those of the people's messages it answers (its batch): each FILE
envelope's files, in the order the messages came, each once.  The attempt places them
under ``inbox/`` (``sandbox/inbox.py``) once the workspace is held for it, and tells the
agent where each went in a system notice: the model reads a message's files as a line
after its words (``model/views.py``), the notice adds the path.  A retried attempt places
them again; a file already there with the same bytes is reused, so a retry adds no copy.

A model that sees images (``ORCHESTRATOR_VISION_MODELS``) is also sent the raster images of
the run's own messages: the input names each by file id (:func:`with_images`), the attempt
adds the path it placed it at (:func:`placed_images`), and the runner reads, scales and
encodes it inside the sandbox (``agent_runner/images.py``).  Older messages name their
files in their text only, so history is not crowded out by pictures.

Files that cannot be placed (the agent made ``inbox`` a symlink or a FIFO, a stored
content is missing) do not fail the run: the notice says which and why, so the agent can
tell its chat.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterable
from pathlib import Path

from agent_runner.protocol import ContainerInput, ImageRef, ModelSettings
from orchestrator.core.errors import NotFound, OrchestratorError
from orchestrator.core.settings import Settings
from orchestrator.core.sizes import human_size
from orchestrator.model.envelopes import files_of
from orchestrator.model.messages import StoredMessage
from orchestrator.model.views import ViewItem
from orchestrator.sandbox.inbox import PlacedFile, place_files
from orchestrator.sandbox.providers import PROVIDERS
from orchestrator.store.file_rows import StoredFile
from orchestrator.store.file_types import INLINE_IMAGE_TYPES
from orchestrator.store.files import FileStore

log = logging.getLogger(__name__)


def batch_files(store: FileStore, messages: Iterable[StoredMessage]) -> list[StoredFile]:
    """The files of the people's messages in ``messages``, in order, each once (a file
    whose row is gone since, by a truncate or a group's removal, is left out)."""
    found: dict[str, StoredFile] = {}
    for message in messages:
        if message.part.kind != "user_text" or message.is_from_me:
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


def sees_images(settings: Settings, model: ModelSettings) -> bool:
    """Whether ``model`` is sent a message's images (``ORCHESTRATOR_VISION_MODELS``)."""
    # A provider that takes no image blocks reads the images itself (sandbox/providers.py).
    if not PROVIDERS[model.provider].image_blocks:
        return False
    patterns = [p.strip().lower() for p in settings.provider.vision_models.split(",") if p.strip()]
    return any(fnmatch.fnmatchcase(model.model.lower(), p) for p in patterns)


def with_images(items: list[ViewItem], seqs: set[int]) -> list[ViewItem]:
    """``items`` with the people's messages among ``seqs`` naming their raster images
    (by file id: the attempt adds where it placed each, :func:`placed_images`)."""
    out = []
    for item in items:
        files = files_of(item.source.metadata) if item.source.seq in seqs and item.message.role == "user" else None
        refs = (
            [ImageRef(file_id=f.id, mime=f.mime) for f in files.files if f.mime in INLINE_IMAGE_TYPES] if files else []
        )
        out.append(ViewItem(item.source, item.message.replace(images=refs)) if refs else item)
    return out


def placed_images(payload: ContainerInput, placed: list[PlacedFile]) -> ContainerInput:
    """``payload`` with each image its messages name given the path it was placed at (an
    image that was not placed keeps none: the runner says so to the model)."""
    paths = {p.file_id: p.path for p in placed}
    if not paths:
        return payload
    messages = [
        m.replace(images=[i.replace(path=paths[i.file_id]) if i.file_id in paths else i for i in m.images])
        if isinstance(m.images, list)
        else m
        for m in payload.messages
    ]
    return payload.replace(messages=messages)


def placed_notice(placed: list[PlacedFile]) -> str:
    """The system notice naming where each of the run's files is."""
    listed = "; ".join(f"{p.path} ({p.mime}, {human_size(p.size)})" for p in placed)
    return f"Files sent with the new messages are in your workspace: {listed}."


def place_run_files(
    workspace: Path, files: list[StoredFile], store: FileStore, payload: ContainerInput
) -> ContainerInput:
    """Place ``files`` under the workspace's inbox: ``payload`` with the notice that says
    where (or why not) and its images' paths."""
    if not files:
        return payload
    try:
        # A group's first run: its workspace is made here (the sandbox hands it over after).
        workspace.mkdir(parents=True, exist_ok=True)
        placed = place_files(workspace, files, store)
    except OrchestratorError as exc:
        log.warning("the run's %d file(s) were not placed: %s", len(files), exc)
        names = ", ".join(f.name for f in files)
        notice = f"Files were sent with the new messages ({names}) but could not be placed in the workspace: {exc}"
        return payload.replace(system_notices=[*payload.system_notices, notice])
    payload = payload.replace(system_notices=[*payload.system_notices, placed_notice(placed)])
    return placed_images(payload, placed)
