"""Text from outside (a sender, the agent, a tool's output, a file, group or chat
name) made safe to print on a terminal or to write as a log line.

Raw, such text could drive the terminal that shows it: ESC and C1 sequences
write the clipboard (OSC 52), make hyperlinks (OSC 8), move the cursor and erase
or rewrite lines; bidi overrides show text in another order than it is; in a log,
a newline or carriage return starts a line that looks like the log's own.  Every
such character is shown visibly instead, as an escape a person can read:
``\\x1b``, ``\\x9b``, ``\\u202e``; in log lines ``\\n``, ``\\r``, ``\\t`` too.

Backslashes are left alone: the result is for reading, not for parsing back
(machine outputs are JSON, escaped by its encoder), and escaping twice changes
nothing (``for_terminal(for_terminal(s)) == for_terminal(s)``).
"""

from __future__ import annotations

import re
from typing import Final

# Bidi embeddings and overrides (LRE, RLE, PDF, LRO, RLO) and isolates (LRI, RLI, FSI, PDI).
_BIDI: Final = "\u202a-\u202e\u2066-\u2069"
# C0 but newline and tab, DEL, C1, bidi: a terminal prints a multi-line message as such.
_TERMINAL: Final = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{_BIDI}]")
# All of C0 too, and the Unicode line and paragraph separators: one log record, one line.
_LOG: Final = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029{_BIDI}]")
_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _shown(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def for_terminal(text: str) -> str:
    """``text`` to print on a terminal: control characters (but newline and tab), DEL,
    C1 and bidi overrides shown as escapes (``\\x1b``, ``\\u202e``)."""
    return _TERMINAL.sub(_shown, text)


def for_log(text: str) -> str:
    """``text`` to write in one log line: as :func:`for_terminal`, and newline, carriage
    return, tab and U+2028/U+2029 escaped too, so it cannot start a line of its own."""
    return _LOG.sub(_shown, text)
