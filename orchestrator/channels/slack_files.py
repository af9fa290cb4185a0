"""Files on Slack: the files a message shares, downloaded in, and the bytes of a reply's
files sent to the upload URL Slack hands out (the flow around it: ``orchestrator/channels/slack.py``).

**Slack's hosts** (:func:`slack_origins`).  A file is fetched from, and bytes are sent to,
Slack alone, as ``ORCHESTRATOR_SLACK_API_BASE`` names it: the origin (scheme, host and
port) of the API base itself, and, for an ``https`` base on a named host, the ``files.``
host beside it on the same port.  The default ``https://slack.com/api/`` allows
``https://slack.com`` and ``https://files.slack.com`` (where Slack serves ``url_private``
and hands out upload URLs); the tests' fake at ``http://127.0.0.1:<port>/api/`` allows
that origin alone.  Any other URL an event or an answer carries (another host or port,
``http`` where the host is ``https``, a ``user@host``, a space or a control character, a
scheme that is not http) is never requested, so the bot token never goes there.

**In** (:class:`FileShares`), for a message of a registered group (the caller checks that
before anything is asked for): each of its first :data:`MAX_FILES_PER_MESSAGE` files is
downloaded with the bot token (``Authorization: Bearer``) and streamed into the file store
under the message's chat, with Slack's name for it (made safe by the store).  A file is
not taken, and the message's text says why (:func:`not_taken`), when Slack's description
of it is not understood; it is deleted, hidden by the workspace's plan or kept outside
Slack; its URL is not Slack's; its declared size, or the answer's ``Content-Length``, is
over ``ORCHESTRATOR_FILE_MAX_BYTES`` (it is not asked for, or not read); the bytes
received pass that limit (a server that lies about the size: the store counts as it
writes and keeps nothing) or the group's; a redirect leads off Slack's hosts, or there
are more than :data:`MAX_REDIRECTS`; the answer is no 200 of the file (Slack's sign-in
page, which a token without ``files:read`` gets, is HTML); it comes compressed (the
request asks for ``identity``: bytes are counted as they are stored, never inflated
first); or the whole download takes longer than ``ORCHESTRATOR_SLACK_FILE_TIMEOUT_S``.

**Out** (:func:`send_upload`): the bytes POSTed raw to an ``upload_url`` of
``files.getUploadURLExternal``, only one on Slack's hosts, without the token (the URL is
signed), no redirect followed, within ``ORCHESTRATOR_SLACK_FILE_TIMEOUT_S``.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from agent_runner.protocol import MAX_FILES_PER_MESSAGE
from orchestrator.core.errors import ChannelError, ChannelRateLimited, FileTooLarge
from orchestrator.core.settings import Settings
from orchestrator.core.sizes import human_size
from orchestrator.store.db import Database
from orchestrator.store.file_names import safe_name
from orchestrator.store.file_rows import StoredFile
from orchestrator.store.files import FileStore

log = logging.getLogger(__name__)

Origin = tuple[str, str, int]  # (scheme, host, port)
DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_REDIRECTS = 3
# Slack's modes of a file whose bytes are not there to take.
_GONE_MODES = {
    "tombstone": "it was deleted",
    "hidden_by_limit": "the workspace's plan hides it",
    "external": "it is kept outside Slack",
}


# -- Slack's hosts --------------------------------------------------------------------------


def origin_of(url: str | httpx.URL) -> Origin | None:
    """The (scheme, host, port) of an absolute http(s) URL, or None for anything else: a
    relative or malformed URL, another scheme, a user name or password in it, a space, a
    backslash or a control character anywhere (parsers disagree on those)."""
    if isinstance(url, str):
        if _odd(url):
            return None
        try:
            url = httpx.URL(url)
        except (httpx.InvalidURL, TypeError, ValueError):
            return None
    if url.scheme not in DEFAULT_PORTS or not url.host or url.userinfo or not 0 < (url.port or 1) < 65536:
        return None
    return url.scheme, url.host.lower().rstrip("."), url.port or DEFAULT_PORTS[url.scheme]


def _odd(url: str) -> bool:
    """A space, a backslash or a control character: what URL parsers read differently."""
    return any(ch <= " " or ch in "\\\x7f" for ch in url)


def _named_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return "." in host
    return False


def slack_origins(api_base: str) -> frozenset[Origin]:
    """Where files may come from and go to (see the module's doc): the API base's origin,
    and its ``files.`` host when the base is ``https`` on a named host."""
    base = origin_of(api_base)
    if base is None:
        return frozenset()
    scheme, host, port = base
    found = {base}
    if scheme == "https" and _named_host(host):
        found.add((scheme, f"files.{host}", port))
    return frozenset(found)


def on_slack(url: str | httpx.URL, origins: frozenset[Origin]) -> bool:
    origin = origin_of(url)
    return origin is not None and origin in origins


# -- files in -------------------------------------------------------------------------------


class SlackFile(BaseModel):
    """A file object of a message event (what is read of it; strict: a number is a number)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    id: str = ""
    name: str | None = None
    title: str | None = None
    mimetype: str = ""
    size: int | None = None
    mode: str | None = None
    is_external: bool = False
    url_private_download: str | None = None
    url_private: str | None = None

    @property
    def shown_name(self) -> str:
        return safe_name(self.name or self.title or self.id or "file")

    @property
    def url(self) -> str | None:
        return self.url_private_download or self.url_private


def not_taken(name: str, why: str) -> str:
    """The line a message's text gets for a file it shared that was not taken (worded as
    the Telegram channel words its own)."""
    return f"📎 {name}: not taken ({why})"


@dataclass
class Intake:
    """What a message's files came to: the files stored, and a line for each one not taken."""

    stored: list[StoredFile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class FileShares:
    """Downloads the files of Slack messages into the file store (see the module's doc)."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self.store = FileStore.from_settings(db, settings)
        self.origins = slack_origins(settings.slack.api_base)
        self.token = settings.slack.bot_token
        self.timeout_s = settings.slack.file_timeout_s
        self.max_bytes = settings.files.max_bytes

    def take(self, chat_jid: str, files: Sequence[object]) -> Intake:
        """Store the files of a message of ``chat_jid`` (the event's ``files``, as sent);
        what is not taken is a note, never an exception."""
        intake = Intake()
        for raw in files[:MAX_FILES_PER_MESSAGE]:
            try:
                shared = SlackFile.model_validate(raw)
            except ValidationError:
                intake.notes.append(not_taken("file", "Slack's description of it is not understood"))
                continue
            try:
                intake.stored.append(self._take_one(chat_jid, shared))
            except ChannelError as exc:  # a file not taken, and why, in the words of the note
                intake.notes.append(not_taken(shared.shown_name, str(exc)))
            except FileTooLarge as exc:
                why = (
                    f"larger than {human_size(exc.limit)}"
                    if exc.setting == "file_max_bytes"
                    else f"this group's files have no room left under {human_size(exc.limit)}"
                )
                intake.notes.append(not_taken(shared.shown_name, why))
        if len(files) > MAX_FILES_PER_MESSAGE:
            more = len(files) - MAX_FILES_PER_MESSAGE
            intake.notes.append(not_taken(f"{more} more files", f"at most {MAX_FILES_PER_MESSAGE} a message"))
        return intake

    def _take_one(self, chat_jid: str, shared: SlackFile) -> StoredFile:
        if shared.mode in _GONE_MODES:
            raise ChannelError(_GONE_MODES[shared.mode])
        if shared.is_external:
            raise ChannelError(_GONE_MODES["external"])
        if shared.size is not None and shared.size > self.max_bytes:
            raise ChannelError(f"larger than {human_size(self.max_bytes)}")
        url = shared.url
        if not url or not on_slack(url, self.origins):
            raise ChannelError("its URL is not Slack's")
        if not self.token:
            raise ChannelError("there is no bot token (ORCHESTRATOR_SLACK_BOT_TOKEN) to download it with")
        deadline = time.monotonic() + self.timeout_s
        try:
            with httpx.Client(timeout=self.timeout_s, follow_redirects=False) as client:
                return self._download(client, chat_jid, shared, httpx.URL(url), deadline)
        except httpx.TimeoutException:
            raise ChannelError(f"the download took longer than {self.timeout_s:g} s") from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            log.info("slack: file %s of %s not downloaded (%s)", shared.id, chat_jid, type(exc).__name__)
            raise ChannelError(f"Slack could not be reached ({type(exc).__name__})") from None

    def _download(
        self, client: httpx.Client, chat_jid: str, shared: SlackFile, url: httpx.URL, deadline: float
    ) -> StoredFile:
        for _ in range(MAX_REDIRECTS + 1):
            if not on_slack(url, self.origins):
                raise ChannelError("it was redirected off Slack's hosts")
            request = client.build_request(
                "GET", url, headers={"Authorization": f"Bearer {self.token}", "Accept-Encoding": "identity"}
            )
            response = client.send(request, stream=True)
            try:
                if response.is_redirect:
                    location = response.headers.get("location", "")
                    if _odd(location):
                        raise ChannelError("it was redirected off Slack's hosts")
                    url = url.join(location)  # checked at the top of the loop, before it is asked
                    continue
                self._check(response, shared)
                return self.store.store(chat_jid, self._chunks(response, deadline), shared.shown_name)
            finally:
                response.close()
        raise ChannelError(f"it was redirected more than {MAX_REDIRECTS} times")

    def _check(self, response: httpx.Response, shared: SlackFile) -> None:
        if response.status_code != 200:
            raise ChannelError(f"Slack answered HTTP {response.status_code}")
        ctype = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype == "text/html" and shared.mimetype.lower() != "text/html":
            raise ChannelError("Slack answered with a page, not the file (has the app the files:read scope?)")
        if response.headers.get("content-encoding", "identity").strip().lower() != "identity":
            raise ChannelError("Slack sent it compressed")
        length = response.headers.get("content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_bytes:
            raise ChannelError(f"larger than {human_size(self.max_bytes)}")

    def _chunks(self, response: httpx.Response, deadline: float) -> Iterator[bytes]:
        for chunk in response.iter_raw():  # as the network gives them: the deadline is checked often
            if time.monotonic() > deadline:
                raise ChannelError(f"the download took longer than {self.timeout_s:g} s")
            yield chunk


# -- files out ------------------------------------------------------------------------------


def send_upload(
    upload_url: str,
    data: bytes,
    *,
    origins: frozenset[Origin],
    timeout_s: float,
) -> None:
    """POST ``data`` raw to ``upload_url`` (step two of Slack's external upload), or raise
    :class:`ChannelError` (:class:`ChannelRateLimited` on a 429): a URL off Slack's hosts
    is refused unasked."""
    if not on_slack(upload_url, origins):
        raise ChannelError("slack files.getUploadURLExternal: an upload_url that is not on Slack's hosts")
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=False) as client:
            response = client.post(upload_url, content=data, headers={"Content-Type": "application/octet-stream"})
    except httpx.HTTPError as exc:
        raise ChannelError(f"slack upload: {type(exc).__name__}") from None
    if response.status_code == 429:
        try:
            wait = max(1.0, float(response.headers.get("retry-after", "1")))
        except ValueError:
            wait = 1.0
        raise ChannelRateLimited(f"slack upload: rate limited (retry after {wait:g} s)", wait)
    if response.status_code != 200:
        raise ChannelError(f"slack upload: HTTP {response.status_code}")
