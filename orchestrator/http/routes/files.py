"""A chat's files over HTTP: upload them, list them, download one (issue 31).

``POST /api/chats/{chat_jid}/files`` takes ``multipart/form-data`` with one to
:data:`MAX_FILES_PER_MESSAGE` parts named ``file`` (any other part is a 400) and stores each
in the file store (``orchestrator/store/files.py``), answering 201 with what was stored;
a message then names the files by id in its FILE envelope.  The chat must be a registered
group's (404 otherwise, before a byte of the body is read).

**Streamed, never whole in memory or in a spool.**  The body is not read by Starlette's
``request.form()``, which writes every file part to a ``SpooledTemporaryFile`` in the
system's temporary folder (1 MiB in memory, the rest on disk, with no per-part limit) before
the route sees any of it.  Here, the request's chunks are fed as they arrive to
``python-multipart``'s ``MultipartParser`` (the parser Starlette itself uses), and each file
part's bytes go straight into :meth:`FileStore.store`, which writes them to its own
temporary file under ``<data_dir>/files/tmp`` and stops at ``ORCHESTRATOR_FILE_MAX_BYTES``:
one chunk of the request in memory at a time, and nothing on disk outside the file store.
The parsing and storing run in the thread pool (the store's writes and the database block),
pulling each chunk from the event loop.  A part's headers are bounded
(:data:`PART_HEADERS_MAX_BYTES`), and so is the whole body (:func:`upload_limit`; the
request guard refuses a ``Content-Length`` over it, and the body is counted here as it
streams, for a chunked one).

**All or nothing.**  Past the per-file limit, or past the group's
(``ORCHESTRATOR_GROUP_FILES_MAX_BYTES``): 413 naming the limit and its setting.  Sizes
cannot be checked before storing (a part's size is known at its end, and what counts
against the group depends on which contents are new), so the files of the same request
stored before the failing one are taken back (:meth:`FileStore.discard`: their rows, and
the bytes no other row refers to).  Any other refusal (a 400 for a malformed body, a part
not named ``file``, too many files; the client going away) takes them back the same way.

``GET /api/files/{file_id}`` serves the bytes as a download, whatever they are:
``Content-Disposition: attachment`` with the stored (safe) name, the stored type (sniffed
from the bytes, never the sender's: HTML and SVG are ``text/plain``),
``X-Content-Type-Options: nosniff``, a ``Content-Security-Policy`` that runs nothing and
sandboxes the document, ``Cache-Control: private``.  ``?inline=true`` shows a raster image
(:data:`INLINE_IMAGE_TYPES`) in place; any other type stays an attachment.  The bytes are
read through the store's checked descriptor and streamed.  ``GET /api/chats/{chat_jid}/files``
lists a chat's files, oldest first.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import quote

import anyio.from_thread
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect

from agent_runner.protocol import MAX_FILES_PER_MESSAGE
from orchestrator.core.errors import BadInput, UnknownGroup
from orchestrator.core.file_links import link_refusal
from orchestrator.core.settings import Settings
from orchestrator.http.guards import BodyLimit
from orchestrator.http.state import api_state
from orchestrator.store.file_rows import StoredFile
from orchestrator.store.file_types import INLINE_IMAGE_TYPES, TEXT, TYPES
from orchestrator.store.files import CHUNK_BYTES, FileStore
from orchestrator.store.groups import is_registered

router = APIRouter()

# The form field each file comes in (curl -F file=@notes.txt -F file=@photo.png).
FILE_FIELD = "file"
# The headers of one part (its Content-Disposition with the file name, a Content-Type):
# a name of a few hundred bytes fits many times over.
PART_HEADERS_MAX_BYTES = 8192
# What an upload's body may hold besides its files' bytes: each part's headers and
# boundaries, and the closing boundary.
UPLOAD_ALLOWANCE_BYTES = (MAX_FILES_PER_MESSAGE + 1) * PART_HEADERS_MAX_BYTES
UPLOAD_PATH = re.compile(r"/api/chats/[^/]+/files")


def upload_limit(settings: Settings) -> int:
    """The body limit of an upload: every file at the per-file limit, and the allowance."""
    return settings.files.max_bytes * MAX_FILES_PER_MESSAGE + UPLOAD_ALLOWANCE_BYTES


def upload_body_limit(settings: Settings) -> BodyLimit:
    """The upload route's own body limit, for the request guard (in place of the API's)."""
    return BodyLimit(
        "POST",
        UPLOAD_PATH,
        upload_limit(settings),
        f"the upload's limit: {MAX_FILES_PER_MESSAGE} files of ORCHESTRATOR_FILE_MAX_BYTES "
        f"and {UPLOAD_ALLOWANCE_BYTES} bytes for their parts' headers",
    )


class FileInfo(BaseModel):
    """A stored file, as the API shows it (a message names it by ``id`` in its FILE envelope)."""

    id: str = Field(description="The file's id: `GET /api/files/{id}` serves its bytes.")
    name: str = Field(description="The sender's name for it, made safe (no folders, no leading dot, ≤ 120 bytes).")
    mime: str = Field(description="The type sniffed from its bytes (never the sender's word).")
    size: int = Field(description="Bytes.")
    sha256: str = Field(description="The SHA-256 of its bytes, in hex.")
    created_at: datetime

    @classmethod
    def of(cls, stored: StoredFile) -> FileInfo:
        return cls(
            id=stored.id,
            name=stored.name,
            mime=stored.mime,
            size=stored.size,
            sha256=stored.sha256,
            created_at=stored.created_at,
        )


# --- upload ------------------------------------------------------------------------------

_UPLOAD_BODY: dict[str, Any] = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "properties": {
                    FILE_FIELD: {
                        "type": "array",
                        "items": {"type": "string", "format": "binary"},
                        "minItems": 1,
                        "maxItems": MAX_FILES_PER_MESSAGE,
                        "description": f"The files, each a part named `{FILE_FIELD}` with its file name "
                        f"(at most {MAX_FILES_PER_MESSAGE}); no other part.",
                    }
                },
                "required": [FILE_FIELD],
            },
            "encoding": {FILE_FIELD: {"contentType": "application/octet-stream"}},
        }
    },
}
_UPLOAD_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {
        "description": f"not a multipart/form-data body; a part not named `{FILE_FIELD}`, none, or more "
        f"than {MAX_FILES_PER_MESSAGE}; a part's headers over {PART_HEADERS_MAX_BYTES} bytes. Nothing was kept"
    },
    404: {"description": "the chat is not a registered group's; nothing was read or kept"},
    413: {
        "description": "a file is larger than ORCHESTRATOR_FILE_MAX_BYTES, or the group's files would pass "
        "ORCHESTRATOR_GROUP_FILES_MAX_BYTES (the answer names the limit), or the body is larger than the "
        f"upload's own limit ({MAX_FILES_PER_MESSAGE} × ORCHESTRATOR_FILE_MAX_BYTES and "
        f"{UPLOAD_ALLOWANCE_BYTES} bytes; not ORCHESTRATOR_API_MAX_REQUEST_BYTES). Nothing was kept, not even "
        "the request's files before the one refused"
    },
}


@router.post(
    "/chats/{chat_jid}/files",
    status_code=201,
    response_model=list[FileInfo],
    responses=_UPLOAD_ERRORS,
    openapi_extra={"requestBody": _UPLOAD_BODY},
)
async def upload(request: Request, chat_jid: str) -> list[FileInfo]:
    """Store files in a chat (see the module's doc); a message names them by id afterwards."""
    state = api_state(request)
    store = FileStore.from_settings(state.db, state.settings)
    content_type_header = request.headers.get("content-type", "")
    chunks = request.stream()

    async def next_chunk() -> bytes | None:
        try:
            return await anext(chunks)
        except StopAsyncIteration:
            return None

    def receive() -> bytes | None:
        return anyio.from_thread.run(next_chunk)

    def work() -> list[StoredFile]:
        if not is_registered(state.db, chat_jid):
            raise UnknownGroup(chat_jid)  # before a byte of the body is read
        boundary = _boundary(content_type_header)
        return _store_parts(store, chat_jid, _Parts(boundary, receive, upload_limit(state.settings)))

    try:
        stored = await run_in_threadpool(work)
    except ClientDisconnect:
        raise BadInput("body", "the client went away before the body ended; nothing was kept") from None
    return [FileInfo.of(f) for f in stored]


def _boundary(content_type: str) -> bytes:
    kind, params = parse_options_header(content_type)
    boundary = params.get(b"boundary", b"")
    if kind != b"multipart/form-data" or not boundary:
        raise BadInput("body", f"an upload is multipart/form-data (with a boundary), with parts named {FILE_FIELD!r}")
    return boundary


def _store_parts(store: FileStore, chat_jid: str, parts: _Parts) -> list[StoredFile]:
    """Store each file part of ``parts`` in ``chat_jid``; all of them, or none (see the module's doc)."""
    stored: list[StoredFile] = []
    try:
        while (disposition := parts.next_part()) is not None:
            field, filename = _field_and_name(disposition)
            if field != FILE_FIELD:
                raise BadInput(FILE_FIELD, f"an upload's parts are all named {FILE_FIELD!r}, not {field!r}")
            if len(stored) == MAX_FILES_PER_MESSAGE:
                raise BadInput(FILE_FIELD, f"at most {MAX_FILES_PER_MESSAGE} files in one upload (a message's files)")
            stored.append(store.store(chat_jid, parts.data(), filename))
        if not stored:
            raise BadInput(FILE_FIELD, f"no file: send each as a part named {FILE_FIELD!r}")
    except BaseException:
        store.discard(stored)
        raise
    return stored


def _field_and_name(disposition: bytes) -> tuple[str, str]:
    kind, options = parse_options_header(disposition)
    if kind != b"form-data" or b"name" not in options:
        raise BadInput(FILE_FIELD, "each part needs 'Content-Disposition: form-data; name=\"file\"; filename=...'")
    return _text(options[b"name"]), _text(options.get(b"filename", b""))


def _text(raw: bytes) -> str:
    # Browsers send a part's name as UTF-8 in the quoted string; the store makes it safe.
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


class _Parts:
    """A multipart body pulled a chunk at a time (``receive``: None at its end) through
    python-multipart's push parser: the parts in order, each its Content-Disposition
    (:meth:`next_part`) and then its bytes (:meth:`data`), with a chunk of the body in
    memory at a time.  The body is counted against ``max_bytes``."""

    def __init__(self, boundary: bytes, receive: Callable[[], bytes | None], max_bytes: int) -> None:
        self._receive = receive
        self._max_bytes = max_bytes
        self._read = 0
        self._ended = False
        self._events: deque[tuple[str, bytes]] = deque()
        self._header_bytes = 0
        self._header_name = b""
        self._header_value = b""
        self._disposition: bytes | None = None
        try:
            self._parser = MultipartParser(
                boundary,
                {
                    "on_part_begin": self._on_part_begin,
                    "on_header_field": self._on_header_field,
                    "on_header_value": self._on_header_value,
                    "on_header_end": self._on_header_end,
                    "on_headers_finished": self._on_headers_finished,
                    "on_part_data": self._on_part_data,
                    "on_part_end": self._on_part_end,
                    "on_end": self._on_end,
                },
            )
        except (FormParserError, ValueError) as exc:
            raise BadInput("body", f"not a multipart body: {exc}") from None

    # -- what the parser calls --------------------------------------------------------

    def _on_part_begin(self) -> None:
        self._header_bytes = 0
        self._disposition = None

    def _count_header(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > PART_HEADERS_MAX_BYTES:
            raise BadInput(FILE_FIELD, f"a part's headers are longer than {PART_HEADERS_MAX_BYTES} bytes")

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._header_name += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._header_value += data[start:end]

    def _on_header_end(self) -> None:
        self._count_header(4)  # the ": " and the line break
        if self._header_name.strip().lower() == b"content-disposition":
            self._disposition = self._header_value
        self._header_name, self._header_value = b"", b""

    def _on_headers_finished(self) -> None:
        if self._disposition is None:
            raise BadInput(FILE_FIELD, "a part has no Content-Disposition")
        self._events.append(("part", self._disposition))

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        self._events.append(("data", data[start:end]))

    def _on_part_end(self) -> None:
        self._events.append(("end", b""))

    def _on_end(self) -> None:
        self._events.append(("done", b""))

    # -- what the route reads ---------------------------------------------------------

    def _next_event(self) -> tuple[str, bytes]:
        while not self._events:
            if self._ended:
                raise BadInput("body", "the multipart body ended before its closing boundary")
            chunk = self._receive()
            try:
                if chunk is None:
                    self._ended = True
                    self._parser.finalize()
                    continue
                self._read += len(chunk)
                if self._read > self._max_bytes:
                    raise HTTPException(
                        413,
                        f"the request body is larger than {self._max_bytes} bytes (the upload's limit: "
                        f"{MAX_FILES_PER_MESSAGE} files of ORCHESTRATOR_FILE_MAX_BYTES and "
                        f"{UPLOAD_ALLOWANCE_BYTES} bytes for their parts' headers)",
                    )
                self._parser.write(chunk)
            except FormParserError as exc:
                raise BadInput("body", f"not a well-formed multipart body: {exc}") from None
        return self._events.popleft()

    def next_part(self) -> bytes | None:
        """The next part's Content-Disposition; None after the last part."""
        kind, value = self._next_event()
        if kind == "done":
            return None
        if kind != "part":  # the parser gives a part's data only after its headers
            raise BadInput("body", "not a well-formed multipart body")
        return value

    def data(self) -> Iterator[bytes]:
        """The bytes of the part :meth:`next_part` gave, as they arrive."""
        while True:
            kind, value = self._next_event()
            if kind == "end":
                return
            if kind != "data":
                raise BadInput("body", "not a well-formed multipart body")
            if value:
                yield value


# --- list and download -------------------------------------------------------------------


@router.get("/chats/{chat_jid}/files", response_model=list[FileInfo])
def chat_files(request: Request, chat_jid: str) -> list[FileInfo]:
    """The files a chat stored, oldest first (none for a chat that stored none)."""
    state = api_state(request)
    return [FileInfo.of(f) for f in FileStore.from_settings(state.db, state.settings).list_chat(chat_jid)]


# What GET /api/files/{file_id} may be: one of the types the store sniffs (its TYPES), as stored.
_BINARY = {"schema": {"type": "string", "format": "binary"}}
_DOWNLOAD_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the file's bytes: its sniffed type (text as `text/plain; charset=utf-8`), "
        "`Content-Disposition: attachment` with its stored name (`inline` for a raster image asked "
        "with `inline=true`), `X-Content-Type-Options: nosniff`, a Content-Security-Policy that runs nothing",
        "content": {mime: _BINARY for mime in sorted(TYPES)},
        "headers": {
            name: {"description": words, "schema": {"type": "string"}}
            for name, words in (
                ("Content-Disposition", "`attachment; filename*=UTF-8''<name>` (RFC 6266, RFC 5987)"),
                ("X-Content-Type-Options", "`nosniff`"),
                ("Content-Security-Policy", "`default-src 'none'; sandbox`"),
                ("Cache-Control", "`private`"),
            )
        },
    },
    404: {"description": "no such file"},
}


