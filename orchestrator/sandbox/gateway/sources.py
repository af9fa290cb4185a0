"""The messages of a request, held to content sent inline (:func:`hold_sources`).

A block of the messages that names content kept elsewhere is refused (403
``source_not_allowed``, naming the message and block and why): a source of type ``url``
(or ``file``, a file stored at the provider) on an image, a document or any block, in a
``tool_result``'s content or a document's too; on OpenAI-compatible servers an image,
audio, video or file part (``image_url`` and the like, whatever its type) whose URL is not
a ``data:`` URL, or a ``file_id``.  The provider (or the server behind an
OpenAI-compatible API, or a relay in front of either) would fetch it: an egress out of a
sandbox with no network.  Inline content passes: base64, text and content sources,
``data:`` URLs, base64 data.

The messages are read only when a byte search (``scan.py``) finds a source key in them, as
their readers read them: as they are and, if a key is spelled in another case, as a reader
that matches keys ignoring case (Go's encoding/json) reads them.  What reading them may
cost is bounded: the objects built, the source keys and the depth of lists in lists.
"""

from __future__ import annotations

import collections
import contextlib
import re
from collections.abc import Callable
from typing import TypeVar

import msgspec

from .refusal import Refusal
from .scan import QUOTED_KEY, SOURCE_KEY_BYTES, Scan, capped, case_folded, keys_in

# A content list is read one level at a time, each level a decode of its own (lists in lists
# are rare: a tool_result's content, a document's content source), this deep at most; a
# request that nests blocks deeper is refused.
_MAX_SOURCE_DEPTH = 8
# Reading the blocks builds an object for each message and block, and one for each source key:
# a hostile list of millions of tiny blocks ([{},{},...]) would cost hundreds of MB.  Every
# block is an object, so this many objects (a '{' before a key or a '}': a fast count of every
# '{' first) and this many source keys bound it (~25 MB at worst); a 2.7 MB Claude Code session
# has a few thousand objects.
_MAX_PARTS = 100_000
# An object starts so; a '{' before anything else is in a string.
_OBJECT_START = re.compile(rb'\{(?=[ \t\r\n]*["}])')
# Sources the Messages API takes inline; any other ("url", "file": a file at the provider) is refused.
_INLINE_SOURCE_TYPES = frozenset({"base64", "text", "content"})
# Leading characters a URL parser strips (WHATWG, Python's urllib) before it reads the scheme.
_URL_LEADING = bytes(range(0x21)).decode()


class _Part(msgspec.Struct, gc=False):
    """A block (a part) of a message's content, as far as a source can hide in it.

    Only these keys are read, each a raw value that :func:`_hold_part` decodes when present
    (msgspec skips the others without building them: a text, a tool's input): ``content``
    (a list of blocks), the Messages API's ``source``, and what Chat Completions servers
    fetch or look up (vLLM, llama.cpp, Mistral, OpenRouter, OpenAI's files), whatever the
    part's type says (vLLM reads a part with no type by its keys).
    """

    content: msgspec.Raw = msgspec.Raw()
    source: msgspec.Raw = msgspec.Raw()
    url: msgspec.Raw = msgspec.Raw()
    image_url: msgspec.Raw = msgspec.Raw()
    audio_url: msgspec.Raw = msgspec.Raw()
    video_url: msgspec.Raw = msgspec.Raw()
    file_url: msgspec.Raw = msgspec.Raw()
    document_url: msgspec.Raw = msgspec.Raw()
    input_audio: msgspec.Raw = msgspec.Raw()
    file: msgspec.Raw = msgspec.Raw()
    file_id: msgspec.Raw = msgspec.Raw()
    file_data: msgspec.Raw = msgspec.Raw()


class _Message(msgspec.Struct, gc=False):
    """A message: its content, a list of blocks read with it (most are), or a string."""

    content: list[_Part] | str | None = None


class _Messages(msgspec.Struct, gc=False):
    """A body's messages (the others fields passed over)."""

    messages: list[_Message] | None = None


class _Source(_Part):
    """A block's ``source`` object: its type, and any key a block could name content with."""

    type: msgspec.Raw = msgspec.Raw()


class _Media(msgspec.Struct, gc=False):
    """The object a part's URL, audio or file key holds (``{"url": ...}``, ``{"data": ..., "format": ...}``)."""

    url: msgspec.Raw = msgspec.Raw()
    file_url: msgspec.Raw = msgspec.Raw()
    data: msgspec.Raw = msgspec.Raw()
    file_data: msgspec.Raw = msgspec.Raw()
    file_id: msgspec.Raw = msgspec.Raw()


# What each key of a part holds: a URL (only a data: URL is inline), or data (base64, or a data: URL).
_URL_KEYS = ("url", "image_url", "audio_url", "video_url", "file_url", "document_url")
_DATA_KEYS = ("input_audio", "file", "file_data")

