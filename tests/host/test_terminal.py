"""Text from outside reaches no terminal and no log raw (issue 29, security review):
``orchestrator history``, ``send --wait``, ``chat`` and the log channel show a
sender's, the agent's or a tool's control characters as escapes
(orchestrator/core/terminal.py), and their ``--json`` outputs are ASCII JSON.

The commands are the real ``orchestrator`` executable, on both databases.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.channels.base import LogChannel
from orchestrator.core.logs import text_formatter
from orchestrator.core.settings import Settings
from orchestrator.core.terminal import for_log, for_terminal
from orchestrator.model.envelopes import build_structured_envelope
from orchestrator.model.render import RenderedMessage
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import get_messages_after, store_message_direct
from orchestrator.store.runs import create_run, finish_run
from tests.conftest import TEST_ENV, wait_until

CLI = str(Path(sys.executable).parent / "orchestrator")
JID = "term@local"
# A clipboard write (OSC 52), a line erased and the cursor sent back, a hyperlink (OSC 8),
# a C1 CSI, a right-to-left override, DEL.
CLIPBOARD = "\x1b]52;c;ZXZpbA==\x07"
ERASE = "\x1b[2K\r"
LINK = "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\"
HOSTILE = f"hello {CLIPBOARD}{ERASE}forged line\n2026-01-01 INFO fake {LINK} \x9b31m \u202eevil\u202c \x7f end"
RAW = ("\x1b", "\x07", "\r", "\x9b", "\u202e", "\u202c", "\x7f")


def _raw_in(text: str) -> list[str]:
    return [c for c in RAW if c in text]


def _env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")} | TEST_ENV
    return env | {
        "ORCHESTRATOR_DATA_DIR": str(settings.data_dir),
        "ORCHESTRATOR_DATABASE_URL": settings.database_url,
        "ORCHESTRATOR_LOG_LEVEL": "WARNING",
    }


def _cli(settings: Settings, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [CLI, *args],
        env=_env(settings),
        capture_output=True,
        timeout=120,
        input=None if stdin is None else stdin.encode(),
    )


def _fill(db: Database) -> None:
    """A person, the agent and two tools (a command's output, an edit of a file with a hostile name), all hostile."""
    add_group(db, chat_jid=JID, name="Term", folder="term", requires_trigger=False)
    ts = iter(f"2026-11-27T09:00:{i:02d}+00:00" for i in range(60))

    def put(mid: str, **kw: object) -> None:
        base = dict(sender="eve", sender_name=f"Eve{CLIPBOARD}", content=HOSTILE, is_from_me=False, message_type="user")
        store_message_direct(db=db, id=mid, chat_jid=JID, timestamp=next(ts), **{**base, **kw})

    put("u1")
    put("r1", sender="bot", sender_name="Andy", is_from_me=True, message_type="assistant")
    put(
        "b1",
        sender="command_output",
        sender_name=f"bash{ERASE}",
        is_from_me=True,
        message_type="tool_result",
        metadata=build_structured_envelope(
            "TOOL_CALL",
            {"tool_name": "bash", "input": {"command": HOSTILE}, "output": HOSTILE},
            extras={"exit_code": 0},
        ),
    )
    put(
        "e1",
        sender="command_output",
        sender_name="edit_file",
        is_from_me=True,
        message_type="tool_result",
        content="",
        metadata=build_structured_envelope(
            "CODE_EDIT",
            {"edits": [{"file_path": f"a{LINK}.py", "old_content": "x\n", "new_content": f"{HOSTILE}\n"}]},
            extras={"exit_code": 0},
        ),
    )


# -- the rule ---------------------------------------------------------------------------


def test_control_characters_are_shown_as_escapes() -> None:
    shown = for_terminal(HOSTILE)
    assert _raw_in(shown) == []
    assert "\\x1b]52;c;ZXZpbA==\\x07" in shown and "\\x1b[2K\\r" in shown
    assert "\\x9b31m" in shown and "\\u202eevil\\u202c" in shown and "\\x7f" in shown
    assert "forged line\n2026" in shown  # a terminal shows a multi-line message as such
    assert for_terminal("tab\there, é ✓ 漢字 \u200d") == "tab\there, é ✓ 漢字 \u200d"
    assert for_terminal(shown) == shown  # twice is once
    # One log record, one line: newlines, carriage returns, tabs and U+2028/9 escaped too.
    logged = for_log(HOSTILE + "\ta\u2028b")
    assert _raw_in(logged) == [] and "\n" not in logged and "\t" not in logged and "\u2028" not in logged
    assert "forged line\\n2026" in logged and "\\t" in logged and "\\u2028" in logged
    assert for_log(logged) == logged


# -- the commands -----------------------------------------------------------------------


def test_history_prints_no_raw_control_characters(db: Database, settings: Settings) -> None:
    _fill(db)
    shown = _cli(settings, "history", JID)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout.decode()
    assert _raw_in(out) == [], out
    assert out.count("\\x1b]52;c;ZXZpbA==\\x07") >= 3 and "\\x1b[2K\\r" in out and "\\u202e" in out
    assert "a\\x1b]8;;https://evil.example/" in out  # the edited file's name
    # --json: ASCII JSON (C0, C1, bidi and DEL as \u escapes) that gives back the stored text.
    as_json = _cli(settings, "history", JID, "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert as_json.stdout.isascii() and b"\\u001b" in as_json.stdout and b"\\u202e" in as_json.stdout
    assert [m["content"] for m in json.loads(as_json.stdout)][:2] == [HOSTILE, HOSTILE]


def test_export_to_the_terminal_prints_no_raw_control_characters(db: Database, settings: Settings) -> None:
    _fill(db)
    md = _cli(settings, "export", JID)
    assert md.returncode == 0, md.stderr
    assert _raw_in(md.stdout.decode()) == [] and "\\x1b]52;c;ZXZpbA==\\x07" in md.stdout.decode()
    doc = _cli(settings, "export", JID, "--format", "json")
    assert doc.returncode == 0 and doc.stdout.isascii(), doc.stderr
    assert json.loads(doc.stdout)["messages"][0]["content"] == HOSTILE  # still lossless


def _send_waiting(settings: Settings, db: Database, *extra: str) -> subprocess.CompletedProcess[bytes]:
    """``send --wait``, stored in process; the test stands in for the worker: it stores the
    run's hostile replies after the message and ends the run."""
    before = len(get_messages_after(JID, 0, db=db))
    proc = subprocess.Popen(
        [CLI, "send", JID, "hi", "--wait", "60", *extra],
        env=_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(lambda: len(get_messages_after(JID, 0, db=db)) > before, 60, "the message to be stored")
        sent = get_messages_after(JID, 0, db=db)[-1]
        now = datetime.now(UTC).isoformat()
        store_message_direct(
            db=db,
            id=f"reply-{sent.seq}",
            chat_jid=JID,
            sender="bot",
            sender_name="Andy",
            content=HOSTILE,
            timestamp=now,
            is_from_me=True,
            message_type="assistant",
        )
        store_message_direct(
            db=db,
            id=f"tool-{sent.seq}",
            chat_jid=JID,
            sender="command_output",
            sender_name=f"bash{ERASE}",
            content=HOSTILE,
            timestamp=now,
            is_from_me=True,
            message_type="tool_result",
            metadata={"exit_code": 0},
        )
        run = create_run(db, chat_jid=JID, cursor_from=sent.seq - 1, cursor_to=sent.seq, celery_task_id=None)
        finish_run(db, run.id, state="succeeded")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_send_wait_prints_the_reply_with_no_raw_control_characters(db: Database, settings: Settings) -> None:
    add_group(db, chat_jid=JID, name="Term", folder="term", requires_trigger=False)
    done = _send_waiting(settings, db)
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert _raw_in(out + done.stderr.decode()) == [], out
    assert "[assistant]" in out and "\\x1b]52;c;ZXZpbA==\\x07" in out and "bash\\x1b[2K\\r" in out
    # --json: one ASCII JSON object a line, the stored text back when parsed.
    as_json = _send_waiting(settings, db, "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert as_json.stdout.isascii()
    lines = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [m["content"] for m in lines] == [HOSTILE, HOSTILE]


def test_the_chat_renders_no_raw_control_characters(db: Database, settings: Settings) -> None:
    _fill(db)
    # Piped stdin: the backlog, then a typed line (the chat names no hostile command), then EOF.
    done = _cli(settings, "chat", JID, "--linger", "0", stdin=f"/nope{CLIPBOARD}\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert _raw_in(out) == [], out
    assert out.count("\\x1b]52;c;ZXZpbA==\\x07") >= 4 and "unknown command /nope\\x1b]52" in out


def test_the_chat_follower_prints_new_messages_escaped(db: Database, settings: Settings) -> None:
    from orchestrator.cli.chat import Follower

    add_group(db, chat_jid=JID, name="Term", folder="term", requires_trigger=False)
    printed: list[str] = []
    follower = Follower(db, settings, JID, printed.append, 0)
    store_message_direct(
        db=db,
        id="r1",
        chat_jid=JID,
        sender="bot",
        sender_name="Andy",
        content=HOSTILE,
        timestamp=datetime.now(UTC).isoformat(),
        is_from_me=True,
        message_type="assistant",
    )
    follower.poll()
    assert printed and all(_raw_in(line) == [] for line in printed), printed
    assert "\\x1b]52;c;ZXZpbA==\\x07" in printed[0]


# -- the log ------------------------------------------------------------------------------


def _log_lines(emit: object) -> list[str]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(text_formatter())
    logger = logging.getLogger("orchestrator.channel.log.test")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        emit(logger)  # type: ignore[operator]
    finally:
        logger.removeHandler(handler)
    return stream.getvalue().splitlines()


def test_the_log_channel_writes_one_escaped_line_per_message() -> None:
    rendered = RenderedMessage(
        text=HOSTILE,
        chat_jid=JID,
        seq=7,
        id="m7",
        message_type="assistant",
        sender="bot",
        sender_name="Andy",
        content=HOSTILE,
    )
    lines = _log_lines(lambda logger: LogChannel(logger).send(f"addr{ERASE}\nINFO forged", rendered))
    assert len(lines) == 1, lines  # no line of its own for the message's newlines
    assert _raw_in(lines[0]) == [] and "[addr\\x1b[2K\\r\\nINFO forged #7]" in lines[0]
    assert "\\x1b]52;c;ZXZpbA==\\x07" in lines[0] and "forged line\\n2026-01-01 INFO fake" in lines[0]


def test_every_text_log_line_is_escaped_whoever_logs_it() -> None:
    def emit(logger: logging.Logger) -> None:
        logger.warning("chat %s said %s", f"x{CLIPBOARD}", HOSTILE)
        try:
            raise ValueError(HOSTILE)
        except ValueError:
            logger.exception("failed\r\nINFO forged")

    lines = _log_lines(emit)
    assert all(_raw_in(line) == [] for line in lines), lines
    assert "forged line\\n2026-01-01" in lines[0] and lines[1].endswith("failed\\r\\nINFO forged")
    assert lines[2] == "Traceback (most recent call last):"  # a traceback keeps its lines
