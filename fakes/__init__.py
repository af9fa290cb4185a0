"""Doubles of the services around the orchestrator, shared by ``tests/`` and ``bench/``.

A fake sandbox and clock that drive the pipeline without Docker or sleeps, fake model APIs
(Anthropic, OpenAI, the Claude Agent SDK), fake Telegram and Slack (Web API and Socket Mode),
an OTLP collector, a webhook receiver and a recording channel.  Importable from the checkout
(the repository's root on the path, as for ``tests``); never shipped, and never imported by
the product: ``orchestrator``, ``workers`` and ``agent_runner`` are forbidden to import it
(the import contract in pyproject.toml's ``[tool.importlinter]``).

A fake server's threads are named ``fake-...`` and joined when the fake stops: the test run
fails if one is still running at its end (``tests/conftest.py``).
"""
