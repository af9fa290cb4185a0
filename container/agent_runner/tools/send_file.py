"""The ``send_file`` tool: hand the chat a file from the workspace.

The runner refuses early what it already knows is wrong, with an error the
model can act on: a path outside the workspace, a path that does not exist,
a symbolic link anywhere on the path (looked at with ``lstat``, never
followed), anything but a regular file (a directory, FIFO, socket or device:
never opened, so a FIFO cannot block the run), and a file over
:data:`MAX_FILE_BYTES`.  It never reads the file: it emits a
:class:`SendFileEvent` naming it (relative to the workspace, normalized, no
``..``) and the host does the rest.

These checks are a courtesy, not the boundary.  The file can change between
this check and the host's read (replaced by a link, grown, swapped for a
FIFO), and nothing the container says is trusted: the host reads the file by
its hostile-folder rules (a descriptor, no link followed, a regular file, a
bounded size) and decides for real, with its own limits.
"""

from __future__ import annotations

import stat
from typing import Annotated

from msgspec import Meta

from ..protocol import SendFileEvent
from ..providers.base import ToolSpec
from .base import NonBlank, ToolArgs, ToolContext, ToolOutcome, failed
from .paths import file_in_workspace

NAME = "send_file"
# The host's default per-file limit (25 MiB), for an early refusal only: the
# host's own setting, which may be lower or higher, decides for real.
MAX_FILE_BYTES = 25 * 1024 * 1024
# As long as send_message's text may be.
MAX_CAPTION_CHARS = 20_000
# The longest path the event carries (SendFileEvent.path).
MAX_PATH_CHARS = 4096

SPEC = ToolSpec(
    name=NAME,
    description=(
        "Send a file from the workspace to this chat (a report, an image, an archive, ...), "
        "with an optional caption. The file must be a regular file inside the workspace, "
        f"not a symbolic link or a folder (archive a folder first), at most {MAX_FILE_BYTES // (1024 * 1024)} MiB."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "The file, relative to the workspace."},
            "caption": {"type": "string", "description": "Text sent with the file (optional)."},
        },
        "required": ["path"],
    },
)

# What a file that is not a regular one is called in a refusal.
_KINDS = (
    (stat.S_ISDIR, "a directory (send one file; archive a folder first, e.g. with tar)"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class SendFileArgs(ToolArgs):
    path: NonBlank
    caption: Annotated[str, Meta(max_length=MAX_CAPTION_CHARS)] = ""


def send_file(args: SendFileArgs, ctx: ToolContext) -> ToolOutcome:
    raw, caption = args.path, args.caption.strip()
    found = file_in_workspace(ctx.workspace, raw, NAME)
    if isinstance(found, ToolOutcome):
        return found
    rel, info = found
    if len(rel) > MAX_PATH_CHARS:
        return failed(NAME, f"the path is {len(rel)} characters; the limit is {MAX_PATH_CHARS}")
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
        return failed(NAME, f"{rel} is {kind}; only a regular file can be sent")
    if info.st_size > MAX_FILE_BYTES:
        return failed(
            NAME,
            f"{rel} is {info.st_size} bytes ({info.st_size / (1024 * 1024):.1f} MiB); "
            f"the limit is {MAX_FILE_BYTES} bytes ({MAX_FILE_BYTES // (1024 * 1024)} MiB)",
        )
    if ctx.emit is None:
        return failed(NAME, "no chat to send to outside a run")
    ctx.emit(SendFileEvent(path=rel, caption=caption))
    return ToolOutcome(f"File sent: {rel}", 0)
