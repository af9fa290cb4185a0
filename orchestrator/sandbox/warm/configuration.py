"""What a warm container is created with, and the configuration that names it.

A group's warm container is created with the hardened arguments of any agent
container (``containers.hardened_create_args``), its gateway folder read-only, the
runner's serve command and the warm labels.  All of those arguments but what names
the one container are hashed into its *configuration* (:func:`config_hash`), kept
on it as :data:`LABEL_WARM_CONFIG`: a run that needs anything else (its image
changed, another runtime, a security option, a limit, a mount) is not handed to
it, and the container is replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import docker

from orchestrator.core.settings import Settings
from orchestrator.sandbox.containers import (
    GATEWAY_MOUNT,
    LABEL_RUN,
    LABEL_WARM,
    WORKSPACE_MOUNT,
    ContainerSpec,
    container_user,
    engine_security_opt,
    hardened_create_args,
)
from orchestrator.sandbox.runtime import Runtime, engine_runtime
from orchestrator.sandbox.warm.records import gateway_dir

LABEL_WARM_CONFIG = "orchestrator.warm-config"
# The host (ORCHESTRATOR_HOST_ID) whose container it is: hosts may share a Docker
# engine (compose's scaled workers), and each serves its own groups' runs.
LABEL_HOST = "orchestrator.host"
# The warm runner's socket, relative to the workspace (where the runner binds it).
RUNNER_SOCKET = ".orchestrator/agent.sock"
# Bumped when the mounts of a warm container change: older ones are replaced.
WARM_LAYOUT = 3

# What names one warm container rather than what it is: left out of its configuration.
# Everything else it is created with is in it (:func:`config_hash`), so an option added to
# the create arguments later is too, unlisted.
PER_CONTAINER_ARGS = frozenset({"name"})
PER_CONTAINER_LABELS = frozenset({LABEL_RUN, LABEL_WARM_CONFIG})
# The fields of a ContainerSpec that are one run's and never reach a warm container's
# create arguments: the runs it serves may differ in them.  Every other field must change
# the configuration (tests/host/test_warm_config.py holds both lists to that).
PER_RUN_SPEC_FIELDS = frozenset({"name", "run_id", "timeout_s", "fence_s"})


def warm_create_args(
    settings: Settings,
    spec: ContainerSpec,
    *,
    user: str,
    security_opt: list[str],
    runtime: Runtime,
    host_id: str,
    idle_s: float,
) -> dict[str, Any]:
    """``containers.create``'s keyword arguments for the group's warm container: the hardened
    ones every agent container gets (user, runtime, security options, capabilities, read-only
    root, limits, network, mounts), its gateway folder read-only, its serve command, its
    labels (with no run's, and not yet :data:`LABEL_WARM_CONFIG`)."""
    args: dict[str, Any] = dict(hardened_create_args(spec, user, security_opt, runtime))
    args["volumes"][str(gateway_dir(settings, spec.group_folder))] = {"bind": GATEWAY_MOUNT, "mode": "ro"}
    labels = {**args["labels"], LABEL_WARM: "1", LABEL_HOST: host_id}
    labels.pop(LABEL_RUN, None)
    args["labels"] = labels
    args["name"] = f"orch-warm-{spec.group_folder}-{os.urandom(3).hex()}"
    args["command"] = ["--serve", f"{WORKSPACE_MOUNT}/{RUNNER_SOCKET}", "--idle-timeout", f"{idle_s:g}"]
    args["auto_remove"] = True
    return args


def config_hash(image: str, args: dict[str, Any]) -> str:
    """The warm configuration a container created with ``args`` (:func:`warm_create_args`)
    serves; ``image``: the id of its image's tag.  All of ``args`` but what names the one
    container: a run needing anything else (another runtime, security option, limit, mount)
    is not handed to it, and the container is replaced."""
    doc = {key: value for key, value in args.items() if key not in PER_CONTAINER_ARGS}
    doc["labels"] = {k: v for k, v in args["labels"].items() if k not in PER_CONTAINER_LABELS}
    doc["image_id"] = image
    # Containers of an older layout (sockets in a writable session folder) are replaced.
    doc["layout"] = WARM_LAYOUT
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def create_args_here(
    settings: Settings, client: docker.DockerClient, spec: ContainerSpec, idle: float
) -> dict[str, Any]:
    """The group's warm container's create arguments on this engine, this host, now
    (the engine's answers are asked once per process)."""
    return warm_create_args(
        settings,
        spec,
        user=container_user(),
        security_opt=engine_security_opt(client),
        runtime=engine_runtime(client, settings),
        host_id=settings.fleet.effective_host_id,
        idle_s=idle,
    )


def config_here(settings: Settings, client: docker.DockerClient, image: str, spec: ContainerSpec, idle: float) -> str:
    """The warm configuration a run of ``spec`` needs (:func:`config_hash`)."""
    return config_hash(image, create_args_here(settings, client, spec, idle))