_MESSAGES = msgspec.json.Decoder(list[_Message])
_LOWERED_BODY = msgspec.json.Decoder(_Messages)
_PARTS = msgspec.json.Decoder(list[_Part])
_SOURCE = msgspec.json.Decoder(_Source | str | None)
_MEDIA = msgspec.json.Decoder(_Media | str | None)
_STRING = msgspec.json.Decoder(str)


def hold_sources(scan: Scan) -> None:
    """No block of the messages names content kept elsewhere: a URL, which the provider (or the
    server behind an OpenAI-compatible API, or a relay in front of either) would fetch, or a
    file stored at the provider, which is not this run's (the gateway forwards no upload).
    Inline content passes: base64, text and content sources, data: URLs, base64 data.

    Most requests have no source key in their messages, in any case (the byte search of
    :attr:`Scan.message_keys`), and are not decoded.  The others are read as their readers read
    them, twice: as they are (msgspec unescapes keys and takes the last of duplicates, as
    Python's json, pydantic and Go do), then folded (``scan.case_folded``), as a reader that matches
    keys ignoring case reads them (Go's encoding/json: the last key that matches a name, a
    "Content" as "content").  A block with keys that only differ in case is so read both ways.
    """
    messages = scan.head.messages
    if not messages:
        return
    keys = scan.message_keys
    lowered, scan.lowered = scan.lowered, None
    if capped(keys):
        raise _too_many_parts()
    folded: bytes | bytearray | None = None
    if scan.messages_respelled:  # keys the byte search does not see: the folded messages show them
        lowered = None
        folded = case_folded(messages)
        keys = keys_in(QUOTED_KEY, folded)
    elif not any(keys[key] > 0 for key in SOURCE_KEY_BYTES):
        return
    _bound_parts(scan.body, keys)
    _hold_messages(_decoded(_MESSAGES, messages, "messages"), folded=False)
    if folded is not None:
        read = _decoded(_MESSAGES, folded, "messages")
    elif lowered is not None:  # the body lowered: its messages are the messages lowered
        read = _decoded(_LOWERED_BODY, lowered, "messages").messages or []
    else:
        read = _decoded(_MESSAGES, bytes(messages).lower(), "messages")
    _hold_messages(read, folded=True)


def _bound_parts(body: bytes, keys: collections.Counter[bytes]) -> None:
    """Refuse a request whose messages would build over :data:`_MAX_PARTS` objects or source
    keys when read (the body's objects are counted: an overcount, with no copy of the messages)."""
    if capped(keys) or sum(keys[key] for key in SOURCE_KEY_BYTES) > _MAX_PARTS:
        raise _too_many_parts()
    if len(body) <= 2 * _MAX_PARTS or body.count(b"{") <= _MAX_PARTS:  # {} is an object: 2 bytes
        return
    for seen, _ in enumerate(_OBJECT_START.finditer(body)):  # the '{' in strings left out
        if seen == _MAX_PARTS:
            raise _too_many_parts()


def _too_many_parts() -> Refusal:
    return Refusal(
        413,
        "request_too_large",
        f"the gateway reads the blocks of messages that have source keys, in requests with at most "
        f"{_MAX_PARTS} objects and source keys",
    )


_T = TypeVar("_T")


def _decoded(decoder: msgspec.json.Decoder[_T], data: bytes | bytearray | msgspec.Raw, where: str) -> _T:
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Refusal(
            400,
            "invalid_request_error",
            f"{where}: {exc} (the gateway reads messages, and lists of blocks, as objects)",
        ) from None


def _hold_messages(messages: list[_Message], *, folded: bool) -> None:
    # _hold_list's loop, with the place named only when a block is read further: a long
    # session has thousands of blocks, and most are passed over.
    for index, message in enumerate(messages):
        if type(parts := message.content) is not list:  # a string, or none
            continue
        for number, part in enumerate(parts):
            if _names_a_source(part):
                _hold_part(part, f"messages[{index}].content[{number}]", 1, folded=folded)
            elif (content := part.content) and memoryview(content)[0] == 0x5B:  # '[': blocks
                _hold_blocks_in(content, f"messages[{index}].content[{number}].content", 1, folded=folded)


def _hold_list(parts: list[_Part], where: str, depth: int, *, folded: bool) -> None:
    """A list of blocks at ``where``, ``depth`` lists deep."""
    for index, part in enumerate(parts):
        if _names_a_source(part):
            _hold_part(part, f"{where}[{index}]", depth, folded=folded)
        elif (content := part.content) and memoryview(content)[0] == 0x5B:  # '[': blocks
            _hold_blocks_in(content, f"{where}[{index}].content", depth, folded=folded)


def _names_a_source(part: _Part) -> bool:
    # One expression: a loop over the names took three times as long, and most parts have none.
    return bool(
        part.source
        or part.url
        or part.image_url
        or part.audio_url
        or part.video_url
        or part.file_url
        or part.document_url
        or part.input_audio
        or part.file
        or part.file_id
        or part.file_data
    )


