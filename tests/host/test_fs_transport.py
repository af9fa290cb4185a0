"""The embedded broker's transport under concurrent processes (orchestrator/run/fs_transport.py).

Both tests race real processes on one broker folder, the way a worker,
Flower and the API share it; kombu's own filesystem transport fails them
(a binding table holding one JSON document plus the tail of another; a
consumer reading a message file its producer has not finished).
"""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path
from queue import Empty

from kombu import Connection

TRANSPORT = "orchestrator.run.fs_transport:Transport"
PROCESSES = 6
CTX = mp.get_context("spawn")


def _connection(folder: Path, transport: str = TRANSPORT) -> Connection:
    return Connection(
        "filesystem://",
        transport=transport,
        transport_options={
            "data_folder_in": str(folder / "out"),
            "data_folder_out": str(folder / "out"),
            "control_folder": str(folder / "control"),
            "store_processed": False,
        },
    )


def _bind_many(folder: str, who: int, rounds: int, transport: str, barrier) -> None:  # type: ignore[no-untyped-def]
    # Every round binds to a new exchange, all processes at once: its table
    # is created concurrently, the moment kombu's "wb" open truncates
    # under another process's rewrite.
    with _connection(Path(folder), transport) as conn:
        channel = conn.default_channel
        for r in range(rounds):
            barrier.wait(timeout=60)
            channel._queue_bind(f"reply{r}", f"rk{who}", "", f"q{who}")


def _put_many(folder: str, n: int, transport: str) -> None:
    with _connection(Path(folder), transport) as conn:
        channel = conn.default_channel
        for i in range(n):
            channel._put("agent", {"i": i, "pad": "x" * 200_000})


def _race(target, args_for) -> list:  # type: ignore[no-untyped-def,type-arg]
    procs = [CTX.Process(target=target, args=args_for(k)) for k in range(PROCESSES)]
    for p in procs:
        p.start()
    return procs


ROUNDS = 30


def bindings_race(tmp_path: Path, transport: str = TRANSPORT) -> list[set[str]]:
    """Each exchange's bound queues after the race (every process bound one to each)."""
    (tmp_path / "out").mkdir()
    barrier = CTX.Barrier(PROCESSES)
    procs = _race(_bind_many, lambda k: (str(tmp_path), k, ROUNDS, transport, barrier))
    for p in procs:
        p.join(120)
        assert p.exitcode == 0, "a binding process failed"
    with _connection(tmp_path, transport) as conn:
        return [{q.queue for q in conn.default_channel.get_table(f"reply{r}")} for r in range(ROUNDS)]


def test_concurrent_bindings_keep_one_whole_table(tmp_path: Path) -> None:
    tables = bindings_race(tmp_path)  # raises if a table does not parse
    assert tables == [{f"q{who}" for who in range(PROCESSES)}] * ROUNDS


def messages_race(tmp_path: Path, transport: str = TRANSPORT) -> list[int]:
    (tmp_path / "out").mkdir()
    procs = _race(_put_many, lambda k: (str(tmp_path), 10, transport))
    got: list[int] = []
    with _connection(tmp_path, transport) as conn:
        channel = conn.default_channel
        while True:
            try:
                got.append(channel._get("agent")["i"])  # raises on half a document
            except Empty:
                if not any(p.is_alive() for p in procs) and not list((tmp_path / "out").glob("*.msg")):
                    break
    for p in procs:
        p.join(120)
        assert p.exitcode == 0, "a producer failed"
    return got


def test_a_consumer_never_reads_a_message_being_written(tmp_path: Path) -> None:
    got = messages_race(tmp_path)
    assert sorted(got) == sorted(i for _ in range(PROCESSES) for i in range(10))
