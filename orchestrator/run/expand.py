"""Context blocks expanded when a run is assembled (the items are ``orchestrator/model/context.py``).

The stored ``content`` stays exactly what the person typed.  The blocks are
expanded only when a run is assembled, so every run sees the files and pages
as they are now; an edited message gets fresh context for free.  Each block
is one XML element the model can tell apart from the text; an item that
cannot be read becomes an ``*_error`` element rather than failing the run, so
the model can say what it could not see.  Files are read through
``orchestrator/sandbox/hostile_fs.py``: the workspace is the agent's; URLs
through ``orchestrator/run/url_fetch.py``: a chat message names them.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from html import escape
from pathlib import Path

from orchestrator.core.errors import HostileEntry, InvalidMessageMetadata
from orchestrator.core.jsontypes import JsonObject
from orchestrator.core.settings import Settings
from orchestrator.model.context import ContextItem, FileItem, SelectionItem, UrlItem, parse_context
from orchestrator.run.url_fetch import ContextUnavailable, UrlBudget, fetch_url
from orchestrator.sandbox.hostile_fs import read_regular

log = logging.getLogger(__name__)

# -- expansion ----------------------------------------------------------------


def _tag(name: str, **fields: object) -> str:
    # Names and paths are escaped so they cannot close the element; the body
    # is left as it is, because the model reads code and markup verbatim.
    lines = [f"<{name}>"]
    for key, value in fields.items():
        if value is None:
            continue
        if key == "content":
            lines.append(f"<content>\n{value}\n</content>")
        else:
            lines.append(f"<{key}>{escape(str(value), quote=False)}</{key}>")
    lines.append(f"</{name}>")
    return "\n".join(lines)


def _read_text(workspace: Path, relative: str, limit: int) -> tuple[str, float]:
    """The file's text (cut at ``limit`` bytes) and mtime.

    The workspace is the agent's, and a process it left running may swap a
    file for a symlink or a FIFO while we read: the file is reached through
    :mod:`orchestrator.sandbox.hostile_fs` (no symlink followed anywhere on the way,
    a regular file only, opened non-blocking, read bounded), never by a
    checked-then-opened path.
    """
    if os.path.isabs(relative):
        raise ContextUnavailable("absolute paths are not allowed; use a path inside the group folder")
    try:
        data, st = read_regular(workspace, relative, limit)
    except HostileEntry as exc:
        raise ContextUnavailable(exc.reason) from None
    except OSError as exc:
        raise ContextUnavailable(exc.strerror or str(exc)) from None
    if b"\x00" in data[:8192]:
        raise ContextUnavailable("binary file")
    text = data[:limit].decode("utf-8", errors="replace")
    if len(data) > limit:
        text += f"\n[... truncated at {limit} bytes]"
    return text, st.st_mtime


def expand_file(item: FileItem, workspace: Path, settings: Settings) -> str:
    try:
        text, mtime_s = _read_text(workspace, item.path, settings.context.file_max_bytes)
    except ContextUnavailable as exc:
        return _tag("file_context_error", path=item.path, error=f"[Error: {exc}]")
    mtime = datetime.fromtimestamp(mtime_s, UTC).isoformat()
    return _tag("file_context", path=item.path, mtime=mtime, content=text)


def expand_url(item: UrlItem, settings: Settings, budget: UrlBudget | None = None) -> str:
    """A URL block, fetched now (``orchestrator/run/url_fetch.py``: no rebinding window, within the
    fetch's deadline and, given its ``budget``, the run's)."""
    try:
        text = fetch_url(item.url, settings.context, budget=budget)
    except ContextUnavailable as exc:
        return _tag("url_context_error", url=item.url, error=f"[Error: {exc}]")
    except Exception as exc:  # the last line; see below
        # A failure url_fetch did not foresee, on what someone else's server sent.  History is
        # expanded again for every run, so letting it out would fail every later run of the group
        # until the message left the window.  It is a bug there: logged with its traceback.
        log.exception("URL context item %s: unexpected failure", item.url)
        return _tag("url_context_error", url=item.url, error=f"[Error: cannot read the URL ({type(exc).__name__})]")
    return _tag("url_content", url=item.url, content=text)


def expand_selection(item: SelectionItem) -> str:
    return _tag(
        "selected_text",
        title=item.title,
        path=item.path,
        start_line=item.start_line,
        end_line=item.end_line,
        content=item.text,
    )


def expand_items(
    items: list[ContextItem], workspace: Path, settings: Settings, budget: UrlBudget | None = None
) -> list[str]:
    blocks = []
    for item in items:
        if isinstance(item, FileItem):
            blocks.append(expand_file(item, workspace, settings))
        elif isinstance(item, UrlItem):
            blocks.append(expand_url(item, settings, budget))
        else:
            blocks.append(expand_selection(item))
    return blocks


def expand_content(
    content: str, metadata: JsonObject | None, workspace: Path, settings: Settings, budget: UrlBudget | None = None
) -> str:
    """What the model reads for one message: the typed text, then its context blocks (its URLs
    within ``budget``, the deadline of the run's input, when given)."""
    try:
        items = parse_context(metadata)
    except InvalidMessageMetadata as exc:
        # Stored before validation existed (or imported): say so, do not fail the run.
        return f"{content}\n\n{_tag('context_error', error=f'[Error: {exc}]')}"
    if not items:
        return content
    return "\n\n".join([content, *expand_items(items, workspace, settings, budget)])
