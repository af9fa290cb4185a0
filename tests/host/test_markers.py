"""The markers of what a test needs (tests/markers.py): from its parameters, its fixtures and
the service probes its code calls, followed through the helpers of tests/."""

from __future__ import annotations

import pytest

from tests import markers
from tests.conftest import docker_available, redis_available


def _probes_redis() -> bool:
    return redis_available()


def _calls_a_helper_that_probes() -> None:
    _probes_redis()


class _Engine:
    def ping(self) -> bool:
        return docker_available()


def test_a_probe_is_found_through_helpers_and_classes() -> None:
    assert markers._needs_of(_probes_redis) == {"redis"}
    assert markers._needs_of(_calls_a_helper_that_probes) == {"redis"}
    assert markers._needs_of(_Engine) == {"docker"}
    assert markers._needs_of(test_a_probe_is_found_through_helpers_and_classes) == {"redis", "docker"}


def test_a_database_tests_markers_follow_its_backend(request: pytest.FixtureRequest, db_backend: str) -> None:
    marked = {m.name for m in request.node.iter_markers()} & set(markers.NEEDS)
    assert marked == ({"postgres"} if db_backend == "postgresql" else set())


def test_the_quick_selection_names_every_need() -> None:
    assert markers.QUICK == "not docker and not browser and not postgres and not redis and not integration"
