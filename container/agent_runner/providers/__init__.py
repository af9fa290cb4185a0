"""Model providers: one model call each (:class:`Provider`), for the runner's turn loop.

Which one a run gets is its row in ``agent_runner/provider_registry.py``."""

from __future__ import annotations

from .base import Provider as Provider
