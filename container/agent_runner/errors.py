"""Exceptions the runner maps to an ``ErrorEvent`` and an exit code.

One root (:class:`RunnerError`) so ``__main__`` can tell an expected failure
(reported cleanly, no traceback) from a bug (logged with a traceback).
"""

from __future__ import annotations


class RunnerError(Exception):
    """Any failure the runner knows how to report."""


class InputError(RunnerError):
    """The ContainerInput is valid JSON but unusable (exit code 2, like a validation error)."""


class ProviderError(RunnerError):
    """The model provider failed.

    ``retryable`` tells the host whether running the same input again may
    succeed (rate limits, 5xx, connection problems) or is pointless (a 4xx
    such as a malformed request or an unknown model).
    """

    def __init__(self, message: str, *, retryable: bool, status_code: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status_code = status_code
