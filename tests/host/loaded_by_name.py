"""Every module of ours the code loads by its name: the imports import-linter cannot see.

Each entry says where the name is written, how it is loaded, which module it is
loaded for (the importer the layer contracts must allow; None: a process's own
entry point, which nothing imports) and every module it can load, as ``module``
or ``module:attribute``.  ``tests/host/test_layers.py`` holds this list to the
tree: each target exists and loads (its attribute too), each loader may import
each target under the contracts of ``pyproject.toml`` (checked by import-linter
with these imports added to its graph), and every file that loads a module of
ours by name, or writes one's full name, is here.

Names that look like loads and are not (not checked as imports):

* the task names ``workers.tasks.drain_group`` and the like
  (``orchestrator/run/queue.py``): Celery looks a task up by name in the
  registry of the worker's app, which ``workers/app.py`` fills when it builds
  the app; the name is never imported;
* Docker labels, span attributes and logger names that share a module's name
  (:data:`NOT_LOADS`);
* the Alembic migrations (``orchestrator/store/migrations/env.py`` and
  ``versions/``), run by Alembic from their folder (``script_location``, set by
  ``orchestrator/store/db.py``), inside the store room;
* the agent runner's SDK imports (``container/agent_runner/providers/``): other
  packages, loaded in the container.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoadedByName:
    where: str  # the file that writes the name, from the checkout's root
    how: str
    loader: str | None  # the module it is loaded for; None: a process's entry point
    targets: tuple[str, ...]  # "module" or "module:attribute"
    # Why this load breaks a contract and what ends that; empty: it keeps them all.
    exception: str = ""


LOADED_BY_NAME: tuple[LoadedByName, ...] = (
    LoadedByName(
        where="orchestrator/__init__.py",
        how="_LAZY: the package's public names, imported on first use (PEP 562 __getattr__)",
        loader="orchestrator",
        targets=(
            "orchestrator.model.messages:MessageType",
            "orchestrator.model.messages:StoredMessage",
            "orchestrator.model.views:format_messages_for_sdk",
            "orchestrator.store.message_log:get_messages_after",
            "orchestrator.store.message_log:get_messages_since",
            "orchestrator.store.message_log:store_message_direct",
        ),
    ),
    LoadedByName(
        where="orchestrator/channels/registry.py",
        how="ORCHESTRATOR_CHANNEL_PLUGINS, module:factory entries (and the _RENAMED old paths)",
        loader="orchestrator.channels.registry",
        targets=("orchestrator.channels.telegram:channel", "orchestrator.channels.slack:channel"),
    ),
    LoadedByName(
        where="orchestrator/run/queue.py",
        how="kombu's broker_transport, module:Class, in every process that talks to the broker",
        loader="orchestrator.run.queue",
        targets=("orchestrator.run.fs_transport:Transport", "orchestrator.run.redis_transport:Transport"),
    ),
    LoadedByName(
        where="orchestrator/core/logs.py",
        how="logging.config's '()' factories, in dict_config and uvicorn's --log-config file",
        loader="orchestrator.core.logs",
        targets=(
            "orchestrator.core.logs:json_formatter",
            "orchestrator.core.logs:text_formatter",
            "orchestrator.core.logs:ContextFilter",
        ),
    ),
    LoadedByName(
        where="orchestrator/cli/supervisor.py",
        how="celery -A workers.app worker / beat, the processes the CLI starts",
        loader="orchestrator.cli.supervisor",
        targets=("workers.app:app",),
    ),
    LoadedByName(
        where="orchestrator/cli/processes.py",
        how="celery -A workers.app flower",
        loader="orchestrator.cli.processes",
        targets=("workers.app:app",),
    ),
    LoadedByName(
        where="orchestrator/cli/supervisor.py",
        how="uvicorn --factory, the API server the CLI starts",
        loader="orchestrator.cli.supervisor",
        targets=("orchestrator.http.api:serve_app",),
    ),
    LoadedByName(
        where="pyproject.toml",
        how="[project.scripts]: the `orchestrator` console script",
        loader=None,
        targets=("orchestrator.cli.entry:main",),
    ),
)

# Strings that are a module's full name but load nothing, by file: (the string, what it is).
NOT_LOADS: dict[str, tuple[tuple[str, str], ...]] = {
    "orchestrator/run/queue.py": tuple(
        (f"workers.tasks.{task}", "a task's name, looked up in the worker app's registry")
        for task in ("drain_group", "sweep", "fire_schedules", "deliver", "replay_run")
    ),
    "orchestrator/sandbox/containers.py": (("orchestrator.run", "a Docker label (LABEL_RUN)"),),
    "workers/app.py": (("orchestrator.core.metrics", "looked for in sys.modules, never imported by name"),),
}
