"""The words a refused ``Literal`` may be, found at the place msgspec's error names.

Both sides use it: the host to say which words an envelope's field takes, the runner
to say which a tool's argument takes.
"""

from __future__ import annotations

import re
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec

_LOC_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def literal_choices(root: Any, loc: str) -> tuple[Any, ...] | None:
    """The values, in their declared order, of the ``Literal`` at ``loc`` in ``root``.

    ``loc`` names a place as msgspec's errors do (``$.payload.edits[0].status``), so both
    sides can say which words a refused one may be (envelopes on the host, tool arguments
    in the runner).  None when no Literal is there.
    """
    return _literal_at(root, _LOC_STEP.findall(loc))


def _literal_at(hint: Any, steps: list[tuple[str, str]]) -> tuple[Any, ...] | None:
    origin = get_origin(hint)
    if origin is Annotated:
        return _literal_at(get_args(hint)[0], steps)
    if origin in (Union, UnionType):  # ``X | None``: the member that has the place
        return next((found for arg in get_args(hint) if (found := _literal_at(arg, steps)) is not None), None)
    if not steps:
        return get_args(hint) if origin is Literal else None
    (name, index), rest = steps[0], steps[1:]
    if name and isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        named = next((f for f in msgspec.structs.fields(hint) if f.encode_name == name), None)
        return None if named is None else _literal_at(named.type, rest)
    if index and origin is list:
        return _literal_at(get_args(hint)[0], rest)
    return None
