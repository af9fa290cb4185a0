"""Export a group's history (markdown for people, JSON for machines) and import it back.

The JSON document carries every stored field of every message, superseded
ones included, so ``import`` of an ``export`` loses nothing: exporting the
imported chat again gives the same messages (only ``seq``, the database's own
cursor, is assigned afresh).  Import is idempotent: messages already present
(same id and chat) are skipped, and imported history never wakes the agent.

An import never makes a main group: a file is data from anywhere, and the main
group's agent may post into every chat.  The group an import registers is an
ordinary one whatever the file's ``is_main`` says (``ImportResult.main_ignored``
tells the caller); the database holds at most one main group in any case
(revision 0017).  Nor does it set a group's own model, output cap, thinking budget,
trigger names or tools (its profile: ``orchestrator groups set``): an export never
carries them, and a file that names them is refused whole.

Files: the messages name them by id, and an export names them only so, unless it
carries them (``export --with-files``: each file the messages name that is still
stored, its bytes in base64).  An import stores the files it carries again, as
its chat's own and within the chat's limits, and makes the messages name them by
their new ids; a message naming a file the import neither carries nor finds among
its chat's files is refused, as a forged reference is everywhere.
"""

from __future__ import annotations

import base64
import difflib
import json
from datetime import UTC, datetime
from typing import Final, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import update

from orchestrator.core.errors import FileTooLarge, InvalidMessage, InvalidMessageMetadata, NotFound
from orchestrator.core.jsontypes import JsonObject
from orchestrator.model.envelopes import (
    CodeEditPayload,
    FilePayload,
    TodoPayload,
    ToolCallPayload,
    file_label,
    files_of,
    parse_message_metadata,
    refuse_host_envelope,
)
from orchestrator.model.messages import NewMessage, StoredMessage
from orchestrator.model.parts import ToolResult
from orchestrator.model.render import render_text
from orchestrator.store.db import Database
from orchestrator.store.file_refs import checked_files
from orchestrator.store.file_rows import StoredFile
from orchestrator.store.files import FileStore
from orchestrator.store.groups import OWN_SETTINGS, find_group, validate_folder
from orchestrator.store.message_log import get_messages_after, insert_message
from orchestrator.store.tables import GroupRow, MessageRow

FORMAT: Final = "orchestrator-chat"
FORMAT_VERSION = 1


class ExportedGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    chat_jid: str
    name: str
    folder: str
    is_main: bool = False  # exported as it was; never taken by an import
    requires_trigger: bool = True
    assistant_name: str | None = None


class ExportedMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq: int | None = None  # informational: import assigns new ones, in this order
    id: str
    chat_jid: str
    sender: str
    sender_name: str
    content: str
    timestamp: str
    is_from_me: bool
    message_type: str
    metadata: JsonObject | None = None
    superseded_at: datetime | None = None
    edited_at: datetime | None = None


class ExportedFile(BaseModel):
    """A file the exported messages name, carried whole (``export --with-files``)."""

    model_config = ConfigDict(extra="forbid")

    id: str  # as the messages name it; an import stores the bytes again and renames it
    name: str
    data: str  # the bytes, base64


class ChatExport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["orchestrator-chat"] = FORMAT
    version: int = FORMAT_VERSION
    exported_at: datetime
    chat_jid: str
    group: ExportedGroup | None
    messages: list[ExportedMessage]
    # Empty unless the export carries its files: messages name files by id either way.
    files: list[ExportedFile] = Field(default_factory=list)


def export_chat(db: Database, chat_jid: str, *, files: FileStore | None = None) -> ChatExport:
    """The chat's messages (superseded ones too); with ``files``, the files they name that
    are still stored, carried whole."""
    group = find_group(db, chat_jid)
    messages = get_messages_after(chat_jid, 0, include_superseded=True, db=db)
    return ChatExport(
        exported_at=datetime.now(UTC),
        chat_jid=chat_jid,
        group=None if group is None else ExportedGroup.model_validate(group, from_attributes=True),
        messages=[ExportedMessage.model_validate(m.model_dump()) for m in messages],
        files=_carried(files, chat_jid, messages) if files is not None else [],
    )


