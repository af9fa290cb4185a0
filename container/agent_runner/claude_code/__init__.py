"""The ``claude-code`` provider: Claude Code (the Claude Agent SDK) drives the run.

Only in the image variant built for it (``orchestrator image build
--variant claude-code``), which adds the SDK and its bundled CLI.
"""
