"""Signed, expiring links to one stored file of one chat, for receivers that hold no API token.

An outbound webhook's payload names a FILE message's files; a receiver fetches each with
``GET <ORCHESTRATOR_PUBLIC_BASE_URL>/files/<id>?chat=<jid>&expires=<unix time>&sig=<hex>``.
The signature is an HMAC-SHA256 over the chat, the id and the time with the installation's
link key, so a link names exactly one file of one chat until one moment: another id,
another chat, a later time or a changed signature is refused, and the route serves the
file only if it is that chat's (``orchestrator/http/routes/files.py``).

**The key is the links' own**, never the webhook secret (every receiver of our deliveries
holds that one, and could mint links of its own with it): ``ORCHESTRATOR_FILE_LINK_KEY``
when set (for hosts that do not share the data dir), else 32 random bytes made once per
installation and kept in ``<data_dir>/file-link.key`` (0600, made with ``O_EXCL``: two
processes starting at once agree on the first one written).

**A link's life is bounded on use**: one whose ``expires`` is further from now than
``ORCHESTRATOR_FILE_LINK_TTL_S`` (and :data:`CLOCK_SKEW_S` for hosts' clocks) is refused
whatever its signature, so no key holder can make a link that never expires.
Without a public base URL there are no links (files are named by id) and the route refuses.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import threading
from pathlib import Path
from urllib.parse import quote

import msgspec

from orchestrator.core.errors import ConfigError
from orchestrator.core.private_dirs import private_dir
from orchestrator.core.settings import Settings

KEY_FILE = "file-link.key"
# How far ahead of the TTL a link's time may be: the minting host's clock may run ahead.
CLOCK_SKEW_S = 300.0
_KEY_BYTES = 32
# Domain separation: a link's signature is never a valid signature of anything else.
_PURPOSE = "orchestrator file link v2"
_cache: dict[Path, bytes] = {}
_cache_lock = threading.Lock()


def link_key(settings: Settings) -> bytes:
    """The key links are signed with: ORCHESTRATOR_FILE_LINK_KEY's, else the installation's
    generated one (made on first use)."""
    if settings.files.link_key:
        return hashlib.sha256(f"{_PURPOSE}\n{settings.files.link_key}".encode()).digest()
    path = settings.data_dir / KEY_FILE
    with _cache_lock:
        key = _cache.get(path)
        if key is None:
            key = _cache[path] = _read_or_make(path)
        return key


def _read_or_make(path: Path) -> bytes:
    private_dir(path.parent)
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    # Written whole under a temporary name, then linked into place: a reader never sees part
    # of a key, and of two processes making one at once the first link wins for both.
    tmp = path.with_name(f".{KEY_FILE}.{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(_KEY_BYTES) + "\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)
    return _read(path)


def _read(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ConfigError(
            f"{path}: the file link key cannot be read ({exc.strerror}); remove it to make a new one"
        ) from None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        text = f.read(4 * _KEY_BYTES).strip()
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ConfigError(
            f"{path}: the file link key must be a file of this user's that no one else may read (mode 0600)"
        )
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != _KEY_BYTES:
        raise ConfigError(f"{path}: not a file link key ({_KEY_BYTES} bytes in hex); remove it to make a new one")
    return key


def signature(key: bytes, chat_jid: str, file_id: str, expires: int) -> str:
    """The link signature for ``chat_jid``'s file ``file_id`` until ``expires`` (unix seconds)."""
    # A JSON array: no separator a chat's jid or a file id could contain makes two links one.
    signed = msgspec.json.encode([_PURPOSE, chat_jid, file_id, expires])
    return hmac.new(key, signed, hashlib.sha256).hexdigest()


def file_link(settings: Settings, chat_jid: str, file_id: str, now: float) -> str | None:
    """The signed link to ``chat_jid``'s file ``file_id``, valid ``ORCHESTRATOR_FILE_LINK_TTL_S``
    from ``now``, or None when links are off (no public base URL)."""
    base = settings.files.public_base_url.rstrip("/")
    if not base:
        return None
    expires = int(now + settings.files.link_ttl_s)
    sig = signature(link_key(settings), chat_jid, file_id, expires)
    return f"{base}/files/{quote(file_id, safe='')}?chat={quote(chat_jid, safe='')}&expires={expires}&sig={sig}"


def link_refusal(settings: Settings, chat_jid: str, file_id: str, expires: int, sig: str, now: float) -> str | None:
    """Why a link's ``chat``, ``expires`` and ``sig`` do not let it fetch ``file_id`` now (None:
    they do; the route still serves only a file of ``chat_jid``)."""
    if not settings.files.public_base_url:
        return "file links are off (no ORCHESTRATOR_PUBLIC_BASE_URL)"
    want = signature(link_key(settings), chat_jid, file_id, expires)
    if not hmac.compare_digest(sig.encode("ascii", "replace"), want.encode()):
        return "the link's signature does not match"
    if now > expires:
        return "the link has expired"
    if expires - now > settings.files.link_ttl_s + CLOCK_SKEW_S:
        return "the link is good for longer than this installation gives links (ORCHESTRATOR_FILE_LINK_TTL_S)"
    return None
