"""Channel adapters: where stored messages are shown and where messages come in.

The log and webhook channels, Telegram and Slack (plugins), and the registry a process
builds from its settings.  They implement ``orchestrator.run.outbound.Channel``
and hand incoming messages to ``orchestrator.run.ingest``.  Imported by the
faces and the workers, never by the run path.
"""