def _carried(store: FileStore, chat_jid: str, messages: list[StoredMessage]) -> list[ExportedFile]:
    named = dict.fromkeys(ref.id for m in messages if (p := files_of(m.metadata)) for ref in p.files)
    out = []
    for file_id in named:
        try:
            stored = store.get(file_id, chat_jid)
        except NotFound:
            continue  # freed since: the messages still name it
        data = base64.b64encode(store.read_bytes(stored)).decode("ascii")
        out.append(ExportedFile(id=file_id, name=stored.name, data=data))
    return out


def export_json(db: Database, chat_jid: str, *, files: FileStore | None = None) -> str:
    """The export as JSON text, ASCII only: every other character escaped (``\\u001b``,
    ``\\u202e``), so the file is safe to show on a terminal as it is."""
    return json.dumps(export_chat(db, chat_jid, files=files).model_dump(mode="json"), indent=2)


class ImportResult(BaseModel):
    chat_jid: str
    imported: int
    skipped: int
    group_created: bool
    # The file named its group main: it was registered as an ordinary group (imports make no main group).
    main_ignored: bool = False


def parse_export(text: str) -> ChatExport:
    try:
        return ChatExport.model_validate_json(text)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "document"
        if err["type"] == "extra_forbidden" and len(err["loc"]) == 2 and err["loc"][0] == "group":
            if err["loc"][1] in OWN_SETTINGS:
                raise InvalidMessage(
                    f"not an orchestrator chat export: {where}: a group's profile is never imported; "
                    "set it with `orchestrator groups set`"
                ) from None
        raise InvalidMessage(f"not an orchestrator chat export: {where}: {err['msg']}") from None


def import_chat(db: Database, doc: ChatExport, *, files: FileStore | None = None) -> ImportResult:
    """Store an export's messages (validated like any other) in one transaction.  Files it
    carries are stored first as the chat's own (within its limits), and its messages are
    made to name them by their new ids; if the import fails they are taken back."""
    for m in doc.messages:
        if m.chat_jid != doc.chat_jid:
            raise InvalidMessage(f"message {m.id!r} belongs to {m.chat_jid!r}, not {doc.chat_jid!r}")
    if not doc.files:
        return _import(db, doc, {})
    if files is None:
        raise InvalidMessage("the export carries files; import it where they can be stored")
    stored: list[StoredFile] = []
    try:
        for carried in doc.files:
            stored.append(files.store_bytes(doc.chat_jid, _decoded(carried, files.max_bytes), carried.name))
        return _import(db, doc, {c.id: s.id for c, s in zip(doc.files, stored, strict=True)})
    except BaseException:
        files.discard(stored)
        raise


def _decoded(carried: ExportedFile, max_bytes: int) -> bytes:
    if len(carried.data) // 4 * 3 > max_bytes + 2:  # refused before decoding: base64 is 4 characters a 3 bytes
        raise FileTooLarge(f"file {carried.id!r} of the export", max_bytes, "file_max_bytes")
    try:
        return base64.b64decode(carried.data, validate=True)
    except (ValueError, TypeError):
        raise InvalidMessage(f"files[{carried.id}].data is not base64") from None


def _renamed(metadata: JsonObject | None, renamed: dict[str, str]) -> JsonObject | None:
    """``metadata`` with its FILE envelope's ids as the import stored them."""
    files = files_of(metadata)
    if files is None or not renamed:
        return metadata
    assert metadata is not None
    refs = [{**msgspec.to_builtins(ref), "id": renamed.get(ref.id, ref.id)} for ref in files.files]
    return {**metadata, "payload": {**metadata["payload"], "files": refs}}


