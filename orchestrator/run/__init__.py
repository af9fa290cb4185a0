"""The run path: a stored message becomes an agent run becomes stored, delivered replies.

Ingest and routing, the queue (Celery signals and the embedded broker), the
pipeline and what it assembles for the model, the run's outputs and
notices, the outbound port (channels by name and the deliverer), the
sweeper and schedules.  Imports ``core``, ``model``, ``store`` and
``sandbox``; channel adapters reach it through ``run.outbound.Channel``.
"""
