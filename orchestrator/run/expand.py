"""Context blocks expanded when a run is assembled (the items are ``orchestrator/model/context.py``).

The stored ``content`` stays exactly what the person typed.  The blocks are
expanded only when a run is assembled, so every run sees the files and pages
as they are now; an edited message gets fresh context for free.  Each block
is one XML element the model can tell apart from the text; an item that
cannot be read becomes an ``*_error`` element rather than failing the run, so
the model can say what it could not see.  Files are read through
``orchestrator/sandbox/hostile_fs.py``: the workspace is the agent's.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable
from datetime import UTC, datetime
from html import escape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx

from orchestrator.core.errors import HostileEntry
from orchestrator.core.jsontypes import JsonObject
from orchestrator.core.settings import Settings
from orchestrator.model.context import ContextItem, FileItem, SelectionItem, UrlItem, parse_context
from orchestrator.model.envelopes import InvalidMessageMetadata
from orchestrator.sandbox.hostile_fs import read_regular

MAX_REDIRECTS = 3


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


class ContextUnavailable(Exception):
    """One item could not be read; becomes an error block, never a failed run."""


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
        text, mtime_s = _read_text(workspace, item.path, settings.context_file_max_bytes)
    except ContextUnavailable as exc:
        return _tag("file_context_error", path=item.path, error=f"[Error: {exc}]")
    mtime = datetime.fromtimestamp(mtime_s, UTC).isoformat()
    return _tag("file_context", path=item.path, mtime=mtime, content=text)


class _TextOnly(HTMLParser):
    """Visible text of an HTML page (scripts and styles dropped)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag in ("script", "style", "noscript"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "noscript") and self._skip:
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip and data.strip():
            self.parts.append(data.strip())


def _check_address(url: str, settings: Settings) -> None:
    if settings.context_url_allow_private:
        return
    host = urlsplit(url).hostname or ""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError as exc:
        raise ContextUnavailable(f"cannot resolve {host}: {exc}") from None
    for info in infos:
        addr = ipaddress.ip_address(info[4][0])
        if not addr.is_global:
            raise ContextUnavailable(f"{host} resolves to a non-public address; refused")


def fetch_url(url: str, settings: Settings) -> str:
    """GET ``url`` as text, following a few redirects (each one checked)."""
    limit = settings.context_url_max_bytes
    with httpx.Client(timeout=settings.context_url_timeout_s, follow_redirects=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            if urlsplit(url).scheme not in ("http", "https"):
                raise ContextUnavailable("redirected away from http(s)")
            _check_address(url, settings)
            try:
                with client.stream("GET", url, headers={"Accept": "text/*, application/json"}) as resp:
                    if resp.is_redirect and "location" in resp.headers:
                        url = urljoin(url, resp.headers["location"])
                        continue
                    if resp.status_code >= 400:
                        raise ContextUnavailable(f"HTTP {resp.status_code}")
                    kind = resp.headers.get("content-type", "text/plain").split(";")[0].strip().lower()
                    if not (kind.startswith("text/") or kind.endswith(("json", "xml"))):
                        raise ContextUnavailable(f"not a text document ({kind})")
                    data = b""
                    for chunk in resp.iter_bytes():
                        data += chunk
                        if len(data) > limit:
                            break
                    text = data[:limit].decode(resp.encoding or "utf-8", errors="replace")
            except httpx.HTTPError as exc:
                raise ContextUnavailable(f"{type(exc).__name__}: {exc}") from None
            if kind == "text/html":
                parser = _TextOnly()
                parser.feed(text)
                text = "\n".join(parser.parts)
            if len(data) > limit:
                text += f"\n[... truncated at {limit} bytes]"
            return text
    raise ContextUnavailable("too many redirects")


def expand_url(item: UrlItem, settings: Settings, fetch: Callable[[str, Settings], str] = fetch_url) -> str:
    try:
        text = fetch(item.url, settings)
    except ContextUnavailable as exc:
        return _tag("url_context_error", url=item.url, error=f"[Error: {exc}]")
    return _tag("url_content", url=item.url, content=text)


def expand_selection(item: SelectionItem) -> str:
    return _tag(
        "selected_text", title=item.title, path=item.path,
        start_line=item.start_line, end_line=item.end_line, content=item.text,
    )


def expand_items(items: list[ContextItem], workspace: Path, settings: Settings) -> list[str]:
    blocks = []
    for item in items:
        if isinstance(item, FileItem):
            blocks.append(expand_file(item, workspace, settings))
        elif isinstance(item, UrlItem):
            blocks.append(expand_url(item, settings))
        else:
            blocks.append(expand_selection(item))
    return blocks


def expand_content(content: str, metadata: JsonObject | None, workspace: Path, settings: Settings) -> str:
    """What the model reads for one message: the typed text, then its context blocks."""
    try:
        items = parse_context(metadata)
    except InvalidMessageMetadata as exc:
        # Stored before validation existed (or imported): say so, do not fail the run.
        return f"{content}\n\n{_tag('context_error', error=f'[Error: {exc}]')}"
    if not items:
        return content
    return "\n\n".join([content, *expand_items(items, workspace, settings)])
