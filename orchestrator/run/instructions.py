"""What a group's agent is told before every run beyond the base prompt: the installation's
instructions and the group's own (host-owned), and the memory the agent keeps in its
workspace (``MEMORY.md``, agent-owned).

**Instructions** are files of the data dir, this user's alone: ``instructions/installation.md``
for every group, ``instructions/groups/<folder>.md`` for one (the main group's may differ like
any other's).  The host writes them (``orchestrator instructions``, ``orchestrator groups
instructions``: a temporary file renamed into place, 0600) and reads them; no agent can reach
them.  Each is cut at ``ORCHESTRATOR_INSTRUCTIONS_MAX_BYTES``.

**Memory** is ``MEMORY.md`` at the top of the group's workspace, which the agent writes like
any file.  It is read by the hostile-folder rule (``hostile_fs.read_regular``: no link
followed, a regular file, non-blocking, bounded): at most ``ORCHESTRATOR_MEMORY_MAX_BYTES``,
and when it is longer the run's notice says it was cut, so the agent can tidy it.  A link,
FIFO or folder there is not read, and the notice says so.

Both go into the run's input (``ContainerInput.instructions``, ``.memory``), recorded with
it, and the runner appends them to the system prompt for every provider
(``agent_runner/conversation.py``; Claude Code through the SDK's system-prompt append, never
by loading project settings from the workspace).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from orchestrator.core.errors import HostileEntry
from orchestrator.core.private_dirs import private_dir
from orchestrator.core.settings import Settings
from orchestrator.core.sizes import human_size
from orchestrator.sandbox.hostile_fs import read_regular
from orchestrator.store.groups import Group

MEMORY_FILE = "MEMORY.md"
_INSTALLATION = "installation.md"


def instructions_path(settings: Settings, folder: str | None) -> Path:
    """Where the instructions of the group in ``folder`` (None: the installation's) are kept."""
    root = settings.data_dir / "instructions"
    return root / _INSTALLATION if folder is None else root / "groups" / f"{folder}.md"


def read_instructions_file(settings: Settings, folder: str | None) -> str:
    """One instructions file's text ("" when there is none), cut at the limit."""
    try:
        with open(instructions_path(settings, folder), "rb") as fh:
            data = fh.read(settings.context.instructions_max_bytes)
    except FileNotFoundError:
        return ""
    return data.decode("utf-8", "replace").strip()


def write_instructions(settings: Settings, folder: str | None, text: str | None) -> None:
    """Set (or, with None or blank text, remove) the instructions of ``folder`` (None: the
    installation's).  Raises :class:`ValueError` past ``ORCHESTRATOR_INSTRUCTIONS_MAX_BYTES``."""
    path = instructions_path(settings, folder)
    if text is None or not text.strip():
        path.unlink(missing_ok=True)
        return
    data = text.encode("utf-8")
    if len(data) > settings.context.instructions_max_bytes:
        raise ValueError(
            f"the instructions are {len(data)} bytes; the limit is {settings.context.instructions_max_bytes} "
            "(ORCHESTRATOR_INSTRUCTIONS_MAX_BYTES)"
        )
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def group_instructions(settings: Settings, group: Group) -> str:
    """The installation's instructions, then the group's, as one text ("" when neither is set)."""
    parts = [
        f"## {title}\n{text}"
        for title, text in (
            ("Instructions for every group", read_instructions_file(settings, None)),
            ("Instructions for this group", read_instructions_file(settings, group.folder)),
        )
        if text
    ]
    return "\n\n".join(parts)


def read_memory(settings: Settings, workspace: Path) -> tuple[str, str | None]:
    """The agent's ``MEMORY.md`` (bounded) and a notice when it was cut or not read."""
    limit = settings.context.memory_max_bytes
    try:
        data, _ = read_regular(workspace, MEMORY_FILE, limit)
    except HostileEntry as exc:
        if exc.reason == "no such file":
            return "", None
        return "", f"{MEMORY_FILE} in your workspace was not read ({exc.reason}); make it a plain file."
    if len(data) > limit:
        text = data[:limit].decode("utf-8", "ignore")
        return text, (
            f"{MEMORY_FILE} is longer than {human_size(limit)}: only its first {human_size(limit)} are shown above; "
            "shorten it so nothing is lost."
        )
    return data.decode("utf-8", "replace"), None
