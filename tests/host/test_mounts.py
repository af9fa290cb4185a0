"""Extra mounts and per-group container config: every allowlist rule, the
config model, the CLI, and the pipeline's re-check before a run (no Docker:
the sandbox here is a fake that records the spec it was given)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_runner.protocol import ContainerInput, KeepEvent, ResultEvent, decode_input, dump_event
from fakes.channel import RecordingChannel, attach_recorder
from orchestrator.core.errors import ContainerConfigError, MountRefused, SandboxError
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.sandbox.config import (
    ContainerConfig,
    container_plan,
    effective_limits,
    parse_container_config,
    set_container_config,
)
from orchestrator.sandbox.containers import ContainerExit, ContainerSpec
from orchestrator.sandbox.mounts import (
    BLOCKED_PATTERNS,
    PROJECT_ROOT,
    MountRequest,
    ResolvedMount,
    check_mount,
    group_workspace,
    load_allowlist,
    prepare_mountpoints,
    resolve_mounts,
)
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, ensure_main_group, get_group

# -- fixtures -------------------------------------------------------------------------


@pytest.fixture
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A neutral name: pytest's own tmp_path carries the test id, which may
    # itself match a blocked pattern.
    return tmp_path_factory.mktemp("m").resolve()


def _write(path: Path, doc: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    path.chmod(0o644)
    return path


class Env:
    """A data dir, an allowlist file outside it and a shared host folder."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.shared = base / "shared"
        (self.shared / "docs").mkdir(parents=True)
        (self.shared / "docs" / "readme.txt").write_text("hello\n")
        self.allowlist = base / "config" / "mount-allowlist.json"
        self.settings = Settings.load(data_dir=base / "data", mount_allowlist=self.allowlist, env_file=None)
        self.settings.ensure_dirs()

    def allow(self, *roots: dict[str, Any], **extra: Any) -> None:
        _write(self.allowlist, {"roots": list(roots), **extra})

    def check(
        self,
        host_path: str | Path,
        *,
        folder: str = "alpha",
        is_main: bool = False,
        read_write: bool = False,
        name: str | None = None,
        jid: str | None = None,
    ) -> ResolvedMount:
        request = MountRequest(host_path=str(host_path), read_write=read_write, name=name)
        return check_mount(
            self.settings, load_allowlist(self.settings), request, folder=folder, is_main=is_main, chat_jid=jid
        )

    def refused(self, host_path: str | Path, match: str, **kw: Any) -> str:
        with pytest.raises(MountRefused, match=match) as info:
            self.check(host_path, **kw)
        return str(info.value)


@pytest.fixture
def env(base: Path) -> Env:
    return Env(base)


# -- the allowlist file ----------------------------------------------------------------


def test_no_allowlist_file_refuses_every_extra_mount(env: Env) -> None:
    with pytest.raises(MountRefused, match="no mount allowlist at .*mount-allowlist.json"):
        load_allowlist(env.settings)
    with pytest.raises(MountRefused, match="no mount allowlist"):
        resolve_mounts(env.settings, [MountRequest(host_path=str(env.shared / "docs"))], folder="alpha", is_main=True)
    # No mounts asked for: the file is not needed.
    assert resolve_mounts(env.settings, [], folder="alpha", is_main=False) == []


def test_allowlist_inside_the_data_dir_is_not_trusted(env: Env) -> None:
    inside = _write(env.settings.data_dir / "allow.json", {"roots": [{"path": str(env.shared)}]})
    s = env.settings.replace(**{"mount_allowlist": inside})
    with pytest.raises(MountRefused, match="must live outside the data dir"):
        load_allowlist(s)


def test_allowlist_inside_the_project_is_not_trusted(env: Env) -> None:
    s = env.settings.replace(**{"mount_allowlist": PROJECT_ROOT / "pyproject.toml"})
    with pytest.raises(MountRefused, match="must live outside the project"):
        load_allowlist(s)


