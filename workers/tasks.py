"""Thin Celery tasks: decode the signal, call orchestrator code, report.

``drain_group`` carries only a chat id.  Getting it twice, late, or for a
group that another worker is already serving is harmless: the pipeline's
lease makes the extra copy return at once.
"""

from __future__ import annotations

from functools import lru_cache

from orchestrator.channels import ChannelRegistry, LogChannel
from orchestrator.db import get_database
from orchestrator.pipeline import Pipeline
from orchestrator.queue import DRAIN_TASK
from orchestrator.settings import get_settings

from .app import app


@lru_cache(maxsize=1)
def _pipeline() -> Pipeline:
    settings = get_settings()
    channels = ChannelRegistry(settings.assistant_name)
    channels.add(LogChannel())
    return Pipeline(settings, get_database(settings), channels)


@app.task(name=DRAIN_TASK, bind=True, acks_late=True)
def drain_group(self, chat_jid: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    outcomes = _pipeline().drain_group(chat_jid, task_id=self.request.id)
    return {
        "chat_jid": chat_jid,
        "runs": [{"id": o.run.id, "state": o.run.state, "outputs": len(o.stored)} for o in outcomes],
    }