def _hold_blocks_in(content: msgspec.Raw, where: str, depth: int, *, folded: bool) -> None:
    """A block's list of blocks (a tool_result's content, a document's content source)."""
    if depth == _MAX_SOURCE_DEPTH:
        raise Refusal(
            400,
            "invalid_request_error",
            f"{where} nests blocks deeper than the gateway reads ({_MAX_SOURCE_DEPTH} lists)",
        )
    _hold_list(_decoded(_PARTS, content, where), where, depth + 1, folded=folded)


def _hold_part(part: _Part, where: str, depth: int, *, folded: bool) -> None:
    """A block that has a source key: every such key holds inline content."""

    def refuse(why: str) -> Refusal:
        if folded:  # not so as the keys are spelled: one differs from its name in case only
            why += (
                " (read so by a server that matches keys ignoring case, as Go's encoding/json does: a key "
                "here differs from its name in case only)"
            )
        return Refusal(403, "source_not_allowed", f"the gateway does not forward {where}: {why}")

    lists = [("content", part.content)]
    if part.source and (source := _hold_source(part.source, refuse)) is not None:
        lists.append(("source.content", source.content))
    for name in _URL_KEYS:
        if raw := getattr(part, name):
            _hold_media(raw, name, refuse, url=True)
    for name in _DATA_KEYS:
        if raw := getattr(part, name):
            _hold_media(raw, name, refuse, url=False)
    if part.file_id and bytes(part.file_id) != b"null":
        raise refuse(_FILE_ID.format(key="file_id"))
    for key, content in lists:
        if content and memoryview(content)[0] == 0x5B:  # '[': blocks (a string or null holds none)
            _hold_blocks_in(content, f"{where}.{key}", depth, folded=folded)


_FILE_ID = (
    "its {key!r} names a file stored at the provider, which is not this run's (the gateway forwards "
    "no upload); send the content inline"
)


def _hold_source(raw: msgspec.Raw, refuse: Callable[[str], Refusal]) -> _Source | None:
    """A block's source: inline (base64, text, content), or a string (a search result's, which
    names where the text came from; nothing fetches it)."""
    try:
        source = _SOURCE.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise refuse("its source is neither an object nor a string") from None
    if not isinstance(source, _Source):
        return None
    try:
        kind = _STRING.decode(source.type) if source.type else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise refuse("its source's type is not a string") from None
    if kind not in _INLINE_SOURCE_TYPES:
        why = {
            "url": "the provider would fetch it",
            "file": "it names a file stored at the provider, which is not this run's (the gateway forwards no upload)",
        }.get(kind or "", "it is not on the gateway's list")
        if kind == "url" and source.url:
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                why += f" ({_STRING.decode(source.url)[:200]!r})"
        raise refuse(
            f"its source is of type {kind!r}: {why}; send the content inline (a base64, text or content source)"
        )
    for name in (*_URL_KEYS, *_DATA_KEYS, "file_id", "source"):
        if getattr(source, name):
            raise refuse(f"its {kind} source has a {name!r} key, which a server could read instead")
    return source


def _hold_media(raw: msgspec.Raw, name: str, refuse: Callable[[str], Refusal], *, url: bool) -> None:
    """A part's URL (``url``: only a data: URL is inline) or data (base64, or a data: URL), a
    string or an object that holds it."""
    try:
        value = _MEDIA.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise refuse(f"its {name!r} is neither a string nor an object") from None
    if value is None:
        return
    if isinstance(value, str):
        if _remote(value, url=url):
            raise refuse(_FETCHED.format(key=name, value=value[:200]))
        return
    for key, is_url in (("url", True), ("file_url", True), ("data", False), ("file_data", False)):
        if not (inner := getattr(value, key)):
            continue
        try:
            text = _MEDIA.decode(inner)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise refuse(f"its '{name}.{key}' is not a string") from None
        if isinstance(text, str) and _remote(text, url=is_url):
            raise refuse(_FETCHED.format(key=f"{name}.{key}", value=text[:200]))
        if isinstance(text, _Media):
            raise refuse(f"its '{name}.{key}' is not a string")
    if value.file_id and bytes(value.file_id) != b"null":
        raise refuse(_FILE_ID.format(key=f"{name}.file_id"))


_FETCHED = "its {key!r} is {value!r}: the server would fetch it; send the content inline (a data: URL, or base64 data)"


def _remote(value: str, *, url: bool) -> bool:
    """Does a URL (``url``) or a data field name content elsewhere?  Anything but a data: URL
    for a URL; anything with a scheme but data: for data (base64 has no ':')."""
    if value.lstrip(_URL_LEADING)[:5].lower() == "data:":
        return False
    return url or ":" in value
