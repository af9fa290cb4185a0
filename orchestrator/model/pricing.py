"""What a run's tokens cost, roughly: list prices per model family.

An estimate, never a bill.  The prices are the providers' published list
prices in US dollars per million tokens (checked :data:`PRICES_CHECKED`),
without batch, regional, priority or long-context rates.  Anthropic's
prompt-cache writes are priced at 1.25 times the input price and reads at a
tenth (its 5-minute cache); OpenAI's cached input is priced as input (the
gateway does not count it apart).  Thinking tokens are output tokens.

A model id matches a family when it is the family's id, optionally followed
by a release date or ``-latest`` (``claude-sonnet-4-5-20250929``,
``gpt-4o-2024-08-06``).  Anything else (a local model behind an
OpenAI-compatible server, a family newer than this table) has no estimate:
``None``, never a guess from a similar name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent_runner.protocol import Usage

PRICES_CHECKED = "2025-11"


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens."""

    input: float
    output: float
    cache_write: float
    cache_read: float


def _anthropic(input_: float, output: float) -> Price:
    return Price(input_, output, cache_write=input_ * 1.25, cache_read=input_ * 0.1)


def _openai(input_: float, output: float) -> Price:
    return Price(input_, output, cache_write=input_, cache_read=input_)


# (provider, family) -> price.  Families differ in more than their date, so each is listed.
PRICES: dict[tuple[str, str], Price] = {
    ("anthropic", "claude-opus-4-5"): _anthropic(5, 25),
    ("anthropic", "claude-opus-4-1"): _anthropic(15, 75),
    ("anthropic", "claude-opus-4"): _anthropic(15, 75),
    ("anthropic", "claude-sonnet-4-5"): _anthropic(3, 15),
    ("anthropic", "claude-sonnet-4"): _anthropic(3, 15),
    ("anthropic", "claude-3-7-sonnet"): _anthropic(3, 15),
    ("anthropic", "claude-3-5-sonnet"): _anthropic(3, 15),
    ("anthropic", "claude-haiku-4-5"): _anthropic(1, 5),
    ("anthropic", "claude-3-5-haiku"): _anthropic(0.8, 4),
    ("anthropic", "claude-3-haiku"): _anthropic(0.25, 1.25),
    ("openai", "gpt-5"): _openai(1.25, 10),
    ("openai", "gpt-5-mini"): _openai(0.25, 2),
    ("openai", "gpt-5-nano"): _openai(0.05, 0.4),
    ("openai", "gpt-4.1"): _openai(2, 8),
    ("openai", "gpt-4.1-mini"): _openai(0.4, 1.6),
    ("openai", "gpt-4.1-nano"): _openai(0.1, 0.4),
    ("openai", "gpt-4o"): _openai(2.5, 10),
    ("openai", "gpt-4o-mini"): _openai(0.15, 0.6),
}
# What may follow a family's id in a model id: a release date or "-latest".
_RELEASE = re.compile(r"(?:-\d{8}|-\d{4}-\d{2}-\d{2}|-latest)?")


def price_of(provider: str, model: str) -> Price | None:
    """The list price of ``model`` (None: not in the table)."""
    for (named, family), price in PRICES.items():
        if named == provider and model.startswith(family) and _RELEASE.fullmatch(model[len(family) :]):
            return price
    return None


def estimate_cost(provider: str, model: str, usage: Usage) -> float | None:
    """What ``usage`` of ``model`` costs at list price, in US dollars (None: no price known)."""
    price = price_of(provider, model)
    if price is None:
        return None
    cached = usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    fresh = max(0, usage.input_tokens - cached)
    dollars = (
        fresh * price.input
        + usage.cache_creation_input_tokens * price.cache_write
        + usage.cache_read_input_tokens * price.cache_read
        + usage.output_tokens * price.output
    ) / 1e6
    return round(dollars, 6)
