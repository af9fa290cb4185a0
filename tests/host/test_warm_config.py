"""A warm container's configuration is everything it is created with (issue 44, finding 3):
a group's running container is not handed a run that needs another runtime (runc -> gVisor),
another security option or user, or any other create argument, present or added later.
Computed from the very create arguments of ``orchestrator/sandbox/warm/configuration.py`` with no engine:
the engine's answers (its security options, its runtime) are the inputs that vary here."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.settings import Settings
from orchestrator.sandbox.containers import LABEL_RUN, ContainerSpec
from orchestrator.sandbox.runtime import RUNC, Runtime
from orchestrator.sandbox.warm import (
    LABEL_WARM_CONFIG,
    PER_CONTAINER_ARGS,
    PER_RUN_SPEC_FIELDS,
    config_hash,
    warm_create_args,
)

SPEC = ContainerSpec(
    image="orchestrator-agent:latest",
    name="orch-run-1",
    workspace=Path("/data/groups/team"),
    run_id="run-1",
    group_folder="team",
    install_id="inst",
)
IMAGE_ID = "sha256:" + "a" * 64
GVISOR = Runtime("runsc", True)


def args_of(settings: Settings, spec: ContainerSpec = SPEC, **engine: Any) -> dict[str, Any]:
    how: dict[str, Any] = {
        "user": "1000:1000",
        "security_opt": ["no-new-privileges", "apparmor=docker-default"],
        "runtime": RUNC,
        "host_id": "host-a",
        "idle_s": 60.0,
        **engine,
    }
    return warm_create_args(settings, spec, **how)


def key(settings: Settings, spec: ContainerSpec = SPEC, **engine: Any) -> str:
    return config_hash(IMAGE_ID, args_of(settings, spec, **engine))


def test_a_container_made_under_runc_does_not_serve_a_run_under_gvisor(settings: Settings) -> None:
    assert key(settings) == key(settings)  # stable: compared with the label of a container made earlier
    assert key(settings, runtime=GVISOR) != key(settings)


@pytest.mark.parametrize(
    "engine",
    [
        {"security_opt": ["no-new-privileges"]},  # AppArmor dropped
        {"security_opt": ["no-new-privileges", "apparmor=docker-default", "seccomp=/etc/agent.json"]},
        {"user": "0:0"},
        {"idle_s": 120.0},
        {"host_id": "host-b"},
    ],
    ids=["apparmor", "seccomp", "user", "idle", "host"],
)
def test_every_security_option_is_in_the_configuration(settings: Settings, engine: dict[str, Any]) -> None:
    assert key(settings, **engine) != key(settings)


def _changed(value: object) -> object:
    """Another value of ``value``'s kind (a new field of a kind not here fails the test: add it)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, Path):
        return value / "other"
    if isinstance(value, dict):
        return {**value, "/host/other": "/workspace/extra/other"}
    raise AssertionError(f"no other value known for {value!r}; teach _changed its kind")


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(ContainerSpec)])
def test_each_field_of_a_container_spec_is_in_the_key_or_listed_as_a_runs(settings: Settings, name: str) -> None:
    """A field added to ContainerSpec later: in the configuration, or named a run's own."""
    change: dict[str, Any] = {name: _changed(getattr(SPEC, name))}
    other = dataclasses.replace(SPEC, **change)
    if name in PER_RUN_SPEC_FIELDS:
        assert key(settings, other) == key(settings), f"{name} is listed as a run's own but changes the container"
    else:
        assert key(settings, other) != key(settings), (
            f"ContainerSpec.{name} does not reach the warm configuration: put it in the create arguments "
            "or list it in warm.PER_RUN_SPEC_FIELDS"
        )


def test_each_create_argument_is_in_the_key_but_the_containers_name(settings: Settings) -> None:
    """Whatever the create arguments hold, now or once an option is added, is compared."""
    base = args_of(settings)
    assert {"runtime", "security_opt", "cap_drop", "read_only", "user", "network_mode", "pids_limit"} <= set(base)
    assert {"mem_limit", "nano_cpus", "volumes", "tmpfs", "command", "image"} <= set(base)
    for name, value in base.items():
        changed = copy.deepcopy(base)
        if isinstance(value, dict):
            changed[name] = {**value, "orchestrator.other": "1"}
        else:
            changed[name] = not value if isinstance(value, bool) else [value, "other"]
        if name in PER_CONTAINER_ARGS:
            assert config_hash(IMAGE_ID, changed) == config_hash(IMAGE_ID, base), name
        else:
            assert config_hash(IMAGE_ID, changed) != config_hash(IMAGE_ID, base), name
    # A run's label and the configuration label itself name, they do not configure.
    labelled = copy.deepcopy(base)
    labelled["labels"] = {**base["labels"], LABEL_RUN: "run-2", LABEL_WARM_CONFIG: "x"}
    assert config_hash(IMAGE_ID, labelled) == config_hash(IMAGE_ID, base)
    assert config_hash("sha256:" + "b" * 64, base) != config_hash(IMAGE_ID, base)  # a rebuilt image