def _import(db: Database, doc: ChatExport, renamed: dict[str, str]) -> ImportResult:
    imported = skipped = 0
    created = main_ignored = False
    last_seq = 0
    with db.write() as session:
        if doc.group is not None and session.get(GroupRow, doc.chat_jid) is None:
            validate_folder(doc.group.folder)
            # Never main, whatever the file says: the main group's agent posts into every chat.
            main_ignored = doc.group.is_main
            session.add(
                GroupRow(
                    **doc.group.model_dump(exclude={"is_main"}),
                    is_main=False,
                    cursor_seq=0,
                    pending_seq=0,
                    created_at=datetime.now(UTC),
                )
            )
            session.flush()
            created = True
        for m in doc.messages:
            fields = m.model_dump(exclude={"seq", "superseded_at", "edited_at"})
            try:
                # An export names files by id: only files this chat stored here may be named.
                metadata = _renamed(fields["metadata"], renamed)
                # A question (APPROVAL) is the host's own, asked by a run here: never imported.
                refuse_host_envelope(metadata)
                fields["metadata"] = checked_files(session.connection(), doc.chat_jid, metadata)
                stored, new = insert_message(session, db, NewMessage(**fields))
            except InvalidMessageMetadata as exc:
                raise InvalidMessageMetadata(f"messages[{m.id}].{exc.field}", exc.problem) from None
            last_seq = stored.seq
            if not new:
                skipped += 1
                continue
            imported += 1
            if m.superseded_at or m.edited_at:
                session.execute(
                    update(MessageRow)
                    .where(MessageRow.id == m.id, MessageRow.chat_jid == m.chat_jid)
                    .values(superseded_at=m.superseded_at, edited_at=m.edited_at)
                )
        if last_seq:
            # Imported history is context, not work: the agent must not answer it.
            session.execute(
                update(GroupRow)
                .where(GroupRow.chat_jid == doc.chat_jid, GroupRow.cursor_seq < last_seq)
                .values(cursor_seq=last_seq)
            )
    return ImportResult(
        chat_jid=doc.chat_jid, imported=imported, skipped=skipped, group_created=created, main_ignored=main_ignored
    )


# -- markdown -------------------------------------------------------------------


def _fence(text: str, lang: str = "") -> str:
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}{lang}\n{text.rstrip()}\n{fence}"


def _structured_markdown(msg: StoredMessage) -> str | None:
    payload = parse_message_metadata(msg.metadata).payload
    # Each known type's payload is its protocol Struct (raw for unknown types, None for TEXT).
    if isinstance(payload, CodeEditPayload):
        parts = []
        for edit in payload.edits:
            old = (edit.old_content or "").splitlines()
            new = (edit.new_content or "").splitlines()
            diff = difflib.unified_diff(old, new, f"a/{edit.file_path}", f"b/{edit.file_path}", lineterm="")
            parts.append(f"**{edit.file_path}**\n\n{_fence(chr(10).join(diff), 'diff')}")
        return "\n\n".join(parts)
    if isinstance(payload, TodoPayload):
        marks = {"pending": "- [ ]", "in_progress": "- [ ] ◐", "completed": "- [x]"}
        return "\n".join(
            f"{marks[t.status]} {'~~' + t.content + '~~' if t.status == 'completed' else t.content}"
            for t in payload.todos
        )
    if isinstance(payload, FilePayload):
        listed = "\n".join(f"- 📎 {file_label(f)} (file `{f.id}`)" for f in payload.files)
        return f"{msg.content}\n\n{listed}" if msg.content else listed
    if isinstance(payload, ToolCallPayload):
        p = payload
        body = f"`{p.tool_name}`\n\n{_fence(json.dumps(p.input, indent=2, ensure_ascii=False), 'json')}"
        if p.output is not None:
            out = p.output if isinstance(p.output, str) else json.dumps(p.output, indent=2, ensure_ascii=False)
            body += f"\n\n{_fence(out)}"
        if p.error:
            body += f"\n\n**error:** {p.error}"
        return body
    return None


def export_markdown(db: Database, chat_jid: str, assistant_name: str) -> str:
    """The display view as a document people read (superseded messages left out)."""
    group = find_group(db, chat_jid)
    title = group.name if group else chat_jid
    lines = [f"# {title}", "", f"`{chat_jid}` · exported {datetime.now(UTC).isoformat(timespec='seconds')}", ""]
    for m in get_messages_after(chat_jid, 0, db=db):
        who = m.sender_name or m.sender
        lines.append(f"### {who} · {m.timestamp[:19].replace('T', ' ')} · {m.message_type}")
        lines.append("")
        structured = _structured_markdown(m)
        if structured is not None:
            lines.append(structured)
        elif isinstance(m.part, ToolResult):
            head, _, _ = render_text(m, assistant_name).partition("\n")
            lines.append(f"{head}\n\n{_fence(m.content)}")
        else:
            lines.append(render_text(m, assistant_name) if m.part.kind == "host_note" else m.content)
        if m.edited_at:
            lines.append(f"\n_(edited {m.edited_at.isoformat(timespec='seconds')})_")
        lines.append("")
    return "\n".join(lines)
