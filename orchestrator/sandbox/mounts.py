"""What of the host a run container sees: its group's workspace, and extra
folders only through an allowlist file that lives outside the project.

The workspace ``<data>/groups/<folder>`` (a validated slug, never a symlink
out of the groups folder) is mounted read-write at ``/workspace``; nothing
else of the data dir is ever mounted.

Extra mounts are asked for in a group's ``container_config``
(``{"host_path": ..., "name": ..., "read_write": false}``) and allowed only by
the allowlist file (``ORCHESTRATOR_MOUNT_ALLOWLIST``, default
``~/.config/orchestrator/mount-allowlist.json``)::

    {
      "roots": [
        {"path": "~/src", "read_write": false},
        {"path": "/srv/datasets", "read_write": true, "groups": ["research"]}
      ],
      "blocked_patterns": ["*.sqlite"]
    }

Rules, checked when the config is set and again before every run (the file
may have changed since):

* symlinks are resolved first; the real path must exist, be a directory and
  lie inside an allowed root;
* a path with a component matching a blocked pattern (the built-in
  :data:`BLOCKED_PATTERNS` plus the file's ``blocked_patterns``) is refused,
  before and after resolving;
* never mounted: system folders (``/proc``, ``/sys``, ``/dev``, ``/run``,
  ``/boot``), anything inside the data dir, and any folder that contains the
  data dir, the allowlist file, the home directory, the orchestrator's own
  source tree or the ``.env`` settings file;
* a root with a ``groups`` list is open to those groups (folder or chat jid;
  ``"*"`` = every group) and to the main group; without one, to every group;
* read-write needs the root's ``read_write``; for a group other than main it
  also needs the root's ``groups`` list to name that group (or ``"*"``);
  anything else is read-only, and asking for read-write is refused;
* the container path is ours: ``/workspace/extra/<name>``, ``name`` a slug.

Every refusal is a :class:`~orchestrator.core.errors.MountRefused` naming the path
and the reason.
"""

from __future__ import annotations

import json
import re
import stat
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestrator.core.errors import HostileEntry, InvalidMessage, MountRefused
from orchestrator.core.settings import Settings
from orchestrator.sandbox.hostile_fs import make_dirs
from orchestrator.store.groups import validate_folder

WORKSPACE_MOUNT = "/workspace"  # same as sandbox.WORKSPACE_MOUNT (not imported: no Docker needed here)
EXTRA_MOUNT_ROOT = f"{WORKSPACE_MOUNT}/extra"
EXTRA_DIR = "extra"  # the workspace folder the extra mounts land in

# Matched (case-insensitively, fnmatch style) against every component of a
# path, as given and after resolving symlinks.  The allowlist may add more,
# never remove any.
BLOCKED_PATTERNS: tuple[str, ...] = (
    ".ssh",
    ".gnupg",
    ".gpg",
    ".aws",
    ".azure",
    ".gcloud",
    "gcloud",
    ".kube",
    ".docker",
    ".env",
    ".env.*",
    ".netrc",
    ".npmrc",
    ".pypirc",
    ".pgpass",
    ".git-credentials",
    "*credentials*",
    "*secret*",
    "private_key*",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.sock",
)
SYSTEM_PATHS: tuple[str, ...] = ("/proc", "/sys", "/dev", "/run", "/var/run", "/boot")
PROJECT_ROOT = Path(__file__).resolve().parents[2]

MOUNT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_NAME = re.compile(MOUNT_NAME_PATTERN)


def _absolute(v: str) -> str:
    if not Path(v).expanduser().is_absolute():
        raise ValueError("must be an absolute path (or start with ~)")
    return v


# A host folder as a config or the allowlist writes it: absolute, or from ``~``.
HostPath = Annotated[str, Field(min_length=1, json_schema_extra={"pattern": r"^(/|~(/|$))"}), AfterValidator(_absolute)]


