"""The body sent upstream (:func:`upstream_body`): the request's own bytes, with the fields
the rules add in front, or its top level written anew (:func:`rewritten`).

A compliant body goes upstream byte for byte; it is never decoded whole here (a hostile
one could be built to blow up in memory).  Where a rule changes a field, or a policed key
(``model``, the output caps, ``tools``, ``messages``) could be read another way (it
appears more than once, in any case, or spelled with escapes), the top level is written
anew, so the upstream gets one copy of each key, the one that was checked.
"""

from __future__ import annotations

import msgspec

from .refusal import Refusal
from .wire import MAX_REWRITE_COLONS, POLICED


def upstream_body(body: bytes, added: dict[str, object], changed: dict[str, object], *, rewrite: bool) -> bytes:
    """``body`` as it goes upstream: ``added`` fields (the request lacked them) first,
    ``changed`` ones replaced, written anew when changed or when ``rewrite`` says so."""
    if changed or rewrite:
        return rewritten(body, added, changed)
    if not added:
        return body
    # The added fields go in front of the others.
    rest = body.lstrip(b" \t\r\n")[1:]  # after the object's "{"
    comma = b"" if rest.lstrip(b" \t\r\n").startswith(b"}") else b","
    fields = b",".join(msgspec.json.encode(name) + b":" + msgspec.json.encode(value) for name, value in added.items())
    return b"{" + fields + comma + rest


def rewritten(body: bytes, added: dict[str, object], changed: dict[str, object]) -> bytes:
    """``body`` with its top level written anew: ``added`` first, then its own keys (each
    once, the last value of a duplicate, as ``wire.Head`` read it), ``changed`` replaced,
    and keys that only a case-blind reader takes for a policed one (``Model``) left out.
    Every value but those is passed on byte for byte (msgspec's Raw: never decoded)."""
    if body.count(b":") > MAX_REWRITE_COLONS:
        raise Refusal(
            413,
            "request_too_large",
            f"the gateway must rewrite this request's fields, and does so for requests with at "
            f"most {MAX_REWRITE_COLONS} keys; send the run's model and output cap as they are",
        )
    try:
        top = msgspec.json.decode(body, type=dict[str, msgspec.Raw])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Refusal(400, "invalid_request_error", f"the gateway needs a JSON object: {exc}") from None
    out = {name: msgspec.Raw(msgspec.json.encode(value)) for name, value in added.items()}
    for name, raw in top.items():
        if name not in POLICED and name.casefold() in POLICED:
            continue
        out[name] = msgspec.Raw(msgspec.json.encode(changed[name])) if name in changed else raw
    return msgspec.json.encode(out)
