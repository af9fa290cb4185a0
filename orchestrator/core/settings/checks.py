"""The rules between sections of the settings (``Settings.__post_init__`` runs them for
settings made in code and loaded alike); a rule inside one section is that section's
``__post_init__``.  Each broken one is a :class:`SettingsError` naming the variables and
what would be right."""

from __future__ import annotations

from typing import Protocol

from orchestrator.core.errors import SettingsError
from orchestrator.core.settings.env import ENV_PREFIX


class _Files(Protocol):
    link_key: str


class _Webhook(Protocol):
    secret: str
    inbound_secret: str


class Checked(Protocol):
    """What the rules read (``Settings`` has it; a Protocol, so this module below the
    settings imports nothing of them)."""

    @property
    def files(self) -> _Files: ...

    @property
    def webhook(self) -> _Webhook: ...


def check_settings(settings: Checked) -> None:
    key = settings.files.link_key
    if key and (len(key) < 16 or key in (settings.webhook.secret, settings.webhook.inbound_secret)):
        # A webhook secret is held by others (its receivers, its senders): they could sign links.
        raise SettingsError(
            f"{ENV_PREFIX}FILE_LINK_KEY must be at least 16 characters and differ from the webhook secrets "
            "(e.g. `openssl rand -hex 32`), or be left empty to use the one made under the data dir"
        )