class MountRequest(BaseModel):
    """One extra mount a group's ``container_config`` asks for."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    host_path: HostPath
    # The folder under /workspace/extra/ (default: the host folder's name).
    name: str | None = Field(default=None, json_schema_extra={"pattern": MOUNT_NAME_PATTERN})
    read_write: bool = False

    @field_validator("name")
    @classmethod
    def _slug(cls, v: str | None) -> str | None:
        if v is not None and not _NAME.fullmatch(v):  # fullmatch: "$" alone lets "name\n" through
            raise ValueError("must be 1-64 letters, digits, '-' or '_' (no slashes or dots)")
        return v

    @property
    def mount_name(self) -> str:
        if self.name is not None:
            return self.name
        base = Path(self.host_path.rstrip("/")).name
        if not _NAME.fullmatch(base):
            raise ValueError(f"give a 'name': the folder name {base!r} is not a valid mount name")
        return base


class AllowedRoot(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: HostPath
    read_write: bool = False
    # Groups (folder or chat jid, "*" = all) that may use this root; None: every group.
    groups: list[str] | None = None
    description: str = ""


class Allowlist(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    roots: list[AllowedRoot] = Field(default_factory=list)
    blocked_patterns: list[str] = Field(default_factory=list)

    @field_validator("blocked_patterns")
    @classmethod
    def _components(cls, v: list[str]) -> list[str]:
        for p in v:
            if not p or "/" in p:
                raise ValueError(f"{p!r}: a pattern matches one path component (no '/')")
        return v

    @property
    def patterns(self) -> tuple[str, ...]:
        return (*BLOCKED_PATTERNS, *self.blocked_patterns)


@dataclass(frozen=True)
class ResolvedMount:
    host: Path  # symlinks resolved
    container: str  # /workspace/extra/<name>
    read_write: bool


# -- the workspace ----------------------------------------------------------------


def group_workspace(settings: Settings, folder: str) -> Path:
    """The group's workspace on the host; refuses a bad slug or a path that leaves the groups folder."""
    try:
        validate_folder(folder)
    except InvalidMessage as exc:
        raise MountRefused(f"workspace refused: {exc}") from exc
    path = settings.groups_dir / folder
    if path.is_symlink():
        raise MountRefused(f"workspace refused: {path} is a symlink")
    if not _inside(path.resolve(), settings.groups_dir.resolve()):
        raise MountRefused(f"workspace refused: {path} resolves outside {settings.groups_dir}")
    return path


# -- the allowlist ----------------------------------------------------------------


