"""Bounded, linear reading of a run's output (orchestrator/sandbox/bounded_io.py), and
the linear rendering and splitting of what it stores (outputs, render, telegram).

No wall-clock assertions: linear work is checked by counting the work done
(bytes scanned, units measured, diff cells) and memory by the buffers' peaks.
"""

from __future__ import annotations

import difflib
import random
from typing import Any

import pytest

from agent_runner.protocol import ToolResultEvent
from orchestrator.channels import telegram
from orchestrator.channels.telegram import split_text
from orchestrator.core.errors import OutputLimitExceeded
from orchestrator.core.settings import Settings
from orchestrator.model import render
from orchestrator.model.envelopes import build_structured_envelope
from orchestrator.model.messages import StoredMessage
from orchestrator.run.outputs import cap_output, event_to_message, stored_size
from orchestrator.sandbox.bounded_io import LineReader, OutputBudget, TailBuffer, read_lines

# -- LineReader ------------------------------------------------------------------------


def _feed_all(reader: LineReader, chunks: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for chunk in chunks:
        out.extend(reader.feed(chunk))
    return out


def test_lines_across_every_chunk_boundary() -> None:
    stream = b"one\ntwo\n\nthree and more\nx\n" + "ünï\n".encode() + b"tail"
    want = stream.split(b"\n")
    for cut in range(len(stream) + 1):
        for second in range(cut, len(stream) + 1):
            reader = LineReader(64)
            got = _feed_all(reader, [stream[:cut], stream[cut:second], stream[second:]])
            assert got == want[:-1], (cut, second)
            assert reader.rest() == b"tail"


def test_byte_by_byte_scans_each_byte_once() -> None:
    # 200 lines of 1..199 bytes fed one byte at a time: the old `buf.split`
    # loop rescanned the partial line at every byte.
    lines = [bytes([97 + i % 26]) * (i % 199 + 1) for i in range(200)]
    stream = b"\n".join(lines) + b"\n"
    reader = LineReader(200)
    got = _feed_all(reader, [stream[i : i + 1] for i in range(len(stream))])
    assert got == lines
    assert reader.scanned == len(stream)  # every byte looked at exactly once
    assert reader.peak_buffered <= 200


def test_many_lines_in_one_chunk() -> None:
    stream = b"".join(b"%d\n" % i for i in range(100_000))
    reader = LineReader(16)
    got = reader.feed(stream)
    assert len(got) == 100_000 and got[0] == b"0" and got[-1] == b"99999"
    assert reader.scanned == len(stream) and reader.buffered == 0


def test_a_line_of_exactly_the_maximum_passes() -> None:
    reader = LineReader(10)
    assert reader.feed(b"x" * 10) == []
    assert reader.feed(b"\n") == [b"x" * 10]


@pytest.mark.parametrize("chunk", [1, 7, 4096, 65536])
def test_a_long_line_is_never_accumulated(chunk: int) -> None:
    # An endless line in chunks: the reader gives up once it passes the
    # maximum, holding at most max + one chunk.
    reader = LineReader(100_000)
    block = b"a" * chunk
    fed = 0
    with pytest.raises(OutputLimitExceeded) as info:
        for _ in range(10_000_000):
            reader.feed(block)
            fed += chunk
    assert info.value.setting == "max_event_line_bytes" and info.value.limit == 100_000
    assert "100000" in str(info.value) and "ORCHESTRATOR_MAX_EVENT_LINE_BYTES" in str(info.value)
    assert fed <= 100_000 + chunk
    assert reader.peak_buffered <= 100_000 + chunk
    assert reader.buffered == 0  # dropped, not kept


def test_a_long_complete_line_inside_one_chunk_is_refused() -> None:
    reader = LineReader(10)
    with pytest.raises(OutputLimitExceeded):
        reader.feed(b"ok\n" + b"y" * 11 + b"\nafter\n")


def test_read_lines_yields_the_unterminated_last_line_and_raises_on_overflow() -> None:
    assert list(read_lines([b"a\nb", b"c\n", b"  \n", b"end"], 10)) == [b"a", b"bc", b"  ", b"end"]
    assert list(read_lines([b"a\n", b"   "], 10)) == [b"a"]  # a blank rest is dropped
    got: list[bytes] = []
    with pytest.raises(OutputLimitExceeded):
        for line in read_lines(iter([b"fine\n", b"z" * 50]), 10):
            got.append(line)
    assert got == [b"fine"]


# -- TailBuffer ------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 1000, 4096, 65536, 200_000])
def test_tail_keeps_only_the_end(size: int) -> None:
    tail = TailBuffer(64 * 1024)
    rng = random.Random(size)
    written = bytearray()
    total = 0
    target = max(3 * 64 * 1024, min(8 * 1024 * 1024, size * 4000))
    while total < target:
        chunk = bytes([rng.randrange(256)]) * rng.randrange(1, size + 1)
        tail.write(chunk)
        total += len(chunk)
        if total > target - 2 * 64 * 1024:  # keep the reference small: only the last part matters
            written += chunk
        assert tail.peak_buffered < 2 * 64 * 1024
    assert tail.total == total
    assert tail.getvalue() == bytes(written[-64 * 1024 :])
    assert tail.dropped == total - 64 * 1024


def test_tail_of_a_short_stream_is_all_of_it() -> None:
    tail = TailBuffer(100)
    tail.write(b"hello ")
    tail.write("wörld".encode())
    assert tail.text() == "hello wörld" and tail.dropped == 0


def test_tail_text_survives_a_cut_character() -> None:
    tail = TailBuffer(3)
    tail.write("aé€".encode())  # the tail cuts into the middle of é
    assert tail.text().endswith("€") and len(tail.getvalue()) == 3


# -- OutputBudget ----------------------------------------------------------------------


def test_budget_counts_lines_and_stored_bytes() -> None:
    budget = OutputBudget(max_lines=3, max_stored_bytes=100)
    for _ in range(3):
        budget.line()
    with pytest.raises(OutputLimitExceeded) as info:
        budget.line()
    assert info.value.setting == "max_run_events" and "more than 3 output lines" in str(info.value)
    budget.store(60)
    with pytest.raises(OutputLimitExceeded) as info:
        budget.store(41)
    assert info.value.setting == "max_run_stored_bytes" and budget.stored_bytes == 60  # nothing counted
    budget.store(40)
    assert budget.stored_bytes == 100


def test_settings_defaults() -> None:
    s = Settings.load(env_file=None)
    assert s.runs.max_event_line_bytes == 1024 * 1024
    assert s.runs.max_run_events == 2000
    assert s.runs.max_run_stored_bytes == 16 * 1024 * 1024
    assert s.runs.max_tool_result_bytes == 256 * 1024


# -- outputs: a tool result's stored size ----------------------------------------------


def _result(output: str, envelope: dict[str, Any] | None = None) -> ToolResultEvent:
    return ToolResultEvent(tool_use_id="t1", name="bash", output=output, exit_code=0, envelope=envelope)


def test_a_long_tool_result_is_cut_with_a_marker_and_its_size_kept() -> None:
    out = event_to_message(_result("é" * 10_000), run_id="r", index=1, assistant_name="A", max_tool_result_bytes=1000)
    assert out is not None and out.metadata is not None
    kept, marker = out.content.split("\n[", 1)
    assert kept == "é" * 500 and "truncated by the host" in marker and "1000 of 20000 bytes" in marker
    assert out.metadata["output_bytes"] == 20_000 and out.metadata["output_truncated"] is True
    assert stored_size(out) < 1200
    short = event_to_message(_result("ok"), run_id="r", index=2, assistant_name="A", max_tool_result_bytes=1000)
    assert short is not None and short.content == "ok" and short.metadata is not None
    assert "output_bytes" not in short.metadata
    assert cap_output("x" * 5000, None) == ("x" * 5000, None)


def test_an_oversized_envelope_is_dropped_with_the_reason() -> None:
    env = {
        "message_type": "TOOL_CALL",
        "version": 1,
        "payload": {"tool_name": "bash", "input": {"command": "x"}, "output": "o" * 5000},
    }
    out = event_to_message(_result("o" * 10, env), run_id="r", index=1, assistant_name="A", max_tool_result_bytes=1000)
    assert out is not None and out.metadata is not None
    assert "message_type" not in out.metadata and "over the host's 1000-byte limit" in out.metadata["envelope_dropped"]
    kept = event_to_message(
        _result("o" * 10, env), run_id="r", index=1, assistant_name="A", max_tool_result_bytes=100_000
    )
    assert kept is not None and kept.metadata is not None and kept.metadata["message_type"] == "TOOL_CALL"


# -- channels: render and split in linear time -----------------------------------------


def test_split_of_a_10_mb_reply_measures_each_part_a_bounded_number_of_times(monkeypatch: pytest.MonkeyPatch) -> None:
    measured = 0
    units = telegram._units

    def counting(text: str) -> int:
        nonlocal measured
        measured += len(text)
        return units(text)

    monkeypatch.setattr(telegram, "_units", counting)
    rng = random.Random(1)
    pieces = [rng.choice(["line of text ", "😀", "\n", "ü" * 50, "x" * 5000]) for _ in range(60_000)]
    text = "".join(pieces)
    while len(text) < 10_000_000:
        text += text
    parts = split_text(text)
    assert "".join(parts) == text
    assert all(units(p) <= telegram.TEXT_LIMIT for p in parts)
    # Quadratic splitting measured the whole rest once per part (~ n²/4096).
    assert measured <= 20 * len(text)


def test_split_cuts_after_a_late_line_break() -> None:
    text = "a" * 3000 + "\n" + "b" * 3000
    assert split_text(text) == ["a" * 3000 + "\n", "b" * 3000]
    early = "a" * 100 + "\n" + "b" * 5000  # a break in the first half is ignored
    assert split_text(early) == [early[:4096], early[4096:]]


def _edit(old: str | None, new: str | None) -> StoredMessage:
    meta = build_structured_envelope(
        "CODE_EDIT",
        {"edits": [{"file_path": "f.txt", "old_content": old, "new_content": new}]},
        extras={"exit_code": 0},
    )
    return StoredMessage(
        seq=1,
        id="m",
        chat_jid="c",
        sender="command_output",
        sender_name="edit_file",
        content="",
        timestamp="2026-11-27T10:00:00+00:00",
        is_from_me=True,
        message_type="tool_result",
        metadata=meta,
    )


def test_a_huge_adversarial_edit_is_summarised_not_diffed(monkeypatch: pytest.MonkeyPatch) -> None:
    cells: list[int] = []
    real = difflib.unified_diff

    def counting(a: list[str], b: list[str], *args: Any, **kw: Any) -> Any:
        cells.append(len(a) * len(b))
        return real(a, b, *args, **kw)

    monkeypatch.setattr(render.difflib, "unified_diff", counting)
    n = 100_000  # interleaved lines: difflib's worst case (minutes at this size)
    old = "".join(f"l{i}\n" for i in range(n))
    new = "".join(f"m{i}\n" if i % 2 else f"l{i}\n" for i in range(n))
    text = render.render_text(_edit(old, new), "Andy")
    assert "too large a change to show as a diff" in text and f"of {n}" in text
    assert all(c <= render.DIFF_MAX_CELLS for c in cells)


@pytest.mark.parametrize("seed", range(40))
def test_an_edit_is_the_same_diff_as_before(seed: int) -> None:
    # Edits within a window of a big file (as edit_file makes), or anywhere
    # in a file of up to 900 lines: the diff is exactly difflib's of the whole.
    rng = random.Random(seed)
    big = seed % 2 == 0
    old = [f"line {i}" for i in range(rng.randrange(0, 5000 if big else 900))]
    new = list(old)
    window = rng.randrange(0, len(old) + 1)
    for _ in range(rng.randrange(1, 4)):
        at = min(len(new), window + rng.randrange(0, 40)) if big else rng.randrange(0, len(new) + 1)
        op = rng.choice(["insert", "delete", "change"])
        if op == "insert" or not new or at == len(new):
            new.insert(at, f"new {rng.random()}")
        elif op == "delete":
            del new[at]
        else:
            new[at] = f"changed {rng.random()}"
    old_text, new_text = "".join(x + "\n" for x in old), "".join(x + "\n" for x in new)
    got = render.render_text(_edit(old_text, new_text), "Andy").split("\n", 1)[1]
    want = "\n".join(difflib.unified_diff(old, new, "a/f.txt", "b/f.txt", lineterm=""))
    assert got == (want or "--- a/f.txt\n+++ b/f.txt\n(no changes)")


def test_render_of_a_10_mb_reply_is_the_text() -> None:
    big = "word " * 2_000_000
    msg = StoredMessage(
        seq=1,
        id="m",
        chat_jid="c",
        sender="bot",
        sender_name="Andy",
        content=big,
        timestamp="2026-11-27T10:00:00+00:00",
        is_from_me=True,
        message_type="assistant",
    )
    assert render.render_text(msg, "Andy") == "Andy: " + big
