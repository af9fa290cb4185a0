"""A stored file's type, sniffed from its bytes: never the sender's word, never HTML or SVG.

The type is sniffed (:func:`sniff`, or :class:`Sniffer` as the bytes stream) from the first
bytes against a table of magic numbers for the types that matter (PNG, JPEG, GIF, WebP, PDF,
ZIP), else ``text/plain`` for bytes that are all valid UTF-8 with no NUL, else
``application/octet-stream``.  The sender's type and the name's extension are never asked.
A table, not a library: a general sniffer (libmagic, ``puremagic``, ``filetype``) also
answers ``text/html`` and ``image/svg+xml``, which a browser runs as code when served
inline; this one can answer only the types above, so no stored file ever claims either
(HTML or SVG is ``text/plain`` here).  Serving must still send ``Content-Disposition:
attachment`` and ``nosniff``, and preview inline only the raster image types
(:data:`INLINE_IMAGE_TYPES`).
"""

from __future__ import annotations

import codecs

OCTET_STREAM = "application/octet-stream"
TEXT = "text/plain"
# (offset, magic, type): the types that matter, as their formats' specifications start them.
MAGIC: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\x89PNG\r\n\x1a\n", "image/png"),  # PNG signature (RFC 2083)
    (0, b"\xff\xd8\xff", "image/jpeg"),  # JPEG SOI + the first marker's 0xFF
    (0, b"GIF87a", "image/gif"),
    (0, b"GIF89a", "image/gif"),
    (0, b"%PDF-", "application/pdf"),
    (0, b"PK\x03\x04", "application/zip"),  # a local file header (also docx, xlsx, jar, ...)
    (0, b"PK\x05\x06", "application/zip"),  # an empty archive's end record
)
# WebP: a RIFF container ("RIFF", 4 bytes of size, "WEBP").
_WEBP = ((0, b"RIFF"), (8, b"WEBP"))
SNIFF_BYTES = 16
# The only types sniff() answers: never text/html or image/svg+xml (see the module's docstring).
TYPES = frozenset({t for _, _, t in MAGIC} | {"image/webp", TEXT, OCTET_STREAM})
# Raster images a page may one day show inline (never SVG: it runs scripts).
INLINE_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


class Sniffer:
    """The type of bytes fed in pieces, as they stream: the magic numbers of the first
    :data:`SNIFF_BYTES`, else UTF-8 validity (and no NUL) of the whole, incrementally."""

    def __init__(self) -> None:
        self._head = b""
        self._text = True
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")

    def feed(self, chunk: bytes) -> None:
        if len(self._head) < SNIFF_BYTES:
            self._head += chunk[: SNIFF_BYTES - len(self._head)]
        if self._text:
            try:
                self._decoder.decode(chunk)
            except UnicodeDecodeError:
                self._text = False
            else:
                self._text = b"\x00" not in chunk

    def result(self) -> str:
        head = self._head
        for offset, magic, mime in MAGIC:
            if head[offset : offset + len(magic)] == magic:
                return mime
        if all(head[o : o + len(m)] == m for o, m in _WEBP):
            return "image/webp"
        if self._text:
            try:
                self._decoder.decode(b"", final=True)  # a character cut off at the end is no text
            except UnicodeDecodeError:
                return OCTET_STREAM
            return TEXT
        return OCTET_STREAM


def sniff(data: bytes) -> str:
    """The MIME type of ``data``, from its bytes alone (one of :data:`TYPES`)."""
    sniffer = Sniffer()
    sniffer.feed(data)
    return sniffer.result()