def test_world_writable_allowlist_is_not_trusted(env: Env) -> None:
    env.allow({"path": str(env.shared)})
    env.allowlist.chmod(0o666)
    with pytest.raises(MountRefused, match="world-writable"):
        load_allowlist(env.settings)


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ("{not json", "cannot read the mount allowlist"),
        ({"roots": [{"path": "relative/dir"}]}, r"roots\.0\.path: .*absolute"),
        ({"roots": [{"path": "/srv", "writable": True}]}, r"roots\.0\.writable: Extra inputs"),
        ({"roots": [], "blocked_patterns": ["a/b"]}, r"blocked_patterns: .*one path component"),
        ({"root": []}, "root: Extra inputs"),
    ],
)
def test_invalid_allowlist_is_refused_naming_the_field(env: Env, doc: Any, match: str) -> None:
    _write(env.allowlist, doc)
    with pytest.raises(MountRefused, match=match):
        load_allowlist(env.settings)


def test_allowlist_inside_its_own_read_write_root_is_refused(env: Env) -> None:
    env.allow({"path": str(env.base), "read_write": True})
    with pytest.raises(MountRefused, match="inside its own read-write root"):
        load_allowlist(env.settings)
    env.allow({"path": str(env.base), "read_write": False})
    assert load_allowlist(env.settings).roots[0].read_write is False


# -- paths ------------------------------------------------------------------------------


def test_allowed_folder_is_read_only_under_workspace_extra(env: Env) -> None:
    env.allow({"path": str(env.shared)})
    m = env.check(env.shared / "docs")
    assert m == ResolvedMount(env.shared / "docs", "/workspace/extra/docs", False)
    assert env.check(env.shared / "docs", name="manuals").container == "/workspace/extra/manuals"
    # The root itself may be mounted too.
    assert env.check(env.shared).host == env.shared


