"""What byte searches tell of a request's body before (or instead of) a parse: its policed
keys and its messages' source keys, counted in any case, and whether a key could be spelled
another way (:class:`Scan`).

Go's encoding/json (an OpenAI-compatible server such as Ollama) matches keys ignoring
case, and every JSON reader undoes escapes: a byte search for ``"model"`` misses
``"Model"`` and ``"\\u006dodel"``.  So the searches run over the body lowered, an escape
of a letter or the two characters Go folds to ``k`` and ``s`` count as a respelling, and
:func:`case_folded` writes messages as such a reader sees their keys.  Counts are of keys and
string values alike: an overcount only costs a rewrite (``rules.py``) or a decode
(``sources.py``).
"""

from __future__ import annotations

import collections
import functools
import itertools
import operator
import re

import msgspec

from .refusal import Refusal
from .wire import Head

# How a policed key could be spelled so that a byte search misses it: a JSON
# escape of an ASCII letter or "_" (\u006d, \u005F; no encoder writes these
# on its own), or the two characters Go's encoding/json (Ollama's) folds to
# "k" and "s" when it matches keys, which it does ignoring case: the Kelvin
# sign and the long s, escaped or not.
_ESCAPED_NAME_CHAR = re.compile(rb"\\u(?:00[4-7][0-9a-fA-F]|212[aA]|017[fF])")  # a literal prefix: a fast search
_GO_FOLDED = (b"\xe2\x84\xaa", b"\xc5\xbf")  # the two, in UTF-8
# A key of a message's block (or part) that can name content kept elsewhere, for a server to
# fetch: the Messages API's "source" (of an image, a document, ...), and the URLs, files and
# audio of Chat Completions parts (OpenAI's, vLLM's, llama.cpp's, Mistral's, OpenRouter's).
SOURCE_KEYS = (
    "source",
    "url",
    "image_url",
    "audio_url",
    "video_url",
    "file_url",
    "document_url",
    "input_audio",
    "file",
    "file_id",
    "file_data",
)


# The policed keys (in every body) and the source keys (in the messages), quoted, counted in one
# pass over the body lowered (four byte counts took four times as long as one pass): in any case,
# as Go's encoding/json matches keys ignoring it.  The closing quote is only looked at, as a count
# of each would see a quote shared by two; the lookahead for a first and a second letter passes
# most quotes (there is one every few bytes of a text of code) over at once.
def _key_search(*names: str) -> re.Pattern[bytes]:
    first, second = ("".join(sorted({name[i] for name in names})) for i in (0, 1))
    return re.compile(rb'"(?=[%s][%s])(%s)(?=")' % (first.encode(), second.encode(), "|".join(names).encode()))


POLICED_KEY = _key_search("model", "max_tokens", "max_completion_tokens", "tools", "messages")
QUOTED_KEY = _key_search("model", "max_tokens", "max_completion_tokens", "tools", "messages", *SOURCE_KEYS)
# A body with more counted keys than this is not counted further (a hostile one could have
# millions: ~1 s each): it is rewritten, if a policed key is counted, and refused, if its
# messages' keys are.  A real request has a handful.
MAX_COUNTED = 200_000
_MATCHED = operator.itemgetter(1)  # what a search found, one by one (a list of them all could be large)
SOURCE_KEY_BYTES = frozenset(name.encode() for name in SOURCE_KEYS)


