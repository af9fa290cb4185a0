"""The command line: ``orchestrator ...``, the terminal chat and the supervisor.

The top floor.  ``main`` must start at once (``orchestrator --help`` is
measured by ``bench/cli.py``): a command imports what it uses inside its own
body, never at module level.
"""
