"""Files both ways through a real container: a person's file read by the agent in its inbox,
a file the agent writes handed back with send_file, and the host's own check of send_file
against a front end that forges it past the runner (a symlink to the host's /etc/passwd, a
FIFO, a path out of the workspace).

Real Docker, the real agent image (the offline model's ``/read``, ``/write`` and
``/send-file``, ``/images``) and the faulty image (``forge-send-file``)."""

from __future__ import annotations

import io

from PIL import Image

from orchestrator.core.settings import Settings
from orchestrator.model.envelopes import FILE, files_of
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.store.db import Database
from orchestrator.store.files import FileStore
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after
from tests.image_bombs import png_claiming

JID = "main@local"


def _pipeline(settings: Settings, db: Database, image: str) -> Pipeline:
    s = settings.replace(agent_image=image, run_timeout_s=30.0)
    s.ensure_dirs()
    ensure_main_group(db)
    return Pipeline(s, db, ChannelRegistry([]))


def _run(p: Pipeline, text: str, metadata: dict[str, object] | None = None) -> None:
    ingest(p.db, p.settings, IncomingMessage(chat_jid=JID, sender="u", content=text, metadata=metadata), signal=None)
    assert [o.run.state for o in p.drain_group(JID)] == ["succeeded"]


def test_the_agent_reads_a_sent_file_and_sends_one_back(settings: Settings, db: Database, agent_image: str) -> None:
    p = _pipeline(settings, db, agent_image)
    store = FileStore.from_settings(db, p.settings)
    notes = store.store_bytes(JID, b"the secret word is pelican\n", "notes.txt")
    ref = {"id": notes.id, "name": notes.name, "mime": notes.mime, "size": notes.size}
    _run(p, "/read inbox/notes.txt", {"message_type": FILE, "payload": {"files": [ref]}})
    results = [m.content for m in get_messages_after(JID, 0, db=db) if m.message_type == "tool_result"]
    assert "pelican" in results[-1]

    _run(p, "/write report.txt\nall done\n/end\n/send-file report.txt here it is")
    sent = [m for m in get_messages_after(JID, 0, db=db) if m.message_type == "assistant" and files_of(m.metadata)]
    assert len(sent) == 1 and sent[0].content == "here it is"
    files = files_of(sent[0].metadata)
    assert files is not None
    (out,) = files.files
    assert (out.name, out.mime) == ("report.txt", "text/plain")
    assert store.read_bytes(store.get(out.id, JID)) == b"all done\n"


def test_the_host_refuses_a_forged_send_file(settings: Settings, db: Database, faulty_image: str) -> None:
    p = _pipeline(settings, db, faulty_image)
    _run(p, "forge-send-file")
    messages = get_messages_after(JID, 0, db=db)
    refusals = [m.content for m in messages if m.message_type == "host" and "send_file refused" in m.content]
    assert len(refusals) == 3
    assert "leak" in refusals[0] and "symlink" in refusals[0]
    assert "pipe" in refusals[1] and "not a regular file" in refusals[1]
    assert "'..' is not allowed" in refusals[2]
    assert not any(files_of(m.metadata) for m in messages)
    assert FileStore.from_settings(db, p.settings).list_chat(JID) == []


def test_a_sent_image_reaches_the_model_scaled_in_the_sandbox(
    settings: Settings, db: Database, agent_image: str
) -> None:
    p = _pipeline(settings, db, agent_image)
    store = FileStore.from_settings(db, p.settings)
    picture = io.BytesIO()
    Image.new("RGB", (2400, 1200), (10, 120, 200)).save(picture, "PNG")
    bomb = png_claiming(100_000, 100_000)
    refs = []
    for data, name in ((picture.getvalue(), "sky.png"), (bomb, "bomb.png")):
        f = store.store_bytes(JID, data, name)
        refs.append({"id": f.id, "name": f.name, "mime": f.mime, "size": f.size})
    _run(p, "/images", {"message_type": FILE, "payload": {"files": refs}})
    replies = [m.content for m in get_messages_after(JID, 0, db=db) if m.sender == "bot"]
    assert replies[-1].splitlines() == [
        "image/jpeg 1568x784",
        "[image inbox/bomb.png is not shown: it has more than 50000000 pixels, more than are ever decoded]",
    ]
