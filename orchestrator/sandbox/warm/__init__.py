"""Warm sessions: a group's container stays up between runs.

A cold run pays for a container start and an interpreter start each time.
With ``ORCHESTRATOR_WARM_IDLE_S`` > 0 a group's container is started in the
runner's serve mode (``agent_runner/serve.py``) with the same hardening and
the group's workspace; the runner binds its socket in the workspace
(``.orchestrator/agent.sock``).  A run connects to it (any worker process on
this host can: the container is found by its labels, not held by a
process), writes the input line and reads event lines.  The workspace is
the agent's, so the socket is reached as hostile_fs reaches anything there:
no symlink followed, a socket or nothing.  After each run everything the run
left running is killed (:mod:`.cleanup`).

* idle: the runner exits after the idle timeout and Docker removes it
  (auto-remove); nothing on the host has to remember it;
* crashed or stale (its image changed, or anything it is created with: the
  runtime, a security option, a limit, a mount; :func:`config_hash`): replaced
  before the run, transparently;
* a run that times out or is cancelled kills the container: the next run
  starts a fresh one;
* ``orchestrator groups reset JID`` stops it and forgets the group's model
  session;
* too many: a host keeps at most ``warm_cap`` warm containers (:mod:`.sizing`);
* a group placed on another host (``orchestrator/store/placement.py``: moved,
  or taken over while this host was away): this host stops it
  (:mod:`.tending`, from the host heartbeat's counting thread).  A
  container carries its host's id (``orchestrator.host``) and a host runs
  only on its own: hosts may share a Docker engine.

The run's model gateway socket, if any, is bound in the group's gateway
folder, host-only and mounted read-only at ``/run/gateway``.

The package, one concept a module:

* :mod:`.pool`: ``WarmPool``, the pipeline's sandbox, a run's container had;
* :mod:`.configuration`: what a warm container is created with, and its hash;
* :mod:`.records`: the host's markers, adoption records and lock;
* :mod:`.inventory`: the warm containers found on the engine, and removed;
* :mod:`.known`: the container a process last used, reached with no Docker call;
* :mod:`.making`: a container claimed, adopted from standby, or created;
* :mod:`.sockets`: the runner's socket reached;
* :mod:`.run`: ``WarmRun``, one run on a warm container;
* :mod:`.cleanup`: what a run left running, killed before the next;
* :mod:`.sizing`: the cap, and the least recently used stopped past it;
* :mod:`.tending`: the heartbeat's tending, dead hosts' containers removed;
* :mod:`.stopping`: containers stopped on purpose (a reset, a stop, a fence).
"""

from orchestrator.sandbox.warm.cleanup import kill_all_but
from orchestrator.sandbox.warm.configuration import (
    LABEL_HOST,
    LABEL_WARM_CONFIG,
    PER_CONTAINER_ARGS,
    PER_CONTAINER_LABELS,
    PER_RUN_SPEC_FIELDS,
    RUNNER_SOCKET,
    config_hash,
    warm_create_args,
)
from orchestrator.sandbox.warm.pool import WarmPool
from orchestrator.sandbox.warm.records import Adoption, gateway_dir, host_only_dir, state_dir
from orchestrator.sandbox.warm.run import StartMode, WarmRun
from orchestrator.sandbox.warm.sizing import MAX_AUTO_WARM, MIN_WARM, host_memory_bytes, warm_cap

__all__ = [
    "LABEL_HOST",
    "LABEL_WARM_CONFIG",
    "MAX_AUTO_WARM",
    "MIN_WARM",
    "PER_CONTAINER_ARGS",
    "PER_CONTAINER_LABELS",
    "PER_RUN_SPEC_FIELDS",
    "RUNNER_SOCKET",
    "Adoption",
    "StartMode",
    "WarmPool",
    "WarmRun",
    "config_hash",
    "gateway_dir",
    "host_memory_bytes",
    "host_only_dir",
    "kill_all_but",
    "state_dir",
    "warm_cap",
    "warm_create_args",
]
