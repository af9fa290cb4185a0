"""Push wake-ups of the embedded broker (orchestrator/run/fs_transport.py).

A consumer idle in ``drain_events`` must hear of a message as soon as its
file appears.  The polls that could also find it are set to a minute here
(kombu's ``polling_interval`` and the transport's safety look), so a
message consumed within the test's seconds was woken for, not polled for.
The producer is another process, as the API or the CLI is for a worker.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu import Connection, Consumer, Exchange, Queue

from orchestrator.core.settings import Settings
from orchestrator.run import fs_transport
from orchestrator.run.queue import make_celery

TRANSPORT = "orchestrator.run.fs_transport:Transport"
NEVER_S = 60.0  # a poll this slow cannot deliver within the test
CTX = mp.get_context("spawn")


def _options(folder: Path, wakeup: str, poll_s: float = NEVER_S) -> dict[str, Any]:
    return {
        "data_folder_in": str(folder / "out"),
        "data_folder_out": str(folder / "out"),
        "control_folder": str(folder / "control"),
        "store_processed": False,
        "polling_interval": poll_s,
        "safety_poll_interval": NEVER_S,
        "wakeup": wakeup,
    }


def _connection(folder: Path, wakeup: str, transport: Any = TRANSPORT, poll_s: float = NEVER_S) -> Connection:
    return Connection("filesystem://", transport=transport, transport_options=_options(folder, wakeup, poll_s))


def _publish(folder: str, body: str, delay_s: float) -> None:
    time.sleep(delay_s)
    with _connection(Path(folder), "inotify") as conn:
        _publish_on(conn, _name(Path(folder)), body)


def _publish_on(conn: Connection, name: str, body: str) -> None:
    conn.Producer().publish({"body": body}, exchange=Exchange(name), routing_key=name)


def _name(folder: Path) -> str:
    # A queue of its own per test: kombu's filesystem transport keeps the
    # bindings it has made in a process-wide state and does not write a
    # binding again that it believes made, even into another folder.
    return f"agent-{folder.name}"


def _queue(folder: Path) -> Queue:
    name = _name(folder)
    return Queue(name, Exchange(name), routing_key=name)


def _consume(conn: Connection, folder: Path, timeout_s: float) -> list[str]:
    """What ``drain_events`` delivers within ``timeout_s`` (one call: an idle consumer's wait)."""
    got: list[str] = []
    with Consumer(
        conn, [_queue(folder)], callbacks=[lambda body, msg: (got.append(body["body"]), msg.ack())], accept=["json"]
    ):
        try:
            conn.drain_events(timeout=timeout_s)
        except TimeoutError:
            pass
    return got


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "out").mkdir()
    return tmp_path


def test_an_idle_consumer_is_woken_by_a_message_from_another_process(folder: Path) -> None:
    with _connection(folder, "inotify") as conn:
        _queue(folder)(conn.default_channel).declare()
        producer = CTX.Process(target=_publish, args=(str(folder), "hello", 1.0))
        producer.start()
        t0 = time.monotonic()
        got = _consume(conn, folder, timeout_s=20)
        waited = time.monotonic() - t0
        producer.join(30)
    assert got == ["hello"]
    # Woken, not polled: both polls are a minute and the wait ended long before.
    assert waited < NEVER_S / 2


def test_a_message_between_the_look_and_the_wait_is_not_lost(folder: Path) -> None:
    """The window of a lost wake-up: the folder is looked at (empty), the message
    lands, then the consumer waits.  The watch made before the look has
    queued the event, so the wait returns at once."""
    publisher = _connection(folder, "inotify")

    class LateChannel(fs_transport.Channel):
        published = False

        def _get(self, queue: str) -> Any:
            try:
                return super()._get(queue)
            except Empty:
                if not LateChannel.published and queue == _name(folder):
                    LateChannel.published = True  # right after the look found nothing
                    _publish_on(publisher, queue, "late")
                raise

    class LateTransport(fs_transport.Transport):
        Channel = LateChannel

    with publisher, _connection(folder, "inotify", transport=LateTransport) as conn:
        _queue(folder)(conn.default_channel).declare()
        got = _consume(conn, folder, timeout_s=20)
    assert LateChannel.published
    assert got == ["late"]


def test_a_file_still_being_written_wakes_no_look(folder: Path) -> None:
    """Our writers write a message under a ``.partial`` name and rename it into view: its
    close wakes the watch, but the consumer waits for the rename instead of listing the
    folder for nothing (each look lists it once per queue)."""
    looks: list[str] = []

    class CountingChannel(fs_transport.Channel):
        def _get(self, queue: str) -> Any:
            looks.append(queue)
            return super()._get(queue)

    class CountingTransport(fs_transport.Transport):
        Channel = CountingChannel

    def write_then_publish() -> None:
        time.sleep(0.5)
        (folder / "out" / f"1_x.{_name(folder)}.msg.partial").write_bytes(b"{}")  # closed, never renamed
        time.sleep(0.5)
        with _connection(folder, "inotify") as publisher:
            _publish_on(publisher, _name(folder), "renamed")

    with _connection(folder, "inotify", transport=CountingTransport) as conn:
        _queue(folder)(conn.default_channel).declare()
        writer = threading.Thread(target=write_then_publish)
        writer.start()
        got = _consume(conn, folder, timeout_s=20)
        writer.join(30)
    assert got == ["renamed"]
    # The first look (nothing yet) and the one the rename woke: none for either partial file.
    assert looks == [_name(folder)] * 2


def test_poll_mode_still_delivers_and_makes_no_watch(folder: Path) -> None:
    """ORCHESTRATOR_BROKER_WAKEUP=poll (and a platform without inotify): kombu's polling."""
    with _connection(folder, "poll", poll_s=0.05) as conn:
        _queue(folder)(conn.default_channel).declare()
        producer = CTX.Process(target=_publish, args=(str(folder), "polled", 0.5))
        producer.start()
        got = _consume(conn, folder, timeout_s=20)
        producer.join(30)
        assert conn.transport._watch is None
    assert got == ["polled"]


def test_the_watch_is_made_anew_when_the_folder_is_replaced(folder: Path) -> None:
    """A watch whose folder went away (IN_IGNORED) is dropped and made on the new folder."""
    with _connection(folder, "inotify") as conn:
        _queue(folder)(conn.default_channel).declare()
        assert _consume(conn, folder, timeout_s=0.2) == []
        first = conn.transport._watch
        assert first is not None
        (folder / "out").rename(folder / "old")
        (folder / "old").rmdir()
        (folder / "out").mkdir()
        stop = threading.Event()

        def publish_later() -> None:
            stop.wait(1.0)
            _publish(str(folder), "after", 0)

        t = threading.Thread(target=publish_later)
        t.start()
        got: list[str] = []
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            got = _consume(conn, folder, timeout_s=2)
        t.join()
        assert conn.transport._watch is not first
    assert got == ["after"]


def test_the_setting_reaches_the_transport(tmp_path: Path) -> None:
    for mode in ("inotify", "poll"):
        settings = Settings.load(data_dir=tmp_path / mode, broker_wakeup=mode, env_file=None)
        app = make_celery(settings)
        assert app.conf.broker_transport_options["wakeup"] == mode
        with app.connection_for_read() as conn:
            assert conn.transport._wakeup == mode
