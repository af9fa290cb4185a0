"""The typed message model: messages, envelopes, views, rendering, context items.

Pure data and pure functions: no database, no Docker, no network.  Imports
only ``orchestrator.core``.
"""
