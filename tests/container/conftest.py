"""Fixtures for the agent runner's tests (defined in ``runner_harness``)."""

from runner_harness import run_runner, workspace

__all__ = ["run_runner", "workspace"]
