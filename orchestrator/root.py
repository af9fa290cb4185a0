"""The composition root: one object, built from one ``Settings``, owns the parts.

The database, the Celery app and the signals sent through it, the sandbox
(cold or warm containers), the channel registry and the pipeline are made
here, each on first use, and nowhere else: the Celery tasks
(``workers/``), the HTTP API (``orchestrator/http/api.py``) and the CLI are
handed an :class:`Orchestrator` and take what they need from it.  No module
keeps a settings object, an engine or an app of its own, so a process (a
test, a benchmark) can hold two installations side by side.

Tests swap a part by passing it in: a fake sandbox, a clock that jumps, a
channel registry of recorders.

Building a root from its settings does nothing to the process: it opens and
makes nothing until a part is first used, and sets no process-wide state.  The secrets kept out of log lines and the
trace exporters are the process's, set by its entry point
(``orchestrator/core/process.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any

from orchestrator.core.clock import SYSTEM_CLOCK, Clock
from orchestrator.core.settings import Settings

if TYPE_CHECKING:  # the parts are imported when first made: the CLI starts at once
    from celery import Celery

    from orchestrator.run.outbound import ChannelRegistry, Deliverer
    from orchestrator.run.pipeline import Pipeline
    from orchestrator.run.queue import Signals
    from orchestrator.run.recovery import RecoveryWatch
    from orchestrator.run.sweeper import EgressLogRetention, SweepReport
    from orchestrator.sandbox.containers import DockerSandbox
    from orchestrator.sandbox.port import Sandbox
    from orchestrator.store.db import Database
    from orchestrator.store.hosts import HostHeartbeat

log = logging.getLogger(__name__)


class Orchestrator:
    def __init__(
        self,
        settings: Settings,
        *,
        sandbox: Sandbox | None = None,
        channels: ChannelRegistry | None = None,
        clock: Clock = SYSTEM_CLOCK,
        migrate: bool = True,
        deadline_exceptions: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.settings = settings
        self.clock = clock
        # What the task queue raises when a task is out of time (the worker's
        # Celery soft limit): the pipeline ends such a run timed_out, no retry.
        self.deadline_exceptions = deadline_exceptions
        self._migrate = migrate
        if sandbox is not None:
            self.sandbox = sandbox  # fills the cached_property
        if channels is not None:
            self.channels = channels

    @classmethod
    def from_environment(cls, **parts: Any) -> Orchestrator:
        """Settings from the environment (and ``.env``): what every entry point does."""
        return cls(Settings.load(), **parts)

    # -- the parts, each made on first use ------------------------------------------

    @cached_property
    def db(self) -> Database:
        from orchestrator.store.db import open_database

        return open_database(self.settings, migrate=self._migrate)

    @cached_property
    def celery(self) -> Celery:
        from orchestrator.run.queue import make_celery

        return make_celery(self.settings)

    @cached_property
    def signals(self) -> Signals:
        from orchestrator.run.queue import Signals

        # The app is made when the first signal goes out, not before; a group's drain
        # signal goes to the queue of the host it is placed on (store/placement.py).
        return Signals(lambda: self.celery, placement=self.placed_on)

    def placed_on(self, chat_jid: str) -> str | None:
        """The host ``chat_jid`` is placed on while that host takes groups, else None."""
        from orchestrator.store.placement import placed_on

        return placed_on(self.db, chat_jid)

    @cached_property
    def channels(self) -> ChannelRegistry:
        from orchestrator.channels.registry import build_registry

        return build_registry(self.settings)

    @cached_property
    def docker(self) -> DockerSandbox:
        """Cold containers; also what the sweeper uses to find orphans."""
        from orchestrator.sandbox.containers import DockerSandbox

        return DockerSandbox(self.settings)

    @cached_property
    def sandbox(self) -> Sandbox:
        """Where runs go: a warm container per group when warm sessions are on, else cold ones."""
        if self.settings.sandbox.warm_idle_s > 0:
            from orchestrator.sandbox.warm import WarmPool

            return WarmPool(self.settings, self.docker.client)
        return self.docker

    @cached_property
    def pipeline(self) -> Pipeline:
        from orchestrator.run.pipeline import Pipeline

        return Pipeline(
            self.settings,
            self.db,
            self.channels,
            self.sandbox,
            signal_delivery=self.signals.delivery,
            clock=self.clock,
            deadline_exceptions=self.deadline_exceptions,
        )

    # -- what the entry points do with them -------------------------------------------

    def deliverer(self, *, only_known: bool = True) -> Deliverer:
        from orchestrator.run.outbound import Deliverer

        return Deliverer(self.db, self.settings, self.channels, only_known=only_known)

    def sweep(self) -> SweepReport:
        """Close what dead workers left: runs, signals, containers, delivery claims; free the
        files no message names; delete egress logs past their retention."""
        from orchestrator.run.sweeper import sweep
        from orchestrator.store.files import FileStore

        retention = self._egress_log_retention
        now = time.monotonic()
        days = retention.days_now(now)
        report = sweep(
            self.db,
            signal=self.signals.group,
            sandbox=self.docker,
            signal_delivery=self.signals.delivery,
            resend_channels=self.channels.resent_after_crash(),
            files=FileStore.from_settings(self.db, self.settings),
            file_grace_s=self.settings.files.unreferenced_grace_s,
            egress_log_retention_days=days,
        )
        if days:
            retention.looked(now, report.deleted_egress_logs)
        return report

    @cached_property
    def _egress_log_retention(self) -> EgressLogRetention:
        from orchestrator.run.sweeper import EgressLogRetention

        return EgressLogRetention(self.settings.egress.log_retention_days)

    def host_heartbeat(self, *, concurrency: int) -> HostHeartbeat:
        """This process as its host (``settings.fleet.effective_host_id``) in the hosts table, beaten by a
        thread until stopped; started by the worker's main process.  Give it a root of its own: the
        Docker client that counts warm containers must not be shared with forked pool children."""
        from orchestrator import __version__
        from orchestrator.store.hosts import HostHeartbeat

        return HostHeartbeat(
            self.db,
            host_id=self.settings.fleet.effective_host_id,
            version=__version__,
            concurrency=concurrency,
            warm_count=self.tend_warm_containers,
            machine=self.settings.fleet.machine_id,
            on_cut_off=self.fence_cut_off,
        ).start()

    def recovery_watch(self) -> RecoveryWatch | None:
        """Signals, every ``recovery_interval_s``, the groups whose lease holder is gone (a
        SIGKILLed process of this host, a dead host), started; None when the interval is 0.
        Run by the worker's main process, on the same root of its own as its heartbeat."""
        if self.settings.fleet.recovery_interval_s <= 0:
            return None
        from orchestrator.run.recovery import RecoveryWatch

        return RecoveryWatch(
            self.db,
            host_id=self.settings.fleet.effective_host_id,
            signal=self.signals.group,
            interval_s=self.settings.fleet.recovery_interval_s,
        ).start()

    def tend_warm_containers(self) -> int:
        """Stop this host's warm containers of groups now placed on another host (moved,
        or taken over while this host was away) and unmount their volumes, then count the
        running ones: what the host heartbeat's counting thread does every beat."""
        from orchestrator.sandbox.fencing import release_moved
        from orchestrator.sandbox.warm import WarmPool

        pool = WarmPool(self.settings, self.docker.client)
        running = pool.tend(self.db)
        # Then the volumes of the groups that moved: unmounted here, for their new host's machine.
        release_moved(self.db, self.settings, pool)
        return running

    def fence_cut_off(self, silent_s: float) -> None:
        """This host has not reached the database for ``silent_s``: its warm containers go and
        its idle volumes are unmounted before another host may take its groups (the host
        heartbeat's self-fence, ``store/host_fence.py``)."""
        from orchestrator.sandbox.fencing import fence_cut_off
        from orchestrator.sandbox.warm import WarmPool

        stopped, unmounted = fence_cut_off(self.settings, WarmPool(self.settings, self.docker.client))
        log.warning(
            "cut off from the database for %.1fs: fenced itself: %d warm container(s) stopped, volumes unmounted: %s",
            silent_s,
            stopped,
            ", ".join(unmounted) or "none",
        )

    def stop_idle_warm_containers(self) -> int:
        """As this host's worker stops: its warm containers with no run on them and its
        standby ones (``WarmPool.stop_idle``)."""
        from orchestrator.sandbox.warm import WarmPool

        return WarmPool(self.settings, self.docker.client).stop_idle()

    def after_fork(self) -> None:
        """In a forked pool child: drop the parent's pooled connections (never close them)."""
        if "db" in self.__dict__:
            self.db.dispose()

    def close(self) -> None:
        """Let go of what was made: channels disconnected, Docker and database connections closed."""
        self.__dict__.pop("pipeline", None)
        closers: dict[str, Callable[[Any], object]] = {
            "channels": lambda c: c.close(),
            "docker": lambda d: d.client.close(),
            "db": lambda db: db.dispose(),
        }
        for name, close in closers.items():
            part = self.__dict__.pop(name, None)
            if part is None:
                continue
            try:
                close(part)
            except Exception:  # closing the others matters more
                log.exception("could not close the %s cleanly", name)