def test_tilde_paths_are_expanded(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    home = env.base / "home"
    (home / "src" / "proj").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    env.allow({"path": "~/src"})
    assert env.check("~/src/proj").host == home / "src" / "proj"


@pytest.mark.parametrize(
    "name",
    [
        ".ssh",
        ".gnupg",
        ".aws",
        ".azure",
        ".kube",
        ".docker",
        ".env",
        ".env.local",
        "id_rsa",
        "id_ed25519",
        "server.pem",
        "tls.key",
        "credentials",
        "gcp-credentials.json",
        ".netrc",
        ".git-credentials",
        ".SSH",
        "my-secrets",
        "docker.sock",
    ],
)
def test_blocked_names_are_refused_anywhere_in_the_path(env: Env, name: str) -> None:
    env.allow({"path": str(env.shared)})
    (env.shared / name / "sub").mkdir(parents=True)
    env.refused(env.shared / name, rf"{name!r} \(blocked pattern", name="x")
    env.refused(env.shared / name / "sub", rf"{name!r} \(blocked pattern")


def test_builtin_blocked_list_covers_the_usual_secrets() -> None:
    for must in (
        ".ssh",
        ".gnupg",
        ".aws",
        ".azure",
        ".kube",
        ".docker",
        ".env",
        "*.pem",
        "*.key",
        ".netrc",
        ".git-credentials",
        "*credentials*",
        "id_rsa*",
        "id_ed25519*",
    ):
        assert must in BLOCKED_PATTERNS


def test_allowlist_adds_blocked_patterns(env: Env) -> None:
    (env.shared / "db.sqlite").mkdir()
    env.allow({"path": str(env.shared)})
    assert env.check(env.shared / "db.sqlite", name="db").read_write is False
    env.allow({"path": str(env.shared)}, blocked_patterns=["*.sqlite"])
    env.refused(env.shared / "db.sqlite", r"'db.sqlite' \(blocked pattern '\*.sqlite'\)")


def test_symlinks_are_resolved_before_checking(env: Env) -> None:
    env.allow({"path": str(env.shared)})
    keys = env.base / "keys" / ".ssh"
    keys.mkdir(parents=True)
    outside = env.base / "outside"
    outside.mkdir()
    (env.shared / "innocent").symlink_to(keys)
    (env.shared / "elsewhere").symlink_to(outside)
    (env.shared / ".aws").symlink_to(env.shared / "docs")
    env.refused(env.shared / "innocent", r"resolves to .*\.ssh.*blocked pattern")
    env.refused(env.shared / "elsewhere", "not inside any allowed root")
    env.refused(env.shared / ".aws", "'.aws' \\(blocked pattern")  # the name as given counts too
    # A symlink to a folder inside the root is fine, and mounts the real folder.
    (env.shared / "alias").symlink_to(env.shared / "docs")
    assert env.check(env.shared / "alias").host == env.shared / "docs"


def test_dotdot_cannot_leave_the_root(env: Env) -> None:
    (env.base / "outside").mkdir()
    env.allow({"path": str(env.shared)})
    env.refused(f"{env.shared}/docs/../../outside", "not inside any allowed root")


def test_path_outside_every_root_is_refused(env: Env) -> None:
    other = env.base / "other"
    other.mkdir()
    env.allow({"path": str(env.shared)})
    env.refused(other, "not inside any allowed root of .*mount-allowlist.json")
    env.allow()
    env.refused(env.shared / "docs", "not inside any allowed root")


def test_missing_path_and_plain_files_are_refused(env: Env) -> None:
    env.allow({"path": str(env.shared)})
    env.refused(env.shared / "nope", "does not exist")
    env.refused(env.shared / "docs" / "readme.txt", "not a directory", name="readme")


def test_relative_paths_and_bad_names_are_refused_at_config_time() -> None:
    for bad in (
        {"host_path": "docs"},
        {"host_path": "/srv/x", "name": "../up"},
        {"host_path": "/srv/x", "name": "a/b"},
        {"host_path": "/srv/x", "name": ".hidden"},
        {"host_path": "/srv/x", "mode": "rw"},
    ):
        with pytest.raises(ContainerConfigError, match=r"container_config\.extra_mounts\.0"):
            parse_container_config({"extra_mounts": [bad]})


def test_folder_name_that_is_no_mount_name_needs_a_name(env: Env) -> None:
    odd = env.shared / "two words"
    odd.mkdir()
    env.allow({"path": str(env.shared)})
    env.refused(odd, "give a 'name'")
    assert env.check(odd, name="two-words").container == "/workspace/extra/two-words"
    with pytest.raises(ContainerConfigError, match="give a 'name'"):
        parse_container_config({"extra_mounts": [{"host_path": str(odd)}]})


def test_the_data_dir_is_never_mounted(env: Env) -> None:
    env.allow({"path": str(env.base)})
    (env.settings.groups_dir / "beta").mkdir(parents=True)
    env.refused(env.settings.groups_dir / "beta", "inside the data dir", is_main=True)
    env.refused(env.settings.data_dir, "inside the data dir", is_main=True)
    env.refused(env.base, "contains the data dir", is_main=True)


def test_folders_holding_the_allowlist_are_never_mounted(env: Env) -> None:
    env.allow({"path": str(env.base)})
    env.refused(env.allowlist.parent, "contains the mount allowlist", is_main=True)


def test_home_and_its_ancestors_are_never_mounted(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    home = env.base / "users" / "me"
    (home / "work").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    env.allow({"path": str(env.base / "users")})
    env.refused(home, "contains the home directory", is_main=True)
    env.refused(env.base / "users", "contains the home directory", is_main=True)
    assert env.check(home / "work", is_main=True).host == home / "work"


def test_the_orchestrator_source_tree_is_never_mounted(env: Env) -> None:
    env.allow({"path": str(PROJECT_ROOT.parent)})
    env.refused(PROJECT_ROOT, "contains the orchestrator's source tree", is_main=True)


def test_system_folders_are_never_mounted(env: Env) -> None:
    env.allow({"path": "/"})
    env.refused("/", "system folder", is_main=True, name="root")
    env.refused("/proc", "system folder", is_main=True)
    env.refused("/sys/kernel", "system folder", is_main=True)
    env.refused("/dev", "system folder", is_main=True)


# -- who may mount what ------------------------------------------------------------------


def test_root_with_a_groups_list_is_open_to_those_groups_and_main(env: Env) -> None:
    env.allow({"path": str(env.shared), "groups": ["alpha", "beta@chat"]})
    assert env.check(env.shared / "docs", folder="alpha")
    assert env.check(env.shared / "docs", folder="beta", jid="beta@chat")  # by chat jid
    assert env.check(env.shared / "docs", folder="main", is_main=True)
    env.refused(env.shared / "docs", "not open to group 'gamma'", folder="gamma", jid="gamma@chat")
    env.allow({"path": str(env.shared), "groups": ["*"]})
    assert env.check(env.shared / "docs", folder="gamma")


def test_read_write_needs_the_root_and_for_non_main_a_named_group(env: Env) -> None:
    # A read-only root: read-write refused for everyone, main included.
    env.allow({"path": str(env.shared)})
    env.refused(
        env.shared / "docs",
        "refused read-write: no allowed root containing it has read_write",
        read_write=True,
        is_main=True,
    )
    # A read-write root without a groups list: main only.
    env.allow({"path": str(env.shared), "read_write": True})
    assert env.check(env.shared / "docs", is_main=True, folder="main", read_write=True).read_write
    env.refused(env.shared / "docs", "must name group 'alpha'", read_write=True)
    assert env.check(env.shared / "docs").read_write is False  # read-only still fine
    # Naming the group (or "*") opens read-write to it.
    env.allow({"path": str(env.shared), "read_write": True, "groups": ["alpha"]})
    assert env.check(env.shared / "docs", read_write=True).read_write
    env.refused(env.shared / "docs", "not open to group 'beta'", folder="beta", read_write=True)
    env.allow({"path": str(env.shared), "read_write": True, "groups": ["*"]})
    assert env.check(env.shared / "docs", folder="beta", read_write=True).read_write


def test_a_read_write_root_inside_a_read_only_one(env: Env) -> None:
    _write(
        env.allowlist,
        {
            "roots": [
                {"path": str(env.shared)},
                {"path": str(env.shared / "docs"), "read_write": True, "groups": ["alpha"]},
            ]
        },
    )
    assert env.check(env.shared / "docs", read_write=True).read_write
    (env.shared / "other").mkdir()
    env.refused(env.shared / "other", "refused read-write", read_write=True)


def test_two_mounts_may_not_share_a_name_or_a_folder(env: Env) -> None:
    (env.shared / "b").mkdir()
    env.allow({"path": str(env.shared)})
    with pytest.raises(MountRefused, match="share a name"):
        resolve_mounts(
            env.settings,
            [
                MountRequest(host_path=str(env.shared / "docs")),
                MountRequest(host_path=str(env.shared / "b"), name="docs"),
            ],
            folder="alpha",
            is_main=False,
        )
    (env.shared / "alias").symlink_to(env.shared / "docs")
    with pytest.raises(MountRefused, match="mounted twice"):
        resolve_mounts(
            env.settings,
            [MountRequest(host_path=str(env.shared / "docs")), MountRequest(host_path=str(env.shared / "alias"))],
            folder="alpha",
            is_main=False,
        )
    with pytest.raises(ContainerConfigError, match="names must be distinct"):
        parse_container_config({"extra_mounts": [{"host_path": "/a/x"}, {"host_path": "/b/x"}]})


# -- the workspace ----------------------------------------------------------------------


def test_workspace_is_the_groups_folder_slug(env: Env) -> None:
    assert group_workspace(env.settings, "alpha") == env.settings.groups_dir / "alpha"
    for bad in ("../alpha", "a/b", "", ".", "/etc"):
        with pytest.raises(MountRefused, match="workspace refused"):
            group_workspace(env.settings, bad)
    (env.settings.groups_dir / "linked").symlink_to(env.base)
    with pytest.raises(MountRefused, match="is a symlink"):
        group_workspace(env.settings, "linked")


def test_mount_points_must_be_plain_folders(env: Env) -> None:
    ws = env.settings.groups_dir / "alpha"
    m = ResolvedMount(env.shared / "docs", "/workspace/extra/docs", False)
    prepare_mountpoints(ws, [m])
    assert (ws / "extra" / "docs").is_dir() and not (ws / "extra").is_symlink()
    (ws / "extra" / "docs").rmdir()
    (ws / "extra" / "docs").symlink_to("/etc")
    with pytest.raises(MountRefused, match="not a plain folder"):
        prepare_mountpoints(ws, [m])


def test_mount_refused_is_a_sandbox_error() -> None:
    assert issubclass(MountRefused, SandboxError)


# -- the config model --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ('{"privileged": true}', r"container_config\.privileged: Extra inputs"),
        ({"cap_add": ["NET_ADMIN"]}, r"container_config\.cap_add: Extra inputs"),
        ({"user": "0"}, r"container_config\.user: Extra inputs"),
        ({"network": "bridge"}, r"container_config\.network: run containers never have a network"),
        ({"network": "host"}, "never have a network"),
        ({"read_only_root": False}, r"container_config\.read_only_root: .*always read-only"),
        ({"memory": "lots"}, r"container_config\.memory: 'lots' is not a size"),
        ({"memory": "8m"}, "below the 32m minimum"),
        ({"pids": 4}, r"container_config\.pids"),
        ({"cpus": 0}, r"container_config\.cpus"),
        ({"run_timeout_s": -1}, r"container_config\.run_timeout_s"),
        ("[1, 2]", "must be a JSON object"),
        ("{oops", "not valid JSON"),
    ],
)
def test_bad_container_config_is_refused_naming_the_field(raw: Any, match: str) -> None:
    with pytest.raises(ContainerConfigError, match=match):
        parse_container_config(raw)


