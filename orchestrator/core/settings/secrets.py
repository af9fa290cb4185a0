"""Which settings are secrets, and the settings as they may be shown: every secret
masked in ``repr()``, every secret value listed for the log filter (``Settings.secrets``,
``orchestrator/core/secrets.py``).  A new secret setting goes into :data:`SECRET_FIELDS`
(tests/host/test_secrets.py hunts for ones that did not)."""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import unquote, urlsplit, urlunsplit

# By flat name (the variable's, lower case, without ORCHESTRATOR_).
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
URL_FIELDS = ("database_url", "broker_url")


def masked(flat: str, value: object) -> object:
    """``value`` of the setting ``flat`` as it may be shown: a secret masked, a URL's password
    left out."""
    if flat in SECRET_FIELDS and value:
        return "********"
    if flat in URL_FIELDS and isinstance(value, str):
        return _without_password(value)
    return value


def secret_values(value_of: Callable[[str], object]) -> list[str]:
    """The secret values set, ``value_of`` giving a setting's value by its flat name (see
    ``Settings.secrets``)."""
    values = [str(value_of(name)) for name in SECRET_FIELDS]
    # Each brokered credential's value (the rest of that setting is no secret).
    values += credential_values(str(value_of("egress_credentials")))
    for name in URL_FIELDS:
        password = urlsplit(str(value_of(name))).password
        if password:
            # Only where a URL carries it (":<password>@"), as written and as the server
            # takes it: a password is often an ordinary word (compose's is "orchestrator"),
            # and hiding the bare word would cut it out of every line and message.
            values += [f":{password}@", f":{unquote(password)}@"]
    return [v for v in dict.fromkeys(values) if v]


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


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = netloc[0].partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:********@{netloc[2]}"))
