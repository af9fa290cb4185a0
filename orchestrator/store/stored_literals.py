"""Closed sets of words kept in text columns (states, kinds), checked once as a row is read.

A column such as ``deliveries.state`` holds one of a few words, declared beside its
data as a ``Literal`` alias (``DeliveryState``).  The database does not hold the column
to them (no CHECK constraint: a word added later needs no migration), so the store
checks each value where a row becomes a typed object: a word the code does not know
(a row written by a newer version of the code, or by hand) is a :class:`StoreError`
naming the column and the word, never passed on as if it were one of them.

Two forms of the one check: :func:`checked` for a value read on its own, and
:func:`column_check` for a field of a pydantic model that a row is validated into
(``Annotated[DeliveryState, column_check(DELIVERY_STATES, "deliveries.state")]``);
pydantic lets the ``StoreError`` through as it is (it wraps only ``ValueError`` and
``AssertionError``).
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BeforeValidator

from orchestrator.core.errors import StoreError

Word = TypeVar("Word", bound=str)


def checked(allowed: tuple[Word, ...], value: object, column: str) -> Word:
    """``value`` as the word of ``allowed`` it is; :class:`StoreError` naming ``column`` and
    the value when it is none of them."""
    for word in allowed:
        if value == word:
            return word
    raise StoreError(
        f"{column} holds {value!r}, which is not one of {', '.join(allowed)}: "
        "a row this version of the code cannot read (written by a newer version, or by hand)"
    )


def column_check(allowed: tuple[str, ...], column: str) -> BeforeValidator:
    """The pydantic validator that runs :func:`checked` on a model field read from ``column``."""
    return BeforeValidator(lambda value: checked(allowed, value, column))