def test_effective_limits_apply_the_group_on_top_of_the_settings(env: Env) -> None:
    s = env.settings.replace(
        **{
            "container_memory": "512m",
            "container_cpus": 1.0,
            "container_pids": 256,
            "run_timeout_s": 300.0,
            "bash_timeout_s": 60.0,
        }
    )
    assert effective_limits(s, None) == effective_limits(s, {}) == effective_limits(s, ContainerConfig())
    base = effective_limits(s, None)
    assert (base.memory, base.cpus, base.pids, base.run_timeout_s, base.bash_timeout_s) == ("512m", 1.0, 256, 300, 60)
    cfg = {
        "memory": "2G",
        "cpus": 2,
        "pids": 64,
        "run_timeout_s": 30,
        "bash_timeout_s": 5,
        "network": "none",
        "read_only_root": True,
    }
    lim = effective_limits(s, cfg)
    assert (lim.memory, lim.cpus, lim.pids, lim.run_timeout_s, lim.bash_timeout_s) == ("2g", 2, 64, 30, 5)
    # run_timeout_s is only ever shortened (the worker's time limits derive from the setting).
    assert effective_limits(s, {"run_timeout_s": 900}).run_timeout_s == 300


# -- storing it ---------------------------------------------------------------------------


@pytest.fixture
def mounted(db: Database, settings: Settings, base: Path) -> Iterator[tuple[Database, Env]]:
    env = Env(base)
    env.settings = settings.replace(**{"mount_allowlist": env.allowlist})
    env.settings.ensure_dirs()
    ensure_main_group(db)
    add_group(db, chat_jid="alpha@chat", name="alpha", folder="alpha", requires_trigger=False)
    yield db, env


