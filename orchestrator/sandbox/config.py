"""A group's ``container_config``: per-group sandbox limits and extra mounts.

Stored as JSON on the group row, validated (unknown keys refused) when set
with ``orchestrator groups set JID --container-config JSON``, and applied on
top of the settings' defaults each time a run container is built.

What a group may change, and what it may not:

* ``memory`` (``"768m"``, ``"2g"``; at least 32m), ``cpus``, ``pids`` (16 to
  32768): raised or lowered; they bound the container, not its privileges;
* ``run_timeout_s``: only lowered (the worker's Celery time limits derive
  from ``ORCHESTRATOR_RUN_TIMEOUT_S``, so a longer run would be cut anyway);
* ``bash_timeout_s``: one shell command's limit, raised or lowered;
* ``workspace_quota`` (``"2g"``; ``"0"``: none): the disk the workspace may
  take, raised or lowered (``orchestrator/sandbox/quota/``); a volume already made
  is never shrunk, so a quota below its size is refused here;
* ``extra_mounts``: host folders under ``/workspace/extra/<name>``, only as
  the mount allowlist allows (``orchestrator/sandbox/mounts.py``);
* ``network`` may only be ``"none"`` and ``read_only_root`` only ``true``:
  they are accepted so a config can state them, never loosened.  Neither
  are the user (never root), the dropped capabilities, no-new-privileges or
  the tmpfs ``/tmp``: there is no key for them at all.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator.core.errors import ContainerConfigError, UnknownGroup
from orchestrator.core.jsontypes import WHOLE_NUMBER, JsonObject
from orchestrator.core.settings import Settings
from orchestrator.core.sizes import human_size, memory_bytes, parse_quota
from orchestrator.sandbox.egress_policy import EgressPolicy
from orchestrator.sandbox.mounts import (
    MountRequest,
    ResolvedMount,
    group_workspace,
    prepare_mountpoints,
    resolve_mounts,
)
from orchestrator.sandbox.quota import Volume, prepare_workspace, workspace_quota_bytes
from orchestrator.store.db import Database
from orchestrator.store.groups import Group, get_group, store_container_config

MIN_MEMORY_BYTES = 32 * 1024**2
MAX_PIDS = 32768
MAX_CPUS = 256.0
MAX_EXTRA_MOUNTS = 16


# The plain forms of a memory size of at least 32m and of a workspace quota ("0", or 16m to 16t), as
# the API's document states them; the validators take more spellings ("33554432", "2G", "1t").
MEMORY_SCHEMA_PATTERN = r"^([1-9][0-9]*g|(3[2-9]|[4-9][0-9]|[1-9][0-9]{2,})m)$"
QUOTA_SCHEMA_PATTERN = r"^(0|(1[6-9]|[2-9][0-9]|[1-9][0-9]{2,5})m|[1-9][0-9]{0,3}g)$"


class ContainerConfig(BaseModel):
    """What a group's run containers may differ in (see the module docstring)."""

    # Strict: JSON's types as they are (no "64" for 64), as the API's document states them.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    memory: str | None = Field(default=None, json_schema_extra={"pattern": MEMORY_SCHEMA_PATTERN})
    cpus: float | None = Field(default=None, gt=0, le=MAX_CPUS)
    pids: Annotated[int, Field(ge=16, le=MAX_PIDS), WHOLE_NUMBER] | None = None
    run_timeout_s: float | None = Field(default=None, gt=0)
    bash_timeout_s: float | None = Field(default=None, gt=0)
    workspace_quota: str | None = Field(default=None, json_schema_extra={"pattern": QUOTA_SCHEMA_PATTERN})
    network: Literal["none"] = "none"
    # What the sandbox may reach through the host's egress proxy (its device stays "none").
    egress: EgressPolicy = Field(default_factory=EgressPolicy)
    read_only_root: Literal[True] = True
    extra_mounts: list[MountRequest] = Field(default_factory=list, max_length=MAX_EXTRA_MOUNTS)

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if memory_bytes(v) < MIN_MEMORY_BYTES:
            raise ValueError(f"{v!r} is below the 32m minimum")
        return v.strip().lower()

    @field_validator("workspace_quota")
    @classmethod
    def _quota(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parse_quota(v)
        return v.strip().lower()

    @field_validator("network", mode="before")
    @classmethod
    def _no_network(cls, v: object) -> object:
        if v != "none":
            raise ValueError("run containers never have a network; only 'none' is accepted")
        return v

    @field_validator("read_only_root", mode="before")
    @classmethod
    def _read_only(cls, v: object) -> object:
        if v is not True:
            raise ValueError("the container's root filesystem is always read-only; only true is accepted")
        return v

    @model_validator(mode="after")
    def _distinct_mounts(self) -> ContainerConfig:
        names: list[str] = []
        for i, m in enumerate(self.extra_mounts):
            try:
                names.append(m.mount_name)
            except ValueError as exc:
                raise ValueError(f"extra_mounts[{i}]: {exc}") from exc
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"extra_mounts: names must be distinct, {sorted(dup)} repeat")
        return self


