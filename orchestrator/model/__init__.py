"""The typed message model: messages, envelopes, views, rendering, context items.

Pure data and pure functions: no database, no Docker, no network.  Imports
only ``orchestrator.core``, and the envelope Structs of the container protocol
(``agent_runner.protocol``), the one schema the runner builds with.
"""