def test_set_container_config_validates_then_stores(mounted: tuple[Database, Env]) -> None:
    db, env = mounted
    env.allow({"path": str(env.shared)})
    g = set_container_config(
        db,
        env.settings,
        "alpha@chat",
        json.dumps({"memory": "256M", "extra_mounts": [{"host_path": str(env.shared / "docs")}]}),
    )
    assert g.container_config == {"memory": "256m", "extra_mounts": [{"host_path": str(env.shared / "docs")}]}
    assert get_group(db, "alpha@chat").container_config == g.container_config
    # Refused now -> nothing changes.
    for raw, err, match in [
        (
            {"extra_mounts": [{"host_path": str(env.shared / "docs"), "read_write": True}]},
            MountRefused,
            "refused read-write",
        ),
        ({"network": "bridge"}, ContainerConfigError, "never have a network"),
        ({"run_timeout_s": env.settings.runs.run_timeout_s + 1}, ContainerConfigError, "may only shorten"),
    ]:
        with pytest.raises(err, match=match):
            set_container_config(db, env.settings, "alpha@chat", raw)
        assert get_group(db, "alpha@chat").container_config == g.container_config
    assert set_container_config(db, env.settings, "alpha@chat", None).container_config is None
    assert set_container_config(db, env.settings, "alpha@chat", {}).container_config is None


