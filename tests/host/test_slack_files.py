"""Files on Slack both ways, on both databases, against the fake Slack on loopback.

In: a message's file shares are downloaded with the bot token into the file store and named
by its FILE envelope, its text kept; every attack a file object can carry is refused before
anything is asked for where it can be (a URL off Slack's hosts, a chat no group is attached
to, a declared size over the limit, a sender over the rate), or stopped while it is read
(a server that lies about the size, a redirect elsewhere, a slow drip), leaving nothing
stored and a note in the message's text.  A second fake Slack on another port plays the
attacker's host: its request log proves nothing went there.

Out: a delivered message carrying files is posted, then each file goes through Slack's
external upload flow in the message's thread; a retry after a failure in the middle sends
only what is missing; an upload URL off Slack's hosts gets no bytes; only the message's own
chat's files are read.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from agent_runner.protocol import MAX_FILES_PER_MESSAGE
from fakes.slack_api import FakeSlack, fake_slack  # noqa: F401 - the fixture "fake"
from orchestrator.channels.slack import SlackChannel, SlackWeb
from orchestrator.channels.slack_files import origin_of, slack_origins
from orchestrator.channels.slack_inbound import EVENTS_PATH, SlackInbound, signed_headers
from orchestrator.core.errors import ChannelError
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.model.envelopes import files_of
from orchestrator.model.render import RenderedMessage
from orchestrator.model.views import REPLY_TO_KEY, RUN_ID_KEY
from orchestrator.root import Orchestrator
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry, Deliverer
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import Database
from orchestrator.store.deliveries import list_deliveries, utc_now
from orchestrator.store.file_refs import file_envelope
from orchestrator.store.file_rows import StoredFile
from orchestrator.store.files import FileStore
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.tables import DeliveryRow

JID = "team@chat"
SLACK_CHANNEL = "C0TEAM0001"
SIGNING = "slack-signing-secret-5e1d"
THREAD_TS = "1700000000.000100"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


@pytest.fixture
def sl(db: Database, settings: Settings, fake: FakeSlack) -> tuple[Database, Settings]:
    add_group(db, chat_jid=JID, name="Team", folder="team", requires_trigger=True, assistant_name="Robo")
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    return db, settings.replace(
        slack_bot_token=fake.bot_token,
        slack_api_base=fake.base,
        slack_signing_secret=SIGNING,
        # A failed delivery waits (a test makes it due with _due_now): one deliver_due is one attempt.
        delivery_retry_base_s=60.0,
        delivery_retry_max_s=60.0,
        file_max_bytes=64 * 1024,
    )


@pytest.fixture
def evil() -> Iterator[FakeSlack]:
    """Another server on loopback (another port: another origin), where no request may go."""
    with FakeSlack() as api:
        yield api


def _inbound(sl: tuple[Database, Settings]) -> SlackInbound:
    return SlackInbound(sl[0], sl[1], web=SlackWeb(sl[1]))


def _share(
    inbound: SlackInbound, fake: FakeSlack, text: str, files: list[Any], *, channel: str = SLACK_CHANNEL, **kw: Any
) -> Any:
    doc = fake.message_event(channel, "UANN0001", text, subtype="file_share", upload=True, files=files, **kw)
    return inbound.take(doc)


def _stored_files(sl: tuple[Database, Settings], chat_jid: str = JID) -> list[StoredFile]:
    return FileStore.from_settings(*sl).list_chat(chat_jid)


def _contents(sl: tuple[Database, Settings]) -> list[str]:
    """What is in the files folder (the tmp folder's leftovers too)."""
    root = sl[1].files_dir
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


# -- files in -------------------------------------------------------------------------------


def test_a_file_share_keeps_its_text_and_its_files(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    db, _ = sl
    notes = fake.host_file("notes.txt", b"the plan, in words\n")
    image = fake.host_file("shot.png", PNG, mimetype="image/png")
    result = _share(_inbound(sl), fake, "@Robo what is in these?", [notes, image], thread_ts=THREAD_TS)
    assert result is not None and result.created and result.triggered
    [stored] = get_messages_after(JID, 0, db=db)
    assert stored.content == "@Robo what is in these?"
    payload = files_of(stored.metadata)
    assert payload is not None
    assert [(f.name, f.mime, f.size) for f in payload.files] == [
        ("notes.txt", "text/plain", 19),
        ("shot.png", "image/png", len(PNG)),
    ]
    # The Slack facts ride along beside the envelope: a reply still finds its thread.
    assert stored.metadata is not None and stored.metadata["slack_thread_ts"] == THREAD_TS
    store = FileStore.from_settings(*sl)
    assert [store.read_bytes(store.get(f.id, JID)) for f in payload.files] == [b"the plan, in words\n", PNG]
    # Downloaded from url_private_download, with the bot token, once each.
    assert [(d.path.split("/")[-2], d.token, d.status) for d in fake.downloads] == [
        ("download", fake.bot_token, 200),
        ("download", fake.bot_token, 200),
    ]


def test_a_file_share_without_words_is_stored_with_its_file(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    result = _share(_inbound(sl), fake, "", [fake.host_file("data.csv", b"a,b\n1,2\n")])
    assert result is not None and result.created
    payload = files_of(result.message.metadata)
    assert payload is not None and [f.name for f in payload.files] == ["data.csv"]
    assert result.message.content == ""  # no words: the file is the message


def test_the_same_share_twice_is_downloaded_once(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    # Slack's retry comes while the first take is still downloading (a slow file): it waits,
    # then finds the message stored, and downloads nothing.
    slow = fake.host_file("slow.bin", b"x" * 8192, drip_s=0.05)
    doc = fake.message_event(SLACK_CHANNEL, "UANN0001", "take it", subtype="file_share", files=[slow])
    inbound = _inbound(sl)
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(inbound.take(doc)))
    first.start()
    time.sleep(0.1)
    again = inbound.take(doc)
    first.join(10)
    assert len(results) == 1 and results[0] is not None and results[0].created
    assert again is not None and not again.created and again.message.seq == results[0].message.seq
    assert len(fake.downloads) == 1 and len(_stored_files(sl)) == 1
    assert [m.content for m in get_messages_after(JID, 0, db=sl[0])] == ["take it"]


def test_two_processes_taking_one_share_at_once_keep_one_file(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    # Both download (neither knows of the other); the one whose message is the duplicate
    # takes its file back, so no file row is left that no message names.
    slow = fake.host_file("both.bin", b"w" * 4096, drip_s=0.05)
    doc = fake.message_event(SLACK_CHANNEL, "UANN0001", "once", subtype="file_share", files=[slow])
    results: list[Any] = []
    takers = [threading.Thread(target=lambda: results.append(_inbound(sl).take(doc))) for _ in range(2)]
    for t in takers:
        t.start()
    for t in takers:
        t.join(10)
    assert len(fake.downloads) == 2 and sorted(r.created for r in results) == [False, True]
    [message] = get_messages_after(JID, 0, db=sl[0])
    payload = files_of(message.metadata)
    assert payload is not None and [f.id for f in _stored_files(sl)] == [payload.files[0].id]


@pytest.mark.parametrize(
    "where",
    [
        "evil",  # another server: the same host, another port
        "https",  # the fake's host and port, another scheme
        "localhost",  # the same server by another name
        "userinfo",  # http://127.0.0.1:<port>@evil/...: a host in disguise
        "file",  # file:///etc/passwd
        "backslash",  # parsers differ on it
    ],
)
def test_a_file_url_off_slacks_hosts_is_never_fetched(
    sl: tuple[Database, Settings], fake: FakeSlack, evil: FakeSlack, where: str
) -> None:
    port = fake.root.rsplit(":", 1)[1]
    evil_port = evil.root.rsplit(":", 1)[1]
    hosted = evil if where == "evil" else fake
    roots = {
        "evil": evil.root,
        "https": f"https://127.0.0.1:{port}",
        "localhost": f"http://localhost:{port}",
        "userinfo": f"http://127.0.0.1:{port}@127.0.0.1:{evil_port}",
        "backslash": f"http://127.0.0.1:{evil_port}\\@127.0.0.1:{port}",
    }
    shared = hosted.host_file("secret.txt", b"s3cret", root=roots.get(where))
    if where == "file":
        shared["url_private_download"] = shared["url_private"] = "file:///etc/passwd"
    result = _share(_inbound(sl), fake, "look", [shared])
    assert result is not None
    assert result.message.content == "look\n📎 secret.txt: not taken (its URL is not Slack's)"
    assert files_of(result.message.metadata) is None
    assert fake.downloads == [] and evil.requests == [] and evil.downloads == []
    assert _stored_files(sl) == []


def test_a_chat_no_group_is_attached_to_downloads_nothing(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    files = [fake.host_file("a.txt", b"a"), fake.host_file("b.txt", b"b")]
    result = _share(_inbound(sl), fake, "psst", files, channel="C0STRANGER1")
    assert result is not None and result.message.chat_jid == "slack:C0STRANGER1" and not result.triggered
    assert result.message.content == (
        "psst\n📎 2 shared file(s): not taken (this Slack channel is no registered group's)"
    )
    assert fake.downloads == [] and _stored_files(sl, "slack:C0STRANGER1") == [] and _contents(sl) == []


def test_a_file_declared_too_large_is_not_asked_for(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    big = fake.host_file("big.bin", b"x" * 10, size=sl[1].files.max_bytes + 1)
    result = _share(_inbound(sl), fake, "big one", [big])
    assert result is not None and result.message.content == "big one\n📎 big.bin: not taken (larger than 64.0 KiB)"
    assert fake.downloads == []


@pytest.mark.parametrize("content_length", [True, False])
def test_a_server_that_lies_about_the_size_is_cut_off(
    sl: tuple[Database, Settings], fake: FakeSlack, content_length: bool
) -> None:
    # The file object says 10 bytes; 200 KiB come (with a true Content-Length, refused before
    # the body is read; without one, counted as they are stored and stopped past the limit).
    liar = fake.host_file("small.txt", b"y" * 200 * 1024, size=10, content_length=content_length)
    result = _share(_inbound(sl), fake, "tiny file", [liar])
    assert result is not None
    assert result.message.content == "tiny file\n📎 small.txt: not taken (larger than 64.0 KiB)"
    assert len(fake.downloads) == 1 and files_of(result.message.metadata) is None
    assert _stored_files(sl) == [] and _contents(sl) == []  # no row, no bytes, no temporary file


def test_a_redirect_is_followed_on_slacks_hosts_only(
    sl: tuple[Database, Settings], fake: FakeSlack, evil: FakeSlack
) -> None:
    target = fake.host_file("real.txt", b"moved here")
    moved = fake.host_file("moved.txt", b"", redirect=target["url_private"])
    trap = evil.host_file("trap.txt", b"gotcha")
    away = fake.host_file("away.txt", b"", redirect=trap["url_private"])
    result = _share(_inbound(sl), fake, "two", [moved, away])
    assert result is not None
    assert result.message.content == "two\n📎 away.txt: not taken (it was redirected off Slack's hosts)"
    payload = files_of(result.message.metadata)
    assert payload is not None and [f.name for f in payload.files] == ["moved.txt"]
    store = FileStore.from_settings(*sl)
    assert store.read_bytes(store.get(payload.files[0].id)) == b"moved here"
    assert [d.status for d in fake.downloads] == [302, 200, 302] and evil.requests == []


def test_a_slow_download_is_cut_off_at_the_timeout(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    db, settings = sl
    inbound = SlackInbound(db, settings.replace(slack_file_timeout_s=0.5), web=SlackWeb(settings))
    drip = fake.host_file("drip.bin", b"z" * 40 * 1024, drip_s=0.1, content_length=False)  # 4 s in all
    started = time.monotonic()
    result = _share(inbound, fake, "slowly", [drip])
    assert time.monotonic() - started < 2.5
    assert result is not None
    assert result.message.content == "slowly\n📎 drip.bin: not taken (the download took longer than 0.5 s)"
    assert _stored_files(sl) == [] and _contents(sl) == []


def test_a_sign_in_page_or_an_error_is_no_file(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    page = fake.host_file("report.pdf", b"<html>sign in</html>", mimetype="application/pdf", content_type="text/html")
    gone = fake.host_file("gone.txt", b"x")
    gone["url_private_download"] = gone["url_private_download"].replace("gone.txt", "nothing.txt")
    deleted = {**fake.host_file("old.txt", b"x"), "mode": "tombstone"}
    odd = {"id": "F1", "name": "n.txt", "size": "12", "url_private": "x"}  # a size that is no number
    result = _share(_inbound(sl), fake, "files", [page, gone, deleted, odd])
    assert result is not None
    assert result.message.content.splitlines()[1:] == [
        "📎 report.pdf: not taken (Slack answered with a page, not the file (has the app the files:read scope?))",
        "📎 gone.txt: not taken (Slack answered HTTP 404)",
        "📎 old.txt: not taken (it was deleted)",
        "📎 file: not taken (Slack's description of it is not understood)",
    ]
    assert len(fake.downloads) == 2 and _stored_files(sl) == []


def test_without_the_bot_token_slack_sends_the_sign_in_page_elsewhere(
    sl: tuple[Database, Settings], fake: FakeSlack
) -> None:
    db, settings = sl
    inbound = SlackInbound(db, settings.replace(slack_bot_token="xoxb-not-ours"), web=SlackWeb(settings))
    result = _share(inbound, fake, "hm", [fake.host_file("a.txt", b"a")])
    assert result is not None and result.message.content.endswith("(it was redirected off Slack's hosts)")
    assert [(d.token, d.status) for d in fake.downloads] == [("xoxb-not-ours", 302)]


def test_at_most_so_many_files_a_message(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    files = [fake.host_file(f"f{i:02d}.txt", f"file {i}".encode()) for i in range(MAX_FILES_PER_MESSAGE + 2)]
    result = _share(_inbound(sl), fake, "many", files)
    assert result is not None
    payload = files_of(result.message.metadata)
    assert payload is not None and len(payload.files) == MAX_FILES_PER_MESSAGE
    assert len(fake.downloads) == MAX_FILES_PER_MESSAGE
    assert result.message.content == f"many\n📎 2 more files: not taken (at most {MAX_FILES_PER_MESSAGE} a message)"


def test_the_groups_total_and_a_hostile_name(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    db, settings = sl
    inbound = SlackInbound(db, settings.replace(group_files_max_bytes=1500), web=SlackWeb(settings))
    first = fake.host_file("../../.ssh/authorized_keys\u202egnp.txt", b"k" * 1000)
    second = fake.host_file("more.txt", b"m" * 1000)
    result = _share(inbound, fake, "keys", [first, second])
    assert result is not None
    payload = files_of(result.message.metadata)
    assert payload is not None and [f.name for f in payload.files] == ["authorized_keysgnp.txt"]
    assert result.message.content == (
        "keys\n📎 more.txt: not taken (this group's files have no room left under 1.5 KiB)"
    )


def test_a_sender_over_the_rate_downloads_nothing(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    db, settings = sl
    inbound = SlackInbound(db, settings.replace(sender_messages_per_minute=1), web=SlackWeb(settings))
    assert _share(inbound, fake, "one", []) is not None  # a plain message: the sender's one this minute
    assert _share(inbound, fake, "two", [fake.host_file("a.txt", b"a")]) is None
    assert fake.downloads == [] and [m.content for m in get_messages_after(JID, 0, db=db)] == ["one"]
    assert len(fake.calls("chat.postEphemeral")) == 1  # told to slow down, as for any message


def test_a_file_share_through_the_events_api(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    db, settings = sl
    doc = fake.message_event(
        SLACK_CHANNEL, "UANN0001", "via the route", subtype="file_share", files=[fake.host_file("r.txt", b"route")]
    )
    body = json.dumps(doc).encode()
    with TestClient(create_app(Orchestrator(settings))) as client:
        assert client.post(EVENTS_PATH, content=body, headers=signed_headers(SIGNING, body)).json() == {"ok": True}
    [stored] = get_messages_after(JID, 0, db=db)
    payload = files_of(stored.metadata)
    assert stored.content == "via the route" and payload is not None and payload.files[0].name == "r.txt"


def test_slacks_hosts_come_from_the_api_base() -> None:
    assert slack_origins("https://slack.com/api/") == {("https", "slack.com", 443), ("https", "files.slack.com", 443)}
    assert slack_origins("http://127.0.0.1:8123/api/") == {("http", "127.0.0.1", 8123)}
    assert slack_origins("https://[::1]:9000/api/") == {("https", "::1", 9000)}  # no files. of an address
    assert origin_of("https://FILES.slack.com./files-pri/T-F/x") == ("https", "files.slack.com", 443)
    for bad in (
        "https://user@files.slack.com/x",
        "https://files.slack.com\\@evil.com/x",
        "https://files.slack.com/a b",
        "https://files.slack.com/\nx",
        "ftp://files.slack.com/x",
        "//files.slack.com/x",
        "/files-pri/x",
        "https://files.slack.com:99999/x",
    ):
        assert origin_of(bad) is None, bad


# -- files out ------------------------------------------------------------------------------


@pytest.fixture
def channel(sl: tuple[Database, Settings]) -> Iterator[SlackChannel]:
    ch = SlackChannel(sl[1], db=sl[0])
    yield ch
    ch.disconnect()


def _threaded_reply(sl: tuple[Database, Settings], files: list[StoredFile], caption: str = "here they are") -> int:
    """A person's message in a Slack thread, and the agent's reply carrying ``files``."""
    db, settings = sl
    asked = ingest(
        db,
        settings,
        IncomingMessage(
            chat_jid=JID,
            sender="slack:UANN0001",
            sender_name="Ann",
            content="@Robo the files please",
            channel="slack",
            metadata={"slack_channel": SLACK_CHANNEL, "slack_ts": "1700000005.000200", "slack_thread_ts": THREAD_TS},
        ),
        signal=None,
        wake=False,
    ).message.seq
    reply = IncomingMessage(
        chat_jid=JID,
        sender="bot",
        sender_name="Robo",
        content=caption,
        is_from_me=True,
        message_type="assistant",
        metadata=file_envelope(files, extras={REPLY_TO_KEY: asked, RUN_ID_KEY: "r1", "via": "send_file"}),
    )
    return ingest(db, settings, reply, signal=None, wake=False).message.seq


def _due_now(db: Database, seq: int) -> None:
    with db.write() as session:
        session.execute(update(DeliveryRow).where(DeliveryRow.message_seq == seq).values(next_attempt_at=utc_now()))


def test_a_reply_with_two_files_is_posted_then_uploaded_in_its_thread(
    sl: tuple[Database, Settings], fake: FakeSlack, channel: SlackChannel
) -> None:
    db, settings = sl
    store = FileStore.from_settings(db, settings)
    report = store.store_bytes(JID, b"quarterly numbers\n", "report.txt")
    chart = store.store_bytes(JID, PNG, "chart.png")
    seq = _threaded_reply(sl, [report, chart])
    assert Deliverer(db, settings, ChannelRegistry([channel])).deliver_due().sent == 1
    [post] = fake.live_posts(SLACK_CHANNEL)
    assert post.thread_ts == THREAD_TS and [b["text"]["text"] for b in post.blocks] == ["here they are"]
    shared = fake.shared(SLACK_CHANNEL)
    assert [(u.filename, u.title, u.data, u.thread_ts) for u in shared] == [
        ("report.txt", "report.txt", b"quarterly numbers\n", THREAD_TS),
        ("chart.png", "chart.png", PNG, THREAD_TS),
    ]
    # The real request shapes: a form, as slack_sdk sends one (length a decimal string; files
    # a JSON array of {id, title}), the bytes raw to the upload URL, with no token there.
    asks = fake.calls("files.getUploadURLExternal")
    assert [c.params for c in asks] == [
        {"filename": "report.txt", "length": "18"},
        {"filename": "chart.png", "length": str(len(PNG))},
    ]
    assert all(c.token == fake.bot_token for c in asks)
    done = fake.calls("files.completeUploadExternal")
    assert [json.loads(c.params["files"]) for c in done] == [
        [{"id": shared[0].file_id, "title": "report.txt"}],
        [{"id": shared[1].file_id, "title": "chart.png"}],
    ]
    assert all(c.params["channel_id"] == SLACK_CHANNEL and c.params["thread_ts"] == THREAD_TS for c in done)
    assert [(r.token, r.status) for r in fake.calls("upload")] == [("", 200), ("", 200)]
    [row] = list_deliveries(db, message_seq=seq)
    assert (row.state, row.attempts) == ("sent", 1)
    assert row.sent_ids == [post.ts, *(f"file:{u.file_id}" for u in shared)]  # what a retraction takes back


@pytest.mark.parametrize("failing", ["upload", "files.completeUploadExternal", "files.getUploadURLExternal"])
def test_a_retry_after_a_failure_in_the_middle_uploads_only_the_missing_file(
    sl: tuple[Database, Settings], fake: FakeSlack, channel: SlackChannel, failing: str
) -> None:
    db, settings = sl
    store = FileStore.from_settings(db, settings)
    first = store.store_bytes(JID, b"first file", "one.txt")
    second = store.store_bytes(JID, b"second file", "two.txt")
    seq = _threaded_reply(sl, [first, second])
    fake.fail(failing, 500, after=1)  # the first file goes; the second one's step fails
    deliverer = Deliverer(db, settings, ChannelRegistry([channel]))
    assert deliverer.deliver_due().sent == 0
    assert [u.data for u in fake.shared()] == [b"first file"]
    _due_now(db, seq)
    assert deliverer.deliver_due().sent == 1
    assert [(u.filename, u.data, u.thread_ts) for u in fake.shared()] == [
        ("one.txt", b"first file", THREAD_TS),
        ("two.txt", b"second file", THREAD_TS),
    ]
    assert len(fake.live_posts()) == 1  # the words once
    asked = [c.params["filename"] for c in fake.calls("files.getUploadURLExternal")]
    assert asked == ["one.txt", "two.txt", "two.txt"]  # the first file was not asked for again
    [row] = list_deliveries(db, message_seq=seq)
    assert (row.state, row.attempts) == ("sent", 2)


def test_an_upload_url_off_slacks_hosts_gets_no_bytes(
    sl: tuple[Database, Settings], fake: FakeSlack, evil: FakeSlack, channel: SlackChannel
) -> None:
    db, settings = sl
    secret = FileStore.from_settings(db, settings).store_bytes(JID, b"do not leak", "secret.txt")
    seq = _threaded_reply(sl, [secret])
    fake.upload_base = f"{evil.root}/upload/v1/"
    assert Deliverer(db, settings, ChannelRegistry([channel])).deliver_due().sent == 0
    assert evil.requests == [] and fake.calls("upload") == [] and fake.shared() == []
    [row] = list_deliveries(db, message_seq=seq)
    assert row.state == "pending" and "upload_url that is not on Slack's hosts" in (row.last_error or "")


def test_only_the_messages_own_chats_files_are_read(
    sl: tuple[Database, Settings], fake: FakeSlack, channel: SlackChannel
) -> None:
    db, settings = sl
    store = FileStore.from_settings(db, settings)
    add_group(db, chat_jid="other@chat", name="Other", folder="other")
    theirs = store.store_bytes("other@chat", b"the other group's secret", "theirs.txt")
    empty = store.store_bytes(JID, b"", "empty.txt")
    forged = RenderedMessage(
        text="look",
        chat_jid=JID,
        seq=99,
        id="forged",
        message_type="assistant",
        sender="bot",
        sender_name="Robo",
        content="look",
        metadata=file_envelope([empty, theirs]),
    )
    with pytest.raises(ChannelError, match=f"file {theirs.id} of {JID} cannot be read"):
        channel.send(SLACK_CHANNEL, forged)
    # The words went, the empty file was passed over (Slack takes no file of 0 bytes), and
    # nothing of the other chat's file was asked for or sent.
    assert len(fake.live_posts()) == 1 and fake.calls("files.getUploadURLExternal") == []
    assert fake.calls("upload") == []
