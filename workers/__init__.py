"""Celery side of the orchestrator: the app (``workers.app``) and its thin tasks."""
