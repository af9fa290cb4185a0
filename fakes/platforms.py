"""The fake Slack and Telegram together (:func:`fake_platforms`), and settings that point
the channels at them (:func:`pointed_at`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fakes.slack_api import FakeSlack
from fakes.telegram_api import FakeTelegramAPI
from orchestrator.core.settings import Settings

Platforms = tuple[FakeSlack, FakeTelegramAPI]


@contextmanager
def fake_platforms() -> Iterator[Platforms]:
    with FakeSlack() as slack, FakeTelegramAPI() as telegram:
        yield slack, telegram


def pointed_at(settings: Settings, platforms: Platforms, **more: Any) -> Settings:
    """``settings`` with the Slack and Telegram channels on the fakes' tokens and APIs (and ``more``)."""
    slack, telegram = platforms
    return settings.replace(
        **{
            "slack_bot_token": slack.bot_token,
            "slack_api_base": slack.base,
            "telegram_bot_token": telegram.token,
            "telegram_api_base": telegram.base,
            **more,
        }
    )
