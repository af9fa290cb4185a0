"""Telegram's files, both ways: a message's document or photo taken into the file store,
and a delivered message's files sent as photos or documents.

**In** (:class:`FileFetcher`, used by the poller in ``channels/telegram.py``).  A message
with a ``document`` or a ``photo`` keeps its caption as its words and its file: the file
is asked of the Bot API with ``getFile`` (its ``file_id``), then downloaded from
``<ORCHESTRATOR_TELEGRAM_API_BASE>/file/bot<token>/<file_path>``, the Bot API's download
URL, and streamed into the store (``store/files.py``) under the message's chat, named by
the document's ``file_name`` (made safe by the store) or ``photo.jpg``.  A photo comes in
several sizes: the largest one whose declared ``file_size`` is within
``ORCHESTRATOR_FILE_MAX_BYTES`` is taken.  The poller asks nothing of Telegram for a
chat that is no registered group, nor for a message already stored.  The rest is hostile
and checked:

* ``file_path`` is one or more names of letters, digits, ``_``, ``-`` and ``.``, joined by
  ``/``, none starting with a dot (:func:`checked_file_path`): ``..``, a leading ``/``, a
  scheme, ``%``, ``?``, ``#`` or a backslash is refused, so the download goes to the
  configured API's host and nowhere else (redirects are not followed either);
* a declared size (the message's or ``getFile``'s) over the limit is not fetched; bytes
  that run over it are not stored (the store stops them as they stream);
* a file still coming ``ORCHESTRATOR_TELEGRAM_FILE_TIMEOUT_S`` after its ``getFile`` was
  asked is stopped (checked as its bytes arrive; no wait for one is longer than the time
  that was left when the download began).

A file that is not taken leaves a line in the message's words saying which and why
(:func:`not_taken`); the message is stored all the same.  A media group (an album: several
photos or documents with one ``media_group_id``) arrives as one message per item, each
stored as a message with its own file (the caption is on one of them).

**Out** (:func:`upload`, used by the channel's ``send``).  Each file of a delivered
message's FILE envelope goes with ``sendPhoto`` when it is a raster image Telegram shows
as a photo (PNG, JPEG or WebP by its sniffed type, at most :data:`PHOTO_MAX_BYTES`) and
with ``sendDocument`` otherwise; a photo Telegram refuses (a ``400``: dimensions it does
not take) goes again as a document.  Both are multipart uploads streamed from the
store's checked descriptor, named with the stored (safe) name.  Only the message's own
chat's files are read.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal, Protocol, TypeVar

import httpx

from orchestrator.core.errors import ChannelError, FileTooLarge
from orchestrator.core.settings import Settings
from orchestrator.core.sizes import human_size
from orchestrator.store.file_rows import StoredFile
from orchestrator.store.files import FileStore

log = logging.getLogger(__name__)

PHOTO_NAME = "photo.jpg"  # Telegram keeps every photo as a JPEG
# What sendPhoto takes: raster images Telegram recompresses and shows inline, at most 10 MB.
PHOTO_TYPES = frozenset({"image/png", "image/jpeg", "image/webp"})
PHOTO_MAX_BYTES = 10 * 1000 * 1000
_NAME = r"[A-Za-z0-9_-][A-Za-z0-9_.-]*"
_FILE_PATH = re.compile(rf"{_NAME}(?:/{_NAME})*")
_FILE_PATH_MAX = 512
# An upload of up to ORCHESTRATOR_FILE_MAX_BYTES: longer than a text's send may take.
_UPLOAD_TIMEOUT_S = 120.0

UploadMethod = Literal["sendPhoto", "sendDocument"]
T = TypeVar("T")


class BotClient(Protocol):
    """What this module needs of ``channels/telegram.py``'s ``TelegramClient``: running a
    coroutine factory against the initialized ``telegram.Bot``, and a file's download URL."""

    def call(self, make: Callable[[Any], Coroutine[Any, Any, T]], timeout: float = ...) -> T: ...

    def file_url(self, file_path: str) -> str: ...


