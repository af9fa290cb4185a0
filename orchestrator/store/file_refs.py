"""Messages that name stored files: the FILE envelope made from rows, and a message's
references checked against the store before it is stored.

A FILE envelope names each file by the store's id; its name, type and size are the
store's (:func:`checked_files` puts them in place of what a sender or an export said), and
an id must name a file of the message's own chat, once.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from orchestrator.core.errors import InvalidMessageMetadata
from orchestrator.core.jsontypes import JsonObject
from orchestrator.model.envelopes import ENVELOPE_KEYS, FILE, FilePayload, FileRef, build_structured_envelope, files_of
from orchestrator.store.db import Connection, driver_execute
from orchestrator.store.file_rows import COLUMNS, StoredFile, stored_file


def file_ref(stored: StoredFile) -> FileRef:
    """How a message names ``stored`` (its FILE envelope's entry)."""
    return FileRef(id=stored.id, name=stored.name, mime=stored.mime, size=stored.size)


def file_envelope(files: Sequence[StoredFile], *, extras: JsonObject | None = None) -> JsonObject:
    """The metadata of a message that carries ``files`` (a FILE envelope)."""
    payload = FilePayload(files=[file_ref(f) for f in files])
    return build_structured_envelope(FILE, msgspec.to_builtins(payload), extras=extras)


def checked_files(conn: Connection, chat_jid: str, metadata: JsonObject | None) -> JsonObject | None:
    """In the caller's transaction: ``metadata`` with its FILE envelope's entries as this
    store has them (name, type and size from the rows, not from the sender or the export),
    or ``metadata`` itself when it carries no files.  Every id must name a file of
    ``chat_jid``, once: a forged reference (another chat's file, an id that was never
    stored) is refused with :class:`InvalidMessageMetadata` naming the entry, and nothing
    is stored."""
    files = files_of(metadata)
    if files is None:
        return metadata
    assert metadata is not None
    ids = [ref.id for ref in files.files]
    params = {f"id{i}": ref_id for i, ref_id in enumerate(ids)}
    rows = driver_execute(
        conn,
        f"SELECT {COLUMNS} FROM files WHERE chat_jid = :chat_jid AND id IN ({', '.join(':' + k for k in params)})",
        {"chat_jid": chat_jid, **params},
    ).fetchall()
    found = {row.id: row for row in map(stored_file, rows)}
    seen: set[str] = set()
    for i, ref_id in enumerate(ids):
        where = f"metadata.payload.files[{i}].id"
        if ref_id in seen:
            raise InvalidMessageMetadata(where, f"names file {ref_id!r} a second time")
        if ref_id not in found:
            raise InvalidMessageMetadata(where, f"names no file of chat {chat_jid!r} (upload it to this chat first)")
        seen.add(ref_id)
    extras = {k: v for k, v in metadata.items() if k not in ENVELOPE_KEYS}
    return file_envelope([found[ref_id] for ref_id in ids], extras=extras)