@router.get("/files/{file_id}", response_class=Response, responses=_DOWNLOAD_DOC)
def download(
    request: Request,
    file_id: str,
    inline: Annotated[
        bool, Query(description="Show a raster image (PNG, JPEG, GIF, WebP) in place; other types stay attachments.")
    ] = False,
) -> Response:
    """A stored file's bytes, as a download (see the module's doc)."""
    return _serve(request, file_id, inline=inline)


# Signed links (orchestrator/core/file_links.py): outside /api, no token; the signature is the key.
link_router = APIRouter()


@link_router.get(
    "/files/{file_id}",
    response_class=Response,
    responses={
        **_DOWNLOAD_DOC,
        403: {
            "description": "the link's signature does not match, it has expired, or it says it is good for "
            "longer than ORCHESTRATOR_FILE_LINK_TTL_S"
        },
        404: {"description": "no such file in the link's chat"},
    },
)
def linked_download(
    request: Request,
    file_id: str,
    chat: Annotated[str, Query(min_length=1, max_length=1024, description="The chat whose file the link names.")],
    expires: Annotated[int, Query(ge=0, le=2**53, description="Unix seconds the link is good until.")],
    sig: Annotated[str, Query(max_length=128, description="The link's HMAC-SHA256, hex.")],
) -> Response:
    """A stored file's bytes through a signed link an outbound webhook carried (always an attachment)."""
    state = api_state(request)
    refusal = link_refusal(state.settings, chat, file_id, expires, sig, time.time())
    if refusal is not None:
        return JSONResponse({"detail": refusal}, 403)
    # The link's chat, not just its signature: only a file that chat stored is served.
    return _serve(request, file_id, inline=False, chat_jid=chat)


