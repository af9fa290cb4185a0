"""The rules between settings that no one field's bounds can say (``Settings.__post_init__``
runs them for settings made in code and loaded alike): each broken one is a
:class:`SettingsError` naming the variables and what would be right."""

from __future__ import annotations

from typing import Protocol

from orchestrator.core.errors import SettingsError
from orchestrator.core.settings_env import ENV_PREFIX


class Checked(Protocol):
    """What the rules read (``Settings`` has it; a Protocol, so this module below the
    settings imports nothing of them)."""

    thinking_budget: int
    max_tokens: int
    flower_basic_auth: str
    webhook_secret: str
    webhook_inbound_secret: str
    file_link_key: str
    otel_traces_exporter: str

    @property
    def trace_exporters(self) -> list[str]: ...


def check_settings(settings: Checked) -> None:
    if settings.thinking_budget and not 1024 <= settings.thinking_budget < settings.max_tokens:
        # The API's own bounds: refused here rather than by every request of every run.
        raise SettingsError(
            f"{ENV_PREFIX}THINKING_BUDGET={settings.thinking_budget}: at least 1024 and below "
            f"{ENV_PREFIX}MAX_TOKENS ({settings.max_tokens}), which bounds thinking and answer together; "
            "0 turns thinking off"
        )
    user, colon, password = settings.flower_basic_auth.partition(":")
    if settings.flower_basic_auth and not (user and colon and password and "," not in settings.flower_basic_auth):
        raise SettingsError(f"{ENV_PREFIX}FLOWER_BASIC_AUTH must be user:password (one pair, both non-empty)")
    if settings.webhook_inbound_secret and settings.webhook_inbound_secret == settings.webhook_secret:
        # Every receiver of our deliveries holds the outbound secret: shared, it lets any of them post as anyone.
        raise SettingsError(
            f"{ENV_PREFIX}WEBHOOK_INBOUND_SECRET must differ from {ENV_PREFIX}WEBHOOK_SECRET "
            "(every receiver of the outbound webhooks holds that one)"
        )
    if settings.file_link_key and (
        len(settings.file_link_key) < 16
        or settings.file_link_key in (settings.webhook_secret, settings.webhook_inbound_secret)
    ):
        # A webhook secret is held by others (its receivers, its senders): they could sign links.
        raise SettingsError(
            f"{ENV_PREFIX}FILE_LINK_KEY must be at least 16 characters and differ from the webhook secrets "
            "(e.g. `openssl rand -hex 32`), or be left empty to use the one made under the data dir"
        )
    unknown = set(settings.trace_exporters) - {"console", "otlp"}
    if unknown:
        raise SettingsError(
            f"OTEL_TRACES_EXPORTER={settings.otel_traces_exporter!r}: "
            f"use none, console, otlp or console,otlp (not {', '.join(sorted(unknown))})"
        )
