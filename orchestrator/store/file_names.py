"""A sender's file name made safe to create in a folder and to show, and numbered when taken.

The sender's name is a hint, never a path (:func:`safe_name`): directories, control and
format characters and leading dots go, it is cut to :data:`MAX_NAME_BYTES` of UTF-8 keeping
its extension, and it is never empty.  :func:`numbered_names` gives the names to try when
one must not replace a file already there; :func:`unique_name` picks one for a listing.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Iterator

from orchestrator.core.errors import StoreError

MAX_NAME_BYTES = 120
DEFAULT_NAME = "file"
# An extension longer than this is no extension (it is cut with the rest of the name).
_MAX_EXT_BYTES = 16
# Unicode categories that never stay in a name: controls (NUL, newlines, escapes), format
# characters (bidi overrides that show "exe.txt" as "txt.exe", zero-width ones), surrogates
# (a name decoded with surrogateescape), private use and unassigned.
_DROPPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})


def _cut(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` of UTF-8, never inside a character."""
    return text.encode("utf-8")[:max_bytes].decode("utf-8", "ignore")


def _split_ext(name: str) -> tuple[str, str]:
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem or not ext or len(ext.encode("utf-8")) > _MAX_EXT_BYTES:
        return name, ""
    return stem, "." + ext


def _fit(stem: str, tail: str) -> str:
    """``stem`` cut so that ``stem + tail`` fits :data:`MAX_NAME_BYTES`."""
    room = MAX_NAME_BYTES - len(tail.encode("utf-8"))
    return _cut(stem, max(room, 0)).rstrip(" .") + tail


def safe_name(raw: str) -> str:
    """A sender's file name made safe to create in a folder, and to show.

    The last component of either kind of path (``/`` and ``\\``): ``../../etc/passwd`` is
    ``passwd``; no control, format, surrogate or unassigned character (NUL, newlines, bidi
    overrides); NFC; no leading dots or spaces (``.bashrc`` is ``bashrc``, ``..`` is nothing),
    no trailing ones; at most :data:`MAX_NAME_BYTES` bytes of UTF-8, cut from the stem so the
    extension stays; never empty (:data:`DEFAULT_NAME`)."""
    name = raw.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if unicodedata.category(ch) not in _DROPPED_CATEGORIES)
    name = unicodedata.normalize("NFC", name)
    name = "".join(ch for ch in name if unicodedata.category(ch) not in _DROPPED_CATEGORIES)
    name = name.lstrip(". ").rstrip(". ")
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        stem, ext = _split_ext(name)
        name = _fit(stem, ext) if stem.strip(" .") else _cut(name, MAX_NAME_BYTES)
        name = name.lstrip(". ").rstrip(". ")
    return name or DEFAULT_NAME


def numbered_names(name: str, limit: int = 1000) -> Iterator[str]:
    """``name`` (a :func:`safe_name`), then ``name (2).ext``, ``name (3).ext``, ... up to
    ``limit`` names, each within :data:`MAX_NAME_BYTES`: the names to try, in order, when
    creating a file that must not replace one already there (the caller creates each with
    ``O_EXCL``: a name is taken or not at the moment of creation, never checked before)."""
    yield name
    stem, ext = _split_ext(name)
    for n in range(2, limit + 1):
        yield _fit(stem, f" ({n}){ext}")


def unique_name(name: str, taken: Iterable[str]) -> str:
    """The first of :func:`numbered_names` not in ``taken`` (for a listing; a folder that
    others write to takes :func:`numbered_names` with ``O_EXCL`` instead)."""
    used = set(taken)
    for candidate in numbered_names(name):
        if candidate not in used:
            return candidate
    raise StoreError(f"{name!r}: every numbered name is taken")
