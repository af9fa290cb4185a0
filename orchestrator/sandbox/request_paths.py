"""A request's path, in the one spelling the egress proxy checks and sends on.

Why: a brokered credential (``sandbox/egress_credentials.py``) is scoped to path prefixes,
and its secret is added to the request the proxy sends upstream.  If the proxy compared
the path as the sandbox wrote it, and sent it on as written, the upstream server would
resolve what the proxy did not: ``/repos/acme/../../orgs/other`` (dot segments, RFC 3986
§5.2.4, which nginx and most frameworks resolve), ``/repos/acme/%2e%2e/%2e%2e/orgs/other``
(the same, percent-encoded), ``..%2f``, ``..\\``, Tomcat's ``..;``, overlong UTF-8 (``%c0%ae``),
fullwidth dots that NFKC folds to ``.``: each starts with the prefix, and each lands
outside it with the secret attached.  So the path is normalised once, here, before any
check, and what the check saw is exactly what goes upstream.

:func:`origin_target` takes an origin-form target (``/path?query``) and either refuses it
(:class:`PathRefused`, saying why) or gives it back normalised:

* percent-encodings of unreserved characters (``A-Z a-z 0-9 - . _ ~``) are decoded, the
  others kept with their hex in upper case (RFC 3986 §6.2.2); nothing else changes;
* refused: a target that is not a path (absolute form, ``*``); a space, a control
  character or a non-ASCII byte, raw or encoded; a fragment (``#``); a malformed ``%``;
  an encoded slash (``%2F``) or backslash (``%5C``), a raw backslash; a doubly encoded
  character (``%25`` and two hex digits: a server that decodes twice would see anew);
  percent-encoded bytes that are not UTF-8 (overlong forms); an empty segment (``//``:
  servers disagree on whether to merge it, so it has no one meaning); and a dot segment
  (``.`` or ``..``) however spelled: the segment is fully decoded, folded by NFKC, and cut at
  its first ``;`` (path parameters, which Tomcat and Jetty strip) before it is compared;
  a segment that folds to a slash or backslash is refused too;
* the query string (after the first ``?``) is kept exactly as sent: it is not part of the
  path a prefix scopes.

Dot segments are refused rather than resolved: no client has a reason to send them (curl,
browsers and HTTP libraries resolve them before sending), so one in a request is a
mistake or an attempt, and refusing leaves nothing for the proxy and the server to resolve
differently.

:func:`path_under` is the scope check on the normalised path, by whole segments (see its doc).
"""

from __future__ import annotations

import string
import unicodedata
from typing import NamedTuple
from urllib.parse import unquote_to_bytes

_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
_HEX = frozenset(string.hexdigits)


class PathRefused(ValueError):
    """A request target the proxy will not send anywhere; its words say why."""


class OriginTarget(NamedTuple):
    """A normalised origin-form target: its path, and its query as sent (None: no ``?``)."""

    path: str
    query: str | None

    @property
    def target(self) -> str:
        """What goes on the request line upstream."""
        return self.path if self.query is None else f"{self.path}?{self.query}"


def origin_target(target: str) -> OriginTarget:
    """``target`` (``/path?query``) normalised, or :class:`PathRefused` (see the module's doc)."""
    if not target.startswith("/"):
        raise PathRefused("the request's target is not a path (origin form: /path?query)")
    if not target.isascii() or any(c <= " " or c == "\x7f" for c in target):
        raise PathRefused("the request's target holds a space, a control or a non-ASCII character")
    if "#" in target:
        raise PathRefused("the request's target holds a fragment (#)")
    path, sep, query = target.partition("?")
    if "\\" in path:
        raise PathRefused("the request's path holds a backslash")
    out: list[str] = []
    i = 0
    while i < len(path):
        c = path[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        pair = path[i + 1 : i + 3]
        if len(pair) != 2 or not set(pair) <= _HEX:
            raise PathRefused("the request's path holds a malformed percent-encoding")
        char = chr(int(pair, 16))
        if char in _UNRESERVED:
            out.append(char)
        elif char == "/":
            raise PathRefused("the request's path holds an encoded slash (%2F)")
        elif char == "\\":
            raise PathRefused("the request's path holds an encoded backslash (%5C)")
        elif char == "%" and len(path[i + 3 : i + 5]) == 2 and set(path[i + 3 : i + 5]) <= _HEX:
            raise PathRefused("the request's path holds a doubly percent-encoded character (%25..)")
        else:
            out.append("%" + pair.upper())
        i += 3
    normal = "".join(out)
    segments = normal.split("/")[1:]
    for n, segment in enumerate(segments):
        if not segment:
            if n < len(segments) - 1:  # the last may be empty: a trailing slash
                raise PathRefused("the request's path holds an empty segment (//)")
            continue
        _check_segment(segment)
    return OriginTarget(normal, query if sep else None)


def _check_segment(segment: str) -> None:
    """Refuse a segment that is, or reads as, a dot segment or a slash (decoded fully)."""
    try:
        text = unquote_to_bytes(segment).decode("utf-8")
    except UnicodeDecodeError:
        raise PathRefused("the request's path holds percent-encoded bytes that are not UTF-8") from None
    if any(unicodedata.category(c) == "Cc" for c in text):
        raise PathRefused("the request's path holds an encoded control character")
    folded = unicodedata.normalize("NFKC", text)
    if "/" in folded or "\\" in folded:
        raise PathRefused("the request's path holds a character that reads as a slash")
    if folded.split(";", 1)[0] in (".", ".."):
        raise PathRefused("the request's path holds a dot segment (. or ..), in some spelling")


def path_under(path: str, prefix: str) -> bool:
    """Whether the normalised ``path`` is within ``prefix`` (normalised too), by whole segments:
    a prefix ending in ``/`` holds the paths that start with it (``/repos/acme/`` holds
    ``/repos/acme/x``, not ``/repos/acme``); one that does not holds itself and the paths
    below it (``/repos/acme`` holds ``/repos/acme`` and ``/repos/acme/x``, never
    ``/repos/acmeevil``)."""
    if prefix.endswith("/"):
        return path.startswith(prefix)
    return path == prefix or path.startswith(prefix + "/")