def parse_container_config(raw: str | Mapping[str, Any] | None) -> ContainerConfig:
    """A JSON text or mapping -> :class:`ContainerConfig`; errors name the field."""
    if raw is None:
        return ContainerConfig()
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ContainerConfigError(f"container_config is not valid JSON: {exc}") from exc
    if not isinstance(raw, Mapping):
        raise ContainerConfigError("container_config must be a JSON object")
    try:
        return ContainerConfig.model_validate(dict(raw))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in ("container_config", *err["loc"]))
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise ContainerConfigError(f"{where}: {msg}") from exc


@dataclass(frozen=True)
class EffectiveLimits:
    memory: str
    cpus: float
    pids: int
    run_timeout_s: float
    bash_timeout_s: float


def effective_limits(settings: Settings, group_config: ContainerConfig | Mapping[str, Any] | None) -> EffectiveLimits:
    """The settings' sandbox limits with the group's overrides applied."""
    cfg = group_config if isinstance(group_config, ContainerConfig) else parse_container_config(group_config)
    run_timeout = settings.runs.run_timeout_s
    if cfg.run_timeout_s is not None:
        run_timeout = min(cfg.run_timeout_s, run_timeout)  # only ever shortened
    return EffectiveLimits(
        memory=cfg.memory or settings.sandbox.container_memory,
        cpus=cfg.cpus if cfg.cpus is not None else settings.sandbox.container_cpus,
        pids=cfg.pids if cfg.pids is not None else settings.sandbox.container_pids,
        run_timeout_s=run_timeout,
        bash_timeout_s=cfg.bash_timeout_s if cfg.bash_timeout_s is not None else settings.runs.bash_timeout_s,
    )


def workspace_quota(settings: Settings, group_config: ContainerConfig | Mapping[str, Any] | None) -> int:
    """The group's workspace quota in bytes (0: none): its own, else the settings'."""
    cfg = group_config if isinstance(group_config, ContainerConfig) else parse_container_config(group_config)
    return parse_quota(cfg.workspace_quota) if cfg.workspace_quota is not None else workspace_quota_bytes(settings)


@dataclass(frozen=True)
class ContainerPlan:
    """What one run container of a group gets, checked just now."""

    workspace: Path
    limits: EffectiveLimits
    mounts: list[ResolvedMount]
    # What the sandbox may reach through the egress proxy (sandbox/egress_policy.py).
    egress: EgressPolicy = field(default_factory=EgressPolicy)

    @property
    def read_write_mounts(self) -> dict[str, str]:
        return {str(m.host): m.container for m in self.mounts if m.read_write}

    @property
    def read_only_mounts(self) -> dict[str, str]:
        return {str(m.host): m.container for m in self.mounts if not m.read_write}


def container_plan(settings: Settings, group: Group) -> ContainerPlan:
    """Limits and mounts for a run of ``group``, re-checked against the allowlist as it is now.

    The workspace is put under its quota first (``quota.prepare_workspace``:
    its volume mounted, or its usage checked), so the extra mount points
    below are made inside it.

    Raises :class:`ContainerConfigError` or :class:`~orchestrator.core.errors.MountRefused`
    (:class:`~orchestrator.core.errors.WorkspaceQuotaError` for the quota).
    """
    cfg = parse_container_config(group.container_config)
    workspace = group_workspace(settings, group.folder)
    prepare_workspace(settings, group.folder, workspace, workspace_quota(settings, cfg), chat_jid=group.chat_jid)
    mounts = resolve_mounts(
        settings, cfg.extra_mounts, folder=group.folder, is_main=group.is_main, chat_jid=group.chat_jid
    )
    prepare_mountpoints(workspace, mounts)
    return ContainerPlan(workspace, effective_limits(settings, cfg), mounts, cfg.egress)


def set_container_config(db: Database, settings: Settings, chat_jid: str, raw: str | Mapping[str, Any] | None) -> Group:
    """Validate and store a group's container config (None or ``{}`` clears it).

    Refused here, before anything is stored: unknown keys, bad values, a
    ``run_timeout_s`` above the settings', and every mount the allowlist does
    not allow right now.
    """
    group = get_group(db, chat_jid)
    stored = check_container_config(settings, group, raw)
    if not store_container_config(db, chat_jid, stored):
        raise UnknownGroup(chat_jid)
    return get_group(db, chat_jid)


def check_container_config(settings: Settings, group: Group, raw: str | Mapping[str, Any] | None) -> JsonObject | None:
    """``group``'s container config as it is stored (None: cleared), checked as
    :func:`set_container_config` checks it; raises ContainerConfigError or MountRefused."""
    cfg = parse_container_config(raw)
    if cfg.run_timeout_s is not None and cfg.run_timeout_s > settings.runs.run_timeout_s:
        raise ContainerConfigError(
            f"container_config.run_timeout_s: {cfg.run_timeout_s:g} is above ORCHESTRATOR_RUN_TIMEOUT_S "
            f"({settings.runs.run_timeout_s:g}); a group may only shorten it"
        )
    if cfg.workspace_quota is not None:
        volume = Volume.of(settings, group.folder)
        quota = parse_quota(cfg.workspace_quota)
        if quota and quota < volume.size():
            raise ContainerConfigError(
                f"container_config.workspace_quota: {cfg.workspace_quota} is below the size of the group's "
                f"workspace volume ({human_size(volume.size())}, {volume.image}); volumes only grow"
            )
    resolve_mounts(settings, cfg.extra_mounts, folder=group.folder, is_main=group.is_main, chat_jid=group.chat_jid)
    return cfg.model_dump(mode="json", exclude_defaults=True) or None