def _serve(request: Request, file_id: str, *, inline: bool, chat_jid: str | None = None) -> Response:
    state = api_state(request)
    files = FileStore.from_settings(state.db, state.settings)
    stored = files.get(file_id, chat_jid)
    fd = files.open_content(stored)
    return StreamingResponse(
        _read_fd(fd, stored.size),
        media_type=content_type(stored.mime),
        headers={
            "Content-Length": str(stored.size),
            "Content-Disposition": content_disposition(
                stored.name, inline=inline and stored.mime in INLINE_IMAGE_TYPES
            ),
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'none'; sandbox",
            "Cache-Control": "private",
        },
    )


def content_type(mime: str) -> str:
    """The ``Content-Type`` a stored file is served with."""
    return f"{TEXT}; charset=utf-8" if mime == TEXT else mime


# RFC 5987's attr-char: what stays as it is in an ext-value; every other byte is %XX.
_ATTR_CHARS = "!#$&+-.^_`|~"


def content_disposition(name: str, *, inline: bool = False) -> str:
    """``attachment`` (or ``inline``) with ``name`` as RFC 6266's ``filename*``, UTF-8 percent-encoded
    as RFC 5987 says (no quotes, semicolons or control characters reach the header)."""
    return f"{'inline' if inline else 'attachment'}; filename*=UTF-8''{quote(name.encode('utf-8'), safe=_ATTR_CHARS)}"


def _read_fd(fd: int, size: int) -> Iterator[bytes]:
    """``size`` bytes of ``fd``, a chunk at a time; ``fd`` closed at the end (or when the
    client goes away and the iterator is closed)."""
    try:
        left = size
        while left > 0:
            chunk = os.read(fd, min(left, CHUNK_BYTES))
            if not chunk:
                raise OSError(f"the file ended {left} bytes before its recorded size")
            left -= len(chunk)
            yield chunk
    finally:
        os.close(fd)
