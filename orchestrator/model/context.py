"""Context blocks: files, URLs and selected text attached to a user message.

A user message may carry ``metadata["context"]``, a list of items::

    {"type": "file", "path": "notes/plan.md"}
    {"type": "url", "url": "https://example.com/spec"}
    {"type": "selection", "text": "...", "path": "src/a.py", "start_line": 3, "end_line": 9}

The stored ``content`` stays exactly what the person typed.  The blocks are
expanded only when a run is assembled (``expand_message``), so every run sees
the files and pages as they are now; an edited message gets fresh context for
free.  Each block is one XML element the model can tell apart from the text;
an item that cannot be read becomes an ``*_error`` element rather than
failing the run, so the model can say what it could not see.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from orchestrator.core.errors import InvalidMessageMetadata
from orchestrator.core.jsontypes import WHOLE_NUMBER, JsonObject

CONTEXT_KEY = "context"
MAX_ITEMS = 20
# What the API's document promises a url item may be (the validator below takes any absolute
# http(s) URL with a host; this pattern is the plain part of that, for clients and fuzzers).
URL_SCHEMA_PATTERN = r"^https?://[A-Za-z0-9._~-]+(:[0-9]{1,5})?([/?#][^\s]*)?$"


class _Item(BaseModel):
    # Strict: JSON's types as they are (no "3" for 3, no 1 for true), as the API documents them.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class FileItem(_Item):
    type: Literal["file"]
    path: str = Field(min_length=1)


class UrlItem(_Item):
    type: Literal["url"]
    url: str = Field(json_schema_extra={"pattern": URL_SCHEMA_PATTERN})

    @field_validator("url")
    @classmethod
    def _http_only(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an absolute http:// or https:// URL")
        return v


class SelectionItem(_Item):
    type: Literal["selection"]
    text: str = Field(min_length=1)
    title: str | None = None
    path: str | None = None
    start_line: Annotated[int, Field(ge=1), WHOLE_NUMBER] | None = None
    end_line: Annotated[int, Field(ge=1), WHOLE_NUMBER] | None = None


ContextItem = Annotated[Union[FileItem, UrlItem, SelectionItem], Field(discriminator="type")]
_ITEMS: TypeAdapter[list[ContextItem]] = TypeAdapter(list[ContextItem])


def parse_context(metadata: JsonObject | None) -> list[ContextItem]:
    """The context items of a message's metadata; bad items raise naming the field."""
    raw = (metadata or {}).get(CONTEXT_KEY)
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidMessageMetadata("metadata.context", "must be a list of context items")
    if len(raw) > MAX_ITEMS:
        raise InvalidMessageMetadata("metadata.context", f"at most {MAX_ITEMS} context items")
    try:
        return _ITEMS.validate_python(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        # pydantic puts the union tag after the index: (1, "url", "url").
        loc = list(err["loc"])
        if len(loc) > 1 and isinstance(loc[0], int) and loc[1] in ("file", "url", "selection"):
            del loc[1]
        where = "metadata.context" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "union_tag_invalid":
            where, msg = where + ".type", "must be one of file, url, selection"
        elif err["type"] == "union_tag_not_found":
            where, msg = where + ".type", "is required (file, url or selection)"
        raise InvalidMessageMetadata(where, msg) from None
