"""The reactions the agent may put on a person's message, as every channel names them.

A react event (``ReactEvent``) names one of :data:`REACTIONS` by its emoji; the host asks
each channel for it by the channel's own name (Slack's short name, Telegram's emoji).
"""

from __future__ import annotations

from typing import Final, NamedTuple


class Reaction(NamedTuple):
    """A reaction every channel can be asked for: its emoji, Slack's name for it, and the
    emoji Telegram's bots may set (None: not in Telegram's allowed set)."""

    emoji: str
    slack: str
    telegram: str | None


# The reactions the agent may use (docs/messages.md shows this table; a test keeps them
# the same).  Telegram lets bots set only a fixed set of emoji, without the variation
# selector (``❤``, not ``❤️``); Slack names each by its short name.
REACTIONS: Final[tuple[Reaction, ...]] = (
    Reaction("👍", "+1", "👍"),
    Reaction("👎", "-1", "👎"),
    Reaction("❤️", "heart", "❤"),
    Reaction("🔥", "fire", "🔥"),
    Reaction("🎉", "tada", "🎉"),
    Reaction("👏", "clap", "👏"),
    Reaction("😁", "grin", "😁"),
    Reaction("🤔", "thinking_face", "🤔"),
    Reaction("😢", "cry", "😢"),
    Reaction("🙏", "pray", "🙏"),
    Reaction("👌", "ok_hand", "👌"),
    Reaction("💯", "100", "💯"),
    Reaction("🤣", "rolling_on_the_floor_laughing", "🤣"),
    Reaction("⚡", "zap", "⚡"),
    Reaction("🏆", "trophy", "🏆"),
    Reaction("👀", "eyes", "👀"),
    Reaction("🤝", "handshake", "🤝"),
    Reaction("✍️", "writing_hand", "✍"),
    Reaction("😎", "sunglasses", "😎"),
    Reaction("🤯", "exploding_head", "🤯"),
    Reaction("😍", "heart_eyes", "😍"),
    Reaction("🫡", "saluting_face", "🫡"),
    Reaction("✅", "white_check_mark", None),
    Reaction("❌", "x", None),
    Reaction("⏳", "hourglass_flowing_sand", None),
    Reaction("🚀", "rocket", None),
    Reaction("⚠️", "warning", None),
    Reaction("🐛", "bug", None),
)
_BY_EMOJI: Final = {r.emoji.replace("\ufe0f", ""): r for r in REACTIONS}


def reaction_of(emoji: str) -> Reaction | None:
    """The reaction ``emoji`` names (with or without its variation selector), or None."""
    return _BY_EMOJI.get(emoji.strip().replace("\ufe0f", ""))