def test_cli_groups_set(mounted: tuple[Database, Env]) -> None:
    db, env = mounted
    env.allow({"path": str(env.shared)})
    cli_env = {
        **os.environ,
        "ORCHESTRATOR_DATA_DIR": str(env.settings.data_dir),
        "ORCHESTRATOR_DATABASE_URL": env.settings.database_url,
        "ORCHESTRATOR_MOUNT_ALLOWLIST": str(env.allowlist),
    }
    cli = str(Path(sys.executable).parent / "orchestrator")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([cli, "groups", "set", *args], env=cli_env, capture_output=True, text=True, timeout=60)

    ok = run(
        "alpha@chat",
        "--container-config",
        json.dumps({"pids": 64, "extra_mounts": [{"host_path": str(env.shared / "docs"), "name": "docs"}]}),
    )
    assert ok.returncode == 0, ok.stderr
    assert "pids 64" in ok.stdout and "memory 512m" in ok.stdout
    assert get_group(db, "alpha@chat").container_config == {
        "pids": 64,
        "extra_mounts": [{"host_path": str(env.shared / "docs"), "name": "docs"}],
    }
    for cfg, match in [
        ({"extra_mounts": [{"host_path": str(env.base)}]}, "contains the mount allowlist"),
        ({"extra_mounts": [{"host_path": str(env.shared / "docs"), "read_write": True}]}, "refused read-write"),
        ({"network": "host"}, "never have a network"),
        ({"nope": 1}, "container_config.nope"),
    ]:
        bad = run("alpha@chat", "--container-config", json.dumps(cfg))
        assert bad.returncode == 1 and match in bad.stderr, bad.stderr
    assert get_group(db, "alpha@chat").container_config["pids"] == 64
    assert run("alpha@chat").returncode == 1  # one of the two options is required
    cleared = run("alpha@chat", "--clear-container-config")
    assert cleared.returncode == 0, cleared.stderr
    assert get_group(db, "alpha@chat").container_config is None
    assert run("nobody@chat", "--clear-container-config").returncode == 1


# -- the pipeline applies it, and checks the mounts again --------------------------------------


class _FakeContainer:
    id = "fake-container"

    def __init__(self) -> None:
        self.exit: ContainerExit | None = None

    def __enter__(self) -> _FakeContainer:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def lines(self, max_line_bytes: int = 0) -> Iterator[str]:
        yield dump_event(ResultEvent())

    def finish(self) -> ContainerExit:
        self.exit = ContainerExit(0, False, "")
        return self.exit

    def kill(self) -> None:
        pass

    def keep(self, process: KeepEvent) -> None:
        pass


class RecordingSandbox:
    """Stands in for DockerSandbox: records each spec and input, runs nothing."""

    def __init__(self) -> None:
        self.started: list[tuple[ContainerSpec, ContainerInput]] = []

    def expected_container(self, group_folder: str) -> str | None:
        return None

    def start(self, spec: ContainerSpec, payload: bytes) -> _FakeContainer:
        self.started.append((spec, decode_input(payload)))
        return _FakeContainer()


def _pipeline(db: Database, env: Env) -> tuple[Pipeline, RecordingSandbox, RecordingChannel]:
    sandbox = RecordingSandbox()
    rec = attach_recorder(db, "alpha@chat")
    return Pipeline(env.settings, db, ChannelRegistry([rec]), sandbox=sandbox), sandbox, rec  # type: ignore[arg-type]


def _say(db: Database, env: Env, text: str = "hello") -> None:
    ingest(db, env.settings, IncomingMessage(chat_jid="alpha@chat", sender="u", content=text), signal=None)