# -- in ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attachment:
    """The file a Telegram message carries: its id, the name to store it under, and the
    size the message declares (None: it declares none)."""

    file_id: str
    name: str
    size: int | None


def attachment_of(message: Any, max_bytes: int) -> Attachment | None:
    """The file of a Telegram message (a ``telegram.Message``): its document, or the
    largest size of its photo whose declared size is within ``max_bytes`` (the smallest
    size when none is: refused then for its size); None when it carries neither."""
    document = message.document
    if document is not None:
        return Attachment(document.file_id, document.file_name or "document", document.file_size)
    sizes = list(message.photo or ())
    if not sizes:
        return None
    within = [p for p in sizes if p.file_size is None or p.file_size <= max_bytes]
    if within:
        best = max(within, key=lambda p: (p.width * p.height, p.file_size or 0))
    else:
        best = min(sizes, key=lambda p: p.file_size or 0)
    return Attachment(best.file_id, PHOTO_NAME, best.file_size)


def checked_file_path(raw: object) -> str:
    """``raw`` (a ``getFile`` answer's ``file_path``) when it is a plain relative path the
    download URL may end with; raises :class:`ChannelError` otherwise (see the module's doc)."""
    if not isinstance(raw, str) or len(raw) > _FILE_PATH_MAX or not _FILE_PATH.fullmatch(raw):
        # Not quoted back: the words go into the chat, and a path is the server's to choose.
        raise ChannelError("Telegram's path for it is not a plain relative one")
    return raw


def not_taken(name: str, reason: str) -> str:
    """The line a message's words get for a file it carried that was not stored."""
    return f"📎 {name}: not taken ({reason})"


def too_large_reason(exc: FileTooLarge) -> str:
    """Why the store refused a file, in people's words (the limit and the setting)."""
    if exc.setting == "group_files_max_bytes":
        return f"this group's files have no room left under {human_size(exc.limit)}"
    return f"larger than {human_size(exc.limit)}"


