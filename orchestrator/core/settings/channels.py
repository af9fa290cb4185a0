"""The channels: deliveries, webhooks, Telegram and Slack."""

from __future__ import annotations

from typing import Annotated, ClassVar

from msgspec import Meta

from orchestrator.core.errors import SettingsError
from orchestrator.core.settings.env import ENV_PREFIX
from orchestrator.core.settings.section import Section


class DeliverySettings(Section, kw_only=True):
    """Deliveries of stored messages to channels (orchestrator/store/deliveries.py): a failed send is retried after base·2ⁿ⁻¹ seconds (capped, with jitter) up to max_attempts; a send that outlives claim_s is presumed cut off."""

    prefix: ClassVar[str] = "delivery_"

    # Deliveries of stored messages to channels (orchestrator/store/deliveries.py):
    # a failed send is retried after base·2ⁿ⁻¹ seconds (capped, with jitter)
    # up to max_attempts; a send that outlives claim_s is presumed cut off
    # and is never retried (never sent twice).
    max_attempts: Annotated[int, Meta(ge=1, description="attempts of a failed delivery")] = 6
    retry_base_s: Annotated[
        float, Meta(ge=0, description="the first retry's delay of a failed delivery (doubling, with jitter)")
    ] = 1.0
    retry_max_s: Annotated[float, Meta(ge=0, description="the longest retry delay of a failed delivery")] = 300.0
    claim_s: Annotated[float, Meta(gt=0, description="seconds a send may take before it is presumed cut off")] = 120.0


class WebhookSettings(Section, kw_only=True):
    """Webhooks both ways (orchestrator/channels/webhook.py)."""

    prefix: ClassVar[str] = "webhook_"

    # Secret the outbound webhooks are signed with (HMAC-SHA256): every receiver
    # holds it, so it signs nothing we accept.
    secret: Annotated[str, Meta(description="the secret outbound webhooks are signed with")] = ""
    # Secret inbound webhooks (POST /webhooks/inbound) must be signed with, over
    # timestamp, nonce and body (orchestrator/channels/webhook.py); empty: inbound
    # webhooks are off.  Its own, not the outbound one: a receiver of our
    # deliveries holding that one could otherwise post as anyone.  Must differ from it.
    inbound_secret: Annotated[
        str, Meta(description="the secret inbound webhooks must be signed with; empty: inbound webhooks off")
    ] = ""
    # How far an inbound webhook's X-Orchestrator-Timestamp may be from this host's
    # clock, either way; older ones are refused as replays (a replay inside the
    # window is the duplicate of what it replays: its nonce is the message's id).
    inbound_window_s: Annotated[
        float, Meta(gt=0, description="how far an inbound webhook's timestamp may be from this host's clock")
    ] = 300.0
    timeout_s: Annotated[float, Meta(gt=0, description="seconds one outbound webhook post may take")] = 10.0

    def __post_init__(self) -> None:
        if self.inbound_secret and self.inbound_secret == self.secret:
            # Every receiver of our deliveries holds the outbound secret: shared, it lets any of them post as anyone.
            raise SettingsError(
                f"{ENV_PREFIX}WEBHOOK_INBOUND_SECRET must differ from {ENV_PREFIX}WEBHOOK_SECRET "
                "(every receiver of the outbound webhooks holds that one)"
            )


class TelegramSettings(Section, kw_only=True):
    """Telegram (orchestrator/channels/telegram.py, the optional "telegram" extra)."""

    prefix: ClassVar[str] = "telegram_"

    # Telegram (orchestrator/channels/telegram.py, the optional "telegram" extra):
    # the bot's token from @BotFather, and the Bot API's root (tests point
    # it at a fake).
    bot_token: Annotated[str, Meta(description="the Telegram bot's token from @BotFather")] = ""
    api_base: Annotated[str, Meta(description="the Bot API's root")] = "https://api.telegram.org"
    # How long a file sent to the bot may take to come in (getFile, then the download,
    # orchestrator/channels/telegram_files.py): one still coming past it is stopped and
    # its message says so, so one slow file cannot hold the poller.
    file_timeout_s: Annotated[float, Meta(gt=0, description="seconds a file sent to the bot may take to come in")] = (
        60.0
    )


class SlackSettings(Section, kw_only=True):
    """Slack (orchestrator/channels/slack.py, the optional "slack" extra)."""

    prefix: ClassVar[str] = "slack_"

    # Slack (orchestrator/channels/slack.py, the optional "slack" extra): the bot
    # token (xoxb-, chat.postMessage and the rest of the Web API), the signing
    # secret POST /slack/events checks (empty: that route answers 404), the
    # app-level token Socket Mode connects with (xapp-, connections:write), the
    # Web API's root (tests point it at a fake; it ends with a slash, as
    # slack_sdk joins method names to it), and how often a run's "working..."
    # message is brought up to date (chat.update is rate limited per channel).
    bot_token: Annotated[str, Meta(description="the Slack bot token (xoxb-)")] = ""
    signing_secret: Annotated[
        str, Meta(description="the secret POST /slack/events checks; empty: that route answers 404")
    ] = ""
    app_token: Annotated[str, Meta(description="the app-level token Socket Mode connects with (xapp-)")] = ""
    api_base: Annotated[str, Meta(description="the Slack Web API's root")] = "https://slack.com/api/"
    progress_interval_s: Annotated[
        float, Meta(gt=0, description='seconds between updates of a run\'s "working..." message on Slack')
    ] = 2.0
    # The longest one file's transfer to or from Slack may take, all of it (a file share
    # downloaded, a reply's file uploaded: orchestrator/channels/slack_files.py); a server
    # that sends a byte now and then is cut off here, not when it pleases.
    file_timeout_s: Annotated[
        float, Meta(gt=0, description="seconds one file's transfer to or from Slack may take")
    ] = 60.0

    def __post_init__(self) -> None:
        self.api_base = self.api_base.strip().rstrip("/") + "/"
