"""What a process sets for its whole life: made by its entry point, never by a composition root.

Two things of a process cannot be parts of an :class:`~orchestrator.root.Orchestrator`:

* the secret values kept out of what it writes (``orchestrator/core/secrets.py``): log
  records are cleaned by a filter on the root logger's handler, far from any root, and
  run errors, 🏠 messages and delivery errors by store and run code that is handed no
  root; so the values sit in one registry of the process;
* its trace exporters (``orchestrator/core/tracing.py``): spans are opened by module
  functions all along the run path, in OpenTelemetry's context, which is the process's.

So each entry point calls :func:`set_up_process` once it has its settings: a worker's and
beat's logging set-up (``workers/app.py``), the CLI's ``setup()``
(``orchestrator/cli/support.py``), the API server's factory (``serve_app``).  Building a
root sets neither: a process that builds two roots with different settings (a test, a
benchmark) gets nothing of the first one's in the second.

Idempotent: a value hidden twice is hidden once, and the first call's exporters stand
(the entry points of one process read one environment).
"""

from __future__ import annotations

from orchestrator.core import secrets, tracing
from orchestrator.core.settings import Settings


def set_up_process(settings: Settings) -> None:
    """Hide ``settings``' secrets from everything this process writes, and start its trace
    exporters (``OTEL_TRACES_EXPORTER``; ``none`` imports nothing)."""
    secrets.hide(settings.secrets())
    tracing.configure(settings)