def test_pipeline_builds_the_spec_from_the_group_config(mounted: tuple[Database, Env]) -> None:
    db, env = mounted
    (env.shared / "data-rw").mkdir()
    env.allow({"path": str(env.shared)}, {"path": str(env.shared / "data-rw"), "read_write": True, "groups": ["alpha"]})
    set_container_config(
        db,
        env.settings,
        "alpha@chat",
        {
            "memory": "300m",
            "cpus": 0.5,
            "pids": 48,
            "run_timeout_s": 7,
            "bash_timeout_s": 2,
            "extra_mounts": [
                {"host_path": str(env.shared / "docs")},
                {"host_path": str(env.shared / "data-rw"), "name": "out", "read_write": True},
            ],
        },
    )
    pipeline, sandbox, _ = _pipeline(db, env)
    _say(db, env)
    [outcome] = pipeline.drain_group("alpha@chat")
    assert outcome.run.state == "succeeded", outcome.run.error
    [(spec, payload)] = sandbox.started
    assert (spec.memory, spec.cpus, spec.pids, spec.timeout_s) == ("300m", 0.5, 48, 7)
    assert spec.workspace == env.settings.groups_dir / "alpha"
    assert spec.readonly_mounts == {str(env.shared / "docs"): "/workspace/extra/docs"}
    assert spec.extra_mounts == {str(env.shared / "data-rw"): "/workspace/extra/out"}
    assert payload.limits.bash_timeout_s == 2
    assert (spec.workspace / "extra" / "docs").is_dir() and (spec.workspace / "extra" / "out").is_dir()


def test_pipeline_without_config_keeps_the_settings_defaults(mounted: tuple[Database, Env]) -> None:
    db, env = mounted
    pipeline, sandbox, _ = _pipeline(db, env)
    _say(db, env)
    pipeline.drain_group("alpha@chat")
    [(spec, payload)] = sandbox.started
    s = env.settings
    assert (spec.memory, spec.cpus, spec.pids, spec.timeout_s) == (
        s.sandbox.container_memory,
        s.sandbox.container_cpus,
        s.sandbox.container_pids,
        s.runs.run_timeout_s,
    )
    assert spec.readonly_mounts == {} and spec.extra_mounts == {}
    assert payload.limits.bash_timeout_s == s.runs.bash_timeout_s
    assert not (spec.workspace / "extra").exists()


@pytest.mark.parametrize("change", ["allowlist removed", "root removed", "now blocked"])
def test_run_time_recheck_fails_the_run_with_a_host_message(mounted: tuple[Database, Env], change: str) -> None:
    db, env = mounted
    env.allow({"path": str(env.shared)})
    set_container_config(db, env.settings, "alpha@chat", {"extra_mounts": [{"host_path": str(env.shared / "docs")}]})
    if change == "allowlist removed":
        env.allowlist.unlink()
        reason = "no mount allowlist"
    elif change == "root removed":
        env.allow()
        reason = "not inside any allowed root"
    else:
        env.allow({"path": str(env.shared)}, blocked_patterns=["docs"])
        reason = "blocked pattern 'docs'"
    pipeline, sandbox, rec = _pipeline(db, env)
    _say(db, env)
    [outcome] = pipeline.drain_group("alpha@chat")
    assert outcome.run.state == "failed" and outcome.run.attempts == 1  # not retried
    assert reason in (outcome.run.error or "")
    assert sandbox.started == []  # no container was started
    hosts = [m.content for m in rec.sent if m.message_type == "host"]
    assert len(hosts) == 1 and hosts[0].startswith("⚠️ Agent error") and reason in hosts[0]


def test_a_stored_config_that_no_longer_parses_fails_the_run(mounted: tuple[Database, Env]) -> None:
    from sqlalchemy import update

    from orchestrator.store.tables import GroupRow

    db, env = mounted
    with db.write() as session:
        session.execute(
            update(GroupRow).where(GroupRow.chat_jid == "alpha@chat").values(container_config={"network": "host"})
        )
    pipeline, sandbox, rec = _pipeline(db, env)
    _say(db, env)
    [outcome] = pipeline.drain_group("alpha@chat")
    assert outcome.run.state == "failed" and "never have a network" in (outcome.run.error or "")
    assert sandbox.started == []
    assert len([m for m in rec.sent if m.message_type == "host"]) == 1


def test_container_plan_checks_the_workspace_folder(mounted: tuple[Database, Env]) -> None:
    db, env = mounted
    group = get_group(db, "alpha@chat").model_copy(update={"folder": "../escape"})
    with pytest.raises(MountRefused, match="workspace refused"):
        container_plan(env.settings, group)