class FileFetcher:
    """Downloads a Telegram message's file into the store (see the module's doc), asking
    ``getFile`` through ``client`` and downloading from its :meth:`file_url`."""

    def __init__(
        self, settings: Settings, store: FileStore, client: BotClient, *, http: httpx.Client | None = None
    ) -> None:
        self.store = store
        self.max_bytes = settings.files.max_bytes
        self.timeout_s = settings.telegram.file_timeout_s
        self.client = client
        self._own_http = http is None
        # Redirects are not followed: the bytes come from the configured API, never another host.
        self._http = http or httpx.Client(follow_redirects=False, timeout=httpx.Timeout(self.timeout_s))

    def fetch(self, chat_jid: str, attachment: Attachment) -> StoredFile:
        """The stored file of ``attachment``, in ``chat_jid``.  Raises :class:`FileTooLarge`
        (over a limit: nothing kept) or :class:`ChannelError` whose text says, in people's
        words and without the token, why the file was not fetched."""
        if attachment.size is not None and attachment.size > self.max_bytes:
            raise FileTooLarge("the file says it is larger", self.max_bytes, "file_max_bytes")
        deadline = time.monotonic() + self.timeout_s
        file_path, size = self._get_file(attachment.file_id)
        if size is not None and size > self.max_bytes:
            raise FileTooLarge("Telegram says the file is larger", self.max_bytes, "file_max_bytes")
        url = self.client.file_url(file_path)
        # No wait for a byte outlasts what is left of the time (the deadline is checked between reads).
        wait = httpx.Timeout(max(deadline - time.monotonic(), 0.001))
        try:
            # Bytes as they come, undecoded (no compressed stream is ever expanded here).
            with self._http.stream("GET", url, headers={"accept-encoding": "identity"}, timeout=wait) as resp:
                if resp.status_code != 200:
                    raise ChannelError(f"the download was answered {resp.status_code}")
                return self.store.store(chat_jid, self._chunks(resp, deadline), attachment.name)
        except httpx.TimeoutException:
            raise ChannelError(f"the download took longer than {self.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            # The exception's text may hold the URL, and the URL the token: its type only.
            raise ChannelError(f"the download failed ({type(exc).__name__})") from None

    def _get_file(self, file_id: str) -> tuple[str, int | None]:
        """``getFile``: the file's checked ``file_path`` and the size Telegram declares."""
        from telegram.error import TelegramError

        try:
            found = self.client.call(lambda bot: bot.get_file(file_id), timeout=self.timeout_s)
        except ChannelError as exc:
            raise ChannelError(f"getFile failed ({exc})") from None
        except (TelegramError, Exception) as exc:  # noqa: BLE001 - any failure: the file is not taken
            log.warning("telegram: getFile failed: %s: %s", type(exc).__name__, exc)
            raise ChannelError(f"getFile failed ({type(exc).__name__})") from None
        raw = found.file_path
        # The library joins a relative path to its download URL (leaving alone one it finds
        # on this machine's disk): the path Telegram answered is what follows the join.
        prefix = self.client.file_url("")
        if isinstance(raw, str) and raw.startswith(prefix):
            raw = raw[len(prefix) :]
        return checked_file_path(raw), found.file_size

    def _chunks(self, resp: httpx.Response, deadline: float) -> Iterator[bytes]:
        # iter_raw without a size: each read as it arrives, so the deadline is checked between
        # reads (with a size, httpx would wait to fill it).
        for chunk in resp.iter_raw():
            if time.monotonic() > deadline:
                raise ChannelError(f"the download took longer than {self.timeout_s:g} s")
            yield chunk

    def close(self) -> None:
        if self._own_http:
            self._http.close()


# -- out ---------------------------------------------------------------------------------


def upload_method(stored: StoredFile) -> UploadMethod:
    """How a stored file goes to Telegram: a photo when Telegram shows it as one."""
    if stored.mime in PHOTO_TYPES and stored.size <= PHOTO_MAX_BYTES:
        return "sendPhoto"
    return "sendDocument"


def _input_file(handle: BinaryIO, stored: StoredFile) -> Any:
    from telegram import InputFile

    # Streamed from the descriptor, not read whole; the part's type is the sniffed one,
    # not one guessed from the sender's name.
    upload = InputFile(handle, filename=stored.name, read_file_handle=False)
    upload.mimetype = stored.mime
    return upload


def upload(client: BotClient, store: FileStore, target: int | str, stored: StoredFile) -> int:
    """Send ``stored`` to the Telegram chat ``target`` (see the module's doc); returns the
    id of the message that carries it.  Raises what ``client.call`` raises for a failed send."""
    from telegram.error import BadRequest

    method = upload_method(stored)
    if method == "sendPhoto":
        try:
            return _send(client, store, target, stored, method)
        except BadRequest as exc:
            log.info("telegram: %s refused as a photo (%s); sending it as a document", stored.name, exc)
            method = "sendDocument"
    return _send(client, store, target, stored, method)


def _send(client: BotClient, store: FileStore, target: int | str, stored: StoredFile, method: UploadMethod) -> int:
    with os.fdopen(store.open_content(stored), "rb") as handle:

        def send(bot: Any) -> Any:
            if method == "sendPhoto":
                return bot.send_photo(
                    chat_id=target, photo=_input_file(handle, stored), write_timeout=_UPLOAD_TIMEOUT_S
                )
            return bot.send_document(
                chat_id=target, document=_input_file(handle, stored), write_timeout=_UPLOAD_TIMEOUT_S
            )

        sent = client.call(send, timeout=_UPLOAD_TIMEOUT_S + 30)
    return int(sent.message_id)
