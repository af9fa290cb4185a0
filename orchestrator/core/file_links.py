"""Signed, expiring links to one stored file, for receivers that hold no API token.

An outbound webhook's payload names a FILE message's files; a receiver fetches each with
``GET <ORCHESTRATOR_PUBLIC_BASE_URL>/files/<id>?expires=<unix time>&sig=<hex>``.  The
signature is an HMAC-SHA256 over ``<id>.<expires>`` with a key derived from
``ORCHESTRATOR_WEBHOOK_SECRET`` (the secret the receiver already shares with us), so a
link names exactly one file until one moment: another id, a later time or a changed
signature is refused, and a link stops working after ``ORCHESTRATOR_FILE_LINK_TTL_S``.
Without a public base URL or a webhook secret there are no links (files are named by id).
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import quote

from orchestrator.core.settings import Settings

# A key of its own for links, derived from the webhook secret: a link's signature is never
# a valid signature of a webhook body, nor the other way round.
_PURPOSE = b"orchestrator file link v1"


def _key(secret: str) -> bytes:
    return hmac.new(secret.encode("utf-8"), _PURPOSE, hashlib.sha256).digest()


def signature(secret: str, file_id: str, expires: int) -> str:
    """The link signature for ``file_id`` until ``expires`` (unix seconds)."""
    return hmac.new(_key(secret), f"{file_id}.{expires}".encode(), hashlib.sha256).hexdigest()


def file_link(settings: Settings, file_id: str, now: float) -> str | None:
    """The signed link to ``file_id`` valid ``ORCHESTRATOR_FILE_LINK_TTL_S`` from ``now``, or
    None when links are off (no public base URL or no webhook secret)."""
    base, secret = settings.public_base_url.rstrip("/"), settings.webhook_secret
    if not base or not secret:
        return None
    expires = int(now + settings.file_link_ttl_s)
    return f"{base}/files/{quote(file_id, safe='')}?expires={expires}&sig={signature(secret, file_id, expires)}"


def link_refusal(settings: Settings, file_id: str, expires: int, sig: str, now: float) -> str | None:
    """Why a link's ``expires`` and ``sig`` do not let it fetch ``file_id`` now (None: they do)."""
    if not settings.webhook_secret:
        return "file links are off"
    if not hmac.compare_digest(
        sig.encode("ascii", "replace"), signature(settings.webhook_secret, file_id, expires).encode()
    ):
        return "the link's signature does not match"
    if now > expires:
        return "the link has expired"
    return None