class Scan:
    """What byte searches tell of a request's body (and its messages): each made once, when first asked."""

    def __init__(self, body: bytes, head: Head) -> None:
        self.body = body
        self.head = head
        # The messages are most of the body (a long session): searched with it, and read
        # folded from it lowered (kept for ``sources.hold_sources``, which lets it go).
        self.whole = len(head.messages) * 2 >= len(body)
        self.lowered: bytes | None = None

    @functools.cached_property
    def keys(self) -> collections.Counter[bytes]:
        """The policed keys (and the source keys, if :attr:`whole`), quoted, in any case (Go's
        encoding/json matches keys ignoring it): nested keys and string values alike (an
        overcount is safe)."""
        lowered = self.body.lower()
        if self.whole:
            self.lowered = lowered
        return keys_in(QUOTED_KEY if self.whole else POLICED_KEY, lowered)

    def count(self, name: bytes) -> int:
        """``name``, quoted, in any case (-1: the keys were too many to count)."""
        return -1 if capped(self.keys) else self.keys[name]

    @functools.cached_property
    def respelled(self) -> bool:
        """Could the body spell a key character another way (:data:`_ESCAPED_NAME_CHAR`)?"""
        return respelled_in(self.body)

    @functools.cached_property
    def message_keys(self) -> collections.Counter[bytes]:
        """The source keys in the messages, quoted, in any case: the body's less its other
        fields' if :attr:`whole`, else the messages' own.  A key outside the fields the head
        holds (the top level's own, those only a case-blind reader takes for a policed one)
        counts as the messages': an overcount, which costs a decode."""
        if not self.whole:
            return keys_in(QUOTED_KEY, bytes(self.head.messages).lower())
        if capped(self.keys):
            return self.keys
        keys = self.keys.copy()
        head = self.head
        for name in head.__struct_fields__:
            if name != "messages" and isinstance(value := getattr(head, name), msgspec.Raw) and value:
                keys.subtract(keys_in(QUOTED_KEY, bytes(value).lower()))
        return keys

    @functools.cached_property
    def messages_respelled(self) -> bool:
        return self.respelled if self.whole else respelled_in(bytes(self.head.messages))


def keys_in(search: re.Pattern[bytes], lowered: bytes | bytearray) -> collections.Counter[bytes]:
    """What ``search`` finds in ``lowered``, by name, up to about :data:`MAX_COUNTED`."""
    if len(lowered) <= 6 * MAX_COUNTED:  # a key and its ':' or ',' take 6 bytes at least: a short list
        return collections.Counter(search.findall(lowered))
    found = map(_MATCHED, search.finditer(lowered))
    return collections.Counter(itertools.islice(found, MAX_COUNTED + 1))


def capped(keys: collections.Counter[bytes]) -> bool:
    return keys.total() > MAX_COUNTED


def respelled_in(data: bytes) -> bool:
    return (
        _ESCAPED_NAME_CHAR.search(data) is not None
        # The last byte alone first: a search for one byte is many times faster.
        or any(char[-1:] in data and char in data for char in _GO_FOLDED)
    )


def case_folded(messages: msgspec.Raw) -> bytes | bytearray:
    """The messages with their keys as a reader that matches them ignoring case sees them:
    lowered, the Kelvin sign and long s as "k" and "s", an escaped name character written as
    itself (values change too: they are only read, never sent).  At most two copies of the
    messages are held at once."""
    folded = bytes(messages).lower()
    if not folded.isascii():
        for char, letter in zip(_GO_FOLDED, (b"k", b"s"), strict=True):
            if char[-1:] in folded:
                folded = folded.replace(char, letter)
    if _ESCAPED_NAME_CHAR.search(folded) is None:
        return folded
    view = memoryview(folded)
    out = bytearray()
    last = 0
    for seen, match in enumerate(_ESCAPED_NAME_CHAR.finditer(folded)):
        if seen == MAX_COUNTED:
            raise Refusal(
                413,
                "request_too_large",
                f"the gateway reads messages with escaped letters (or text "
                f"that looks so) in requests with at most {MAX_COUNTED} of them",
            )
        if _backslashes_before(folded, match.start()) % 2:  # "\\u0041": a backslash, then the text "u0041"
            continue
        out += view[last : match.start()]
        out += _UNESCAPED[match[0]]
        last = match.end()
    out += view[last:]
    return out


# An escaped name character (lowered) as a reader that matches keys ignoring case reads it: the
# character itself, lowered (a backslash stays escaped).
_UNESCAPED = {b"\\u%04x" % code: (b"\\\\" if code == 0x5C else bytes([code]).lower()) for code in range(0x40, 0x80)}
_UNESCAPED |= {b"\\u212a": b"k", b"\\u017f": b"s"}


def _backslashes_before(data: bytes, end: int) -> int:
    """How many backslashes end ``data[:end]`` (a long run is searched a block at a time)."""
    count = 0
    size = 16
    while end > 0 and data[end - 1] == 0x5C:
        block = data[max(0, end - size) : end]
        run = len(block) - len(block.rstrip(b"\\"))
        count += run
        end -= run
        size = 4096
    return count
