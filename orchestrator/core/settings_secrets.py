"""Which settings are secrets, and the settings as they may be shown: every secret
masked in ``repr()``, every secret value listed for the log filter (``Settings.secrets``,
``orchestrator/core/secrets.py``).  A new secret setting goes into :data:`SECRET_FIELDS`
(tests/host/test_secrets.py hunts for ones that did not)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import msgspec


def credential_values(text: str) -> list[str]:
    """The secret values of ORCHESTRATOR_EGRESS_CREDENTIALS (for masking), even where the rest
    of it does not validate (orchestrator/sandbox/egress_credentials.py reads it whole); the
    whole text when it is no JSON at all."""
    try:
        data = json.loads(text) if text.strip() else []
    except json.JSONDecodeError:
        return [text] if text.strip() else []
    if not isinstance(data, list):
        return []
    return [str(item["value"]) for item in data if isinstance(item, dict) and item.get("value")]


SECRET_FIELDS = (
    "api_token",
    "flower_basic_auth",
    "webhook_secret",
    "webhook_inbound_secret",
    "file_link_key",
    "anthropic_api_key",
    "openai_api_key",
    "telegram_bot_token",
    "slack_bot_token",
    "slack_signing_secret",
    "slack_app_token",
)
# URLs that may carry a password (postgresql://user:password@host/db, redis://:password@host).
_URL_FIELDS = ("database_url", "broker_url")


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = netloc[0].partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:********@{netloc[2]}"))


def masked_fields(settings: msgspec.Struct) -> Iterator[tuple[str, Any]]:
    """Each field's name and value in order, a secret's value masked and a URL's password
    left out."""
    for field in msgspec.structs.fields(settings):
        value = getattr(settings, field.name)
        if field.name in SECRET_FIELDS and value:
            value = "********"
        elif field.name in _URL_FIELDS and isinstance(value, str):
            value = _without_password(value)
        yield field.name, value


def secret_values(settings: Any) -> list[str]:
    """The secret values ``settings`` has set (see ``Settings.secrets``)."""
    values = [str(getattr(settings, name)) for name in SECRET_FIELDS]
    # Each brokered credential's value (the rest of that setting is no secret).
    values += credential_values(settings.egress_credentials)
    for name in _URL_FIELDS:
        password = urlsplit(str(getattr(settings, name))).password
        if password:
            # Only where a URL carries it (":<password>@"), as written and as the server
            # takes it: a password is often an ordinary word (compose's is "orchestrator"),
            # and hiding the bare word would cut it out of every line and message.
            values += [f":{password}@", f":{unquote(password)}@"]
    return [v for v in dict.fromkeys(values) if v]