def load_allowlist(settings: Settings) -> Allowlist:
    """Read and check the allowlist file; any problem refuses every extra mount."""
    path = settings.sandbox.mount_allowlist
    if not path.exists():
        raise MountRefused(f"no mount allowlist at {path}: extra mounts are refused until it exists")
    real = path.resolve()
    for place, what in ((settings.data_dir.resolve(), "the data dir"), (PROJECT_ROOT, "the project")):
        if _inside(real, place):
            raise MountRefused(f"the mount allowlist {real} must live outside {what} ({place})")
    mode = real.stat().st_mode
    if not stat.S_ISREG(mode):
        raise MountRefused(f"the mount allowlist {real} is not a regular file")
    if mode & stat.S_IWOTH:
        raise MountRefused(f"the mount allowlist {real} is world-writable; refusing to trust it")
    try:
        allowlist = Allowlist.model_validate(json.loads(real.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MountRefused(f"cannot read the mount allowlist {real}: {exc}") from exc
    except ValidationError as exc:
        raise MountRefused(f"invalid mount allowlist {real}: {_first_error(exc)}") from exc
    for root in allowlist.roots:
        root_real = Path(root.path).expanduser().resolve()
        if root.read_write and _inside(real, root_real):
            raise MountRefused(
                f"the mount allowlist {real} lies inside its own read-write root {root.path}; "
                "move it or make that root read-only"
            )
    return allowlist


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    return f"{where}: {err['msg']}"


# -- the rules -------------------------------------------------------------------


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def blocked_component(path: Path, patterns: tuple[str, ...] = BLOCKED_PATTERNS) -> str | None:
    """The first ``component (pattern)`` of ``path`` that a blocked pattern matches, else None."""
    lowered = [p.lower() for p in patterns]
    for part in path.parts:
        if part in ("/", ""):
            continue
        for pattern in lowered:
            if fnmatchcase(part.lower(), pattern):
                return f"{part!r} (blocked pattern {pattern!r})"
    return None


def _protected(settings: Settings) -> list[tuple[Path, str]]:
    places = [
        (settings.data_dir.resolve(), "the data dir"),
        (settings.sandbox.mount_allowlist.resolve(), "the mount allowlist"),
        (PROJECT_ROOT, "the orchestrator's source tree"),
    ]
    try:
        places.append((Path.home().resolve(), "the home directory"))
    except RuntimeError:  # no HOME and no passwd entry
        pass
    env_file = Path.cwd() / ".env"
    if env_file.exists():
        places.append((env_file.resolve(), "the .env settings file"))
    return places


def _group_named(root: AllowedRoot, folder: str, chat_jid: str | None) -> bool:
    names = set(root.groups or ())
    return "*" in names or folder in names or (chat_jid is not None and chat_jid in names)


def check_mount(
    settings: Settings,
    allowlist: Allowlist,
    request: MountRequest,
    *,
    folder: str,
    is_main: bool,
    chat_jid: str | None = None,
) -> ResolvedMount:
    """Allow one extra mount for group ``folder`` or raise :class:`MountRefused` saying why."""
    given = Path(request.host_path).expanduser()
    label = f"mount {request.host_path!r}"
    hit = blocked_component(given, allowlist.patterns)
    if hit:
        raise MountRefused(f"{label} refused: {hit}")
    try:
        name = request.mount_name
    except ValueError as exc:
        raise MountRefused(f"{label} refused: {exc}") from exc
    try:
        real = given.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise MountRefused(f"{label} refused: it does not exist ({exc})") from exc
    hit = blocked_component(real, allowlist.patterns)
    if hit:
        raise MountRefused(f"{label} refused: it resolves to {real}, which has {hit}")
    if not real.is_dir():
        raise MountRefused(f"{label} refused: {real} is not a directory (only folders are mounted)")
    if real == Path("/") or any(_inside(real, Path(s)) for s in SYSTEM_PATHS):
        raise MountRefused(f"{label} refused: {real} is a system folder")
    data_dir = settings.data_dir.resolve()
    if _inside(real, data_dir):
        raise MountRefused(f"{label} refused: {real} is inside the data dir (other groups' workspaces, the database)")
    for place, what in _protected(settings):
        if _inside(place, real):
            raise MountRefused(f"{label} refused: {real} contains {what} ({place})")

    roots = [(r, Path(r.path).expanduser().resolve()) for r in allowlist.roots]
    containing = [(r, rr) for r, rr in roots if _inside(real, rr)]
    if not containing:
        raise MountRefused(
            f"{label} refused: {real} is not inside any allowed root of {settings.sandbox.mount_allowlist}"
        )
    open_to_group = [r for r, _ in containing if is_main or r.groups is None or _group_named(r, folder, chat_jid)]
    if not open_to_group:
        listed = ", ".join(r.path for r, _ in containing)
        raise MountRefused(f"{label} refused: the allowed root(s) {listed} are not open to group {folder!r}")
    if request.read_write:
        writable = [r for r in open_to_group if r.read_write and (is_main or _group_named(r, folder, chat_jid))]
        if not writable:
            if any(r.read_write for r in open_to_group):
                why = f"a read_write root must name group {folder!r} (or '*') in its groups"
            else:
                why = "no allowed root containing it has read_write"
            raise MountRefused(f"{label} refused read-write: {why}; ask for a read-only mount")
    return ResolvedMount(real, f"{EXTRA_MOUNT_ROOT}/{name}", request.read_write)


def resolve_mounts(
    settings: Settings,
    requests: list[MountRequest],
    *,
    folder: str,
    is_main: bool,
    chat_jid: str | None = None,
) -> list[ResolvedMount]:
    """Check every requested mount against the allowlist as it is now."""
    if not requests:
        return []
    allowlist = load_allowlist(settings)
    resolved = [
        check_mount(settings, allowlist, r, folder=folder, is_main=is_main, chat_jid=chat_jid) for r in requests
    ]
    names = [m.container for m in resolved]
    hosts = [m.host for m in resolved]
    if len(set(names)) != len(names):
        raise MountRefused(f"two extra mounts share a name: {sorted(names)}")
    if len(set(hosts)) != len(hosts):
        raise MountRefused(f"one host folder is mounted twice: {sorted(map(str, hosts))}")
    return resolved


def prepare_mountpoints(workspace: Path, mounts: list[ResolvedMount]) -> None:
    """Create ``extra/<name>`` in the workspace as plain folders owned by us (not by Docker, as root).

    The workspace is the agent's: each folder is made and checked through
    directory descriptors (``hostile_fs.make_dirs``), so a symlink planted at
    ``extra`` or ``extra/<name>`` is refused, never followed.
    """
    if not mounts:
        return
    workspace.mkdir(parents=True, exist_ok=True)
    for m in mounts:
        relative = f"{EXTRA_DIR}/{m.container.rsplit('/', 1)[1]}"
        try:
            make_dirs(workspace, relative)
        except HostileEntry as exc:
            raise MountRefused(f"mount point {workspace / relative} is not a plain folder ({exc.reason})") from None
