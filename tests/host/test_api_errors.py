"""The API's one mapping from the exception tree to statuses (orchestrator/http/errors.py), on
its own: the most specific class wins, what each answer carries, and the field a route names."""

from __future__ import annotations

import json

import pytest

from orchestrator.core.errors import (
    BadInput,
    ChangeRefused,
    ConfigError,
    Conflict,
    ContainerConfigError,
    DatabaseUnavailable,
    GroupBusy,
    HostUnavailable,
    InvalidMessage,
    InvalidMessageMetadata,
    MessageNotFound,
    NotFound,
    OrchestratorError,
    RateLimited,
    ReplayLimited,
    ReplayRefused,
    StoreError,
    UnknownGroup,
    UnregisteredChatsFull,
)
from orchestrator.http.errors import bad_input_in, error_response, status_of


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (InvalidMessage("bad"), 400),
        (InvalidMessageMetadata("metadata.version", "must be an integer >= 1"), 400),
        (BadInput("name", "name: must not be null"), 400),
        (ChangeRefused("superseded"), 409),  # an InvalidMessage, but the subclass wins
        (UnknownGroup("a@b"), 404),
        (UnregisteredChatsFull("a@b", 3), 404),
        (MessageNotFound("a@b", "m1"), 404),
        (NotFound("no run 'r'"), 404),
        (Conflict("already registered"), 409),
        (GroupBusy("a run holds the group"), 409),
        (HostUnavailable("h1", [], 9.0), 409),
        (ReplayRefused("no recorded input"), 409),
        (ReplayLimited("quota spent", 2.5), 429),  # a ReplayRefused, but the subclass wins
        (RateLimited("ann", 5, 12), 429),
        (DatabaseUnavailable("restarting", 5), 503),
        (StoreError("something else"), 500),  # the family alone says nothing of the status
        (ConfigError("misconfigured"), 500),
        (OrchestratorError("unmapped"), 500),
    ],
)
def test_the_most_specific_class_gives_the_status(exc: OrchestratorError, status: int) -> None:
    assert status_of(exc) == status
    assert error_response(exc).status_code == status


def _body(exc: OrchestratorError) -> dict[str, object]:
    answer = error_response(exc)
    assert answer.media_type == "application/json"
    body: dict[str, object] = json.loads(bytes(answer.body))
    return body


def test_a_400_names_its_field_when_the_exception_does() -> None:
    assert _body(InvalidMessageMetadata("metadata.version", "must be an integer >= 1")) == {
        "detail": "metadata.version: must be an integer >= 1",
        "field": "metadata.version",
    }
    assert _body(BadInput("sender", "sender 'bot' is the harness's own")) == {
        "detail": "sender 'bot' is the harness's own",
        "field": "sender",
    }
    assert _body(InvalidMessage("sender must not be empty")) == {"detail": "sender must not be empty"}


def test_a_429_and_a_503_say_when_to_come_back_in_whole_seconds() -> None:
    limited = error_response(RateLimited("ann", 5, 12))
    assert limited.headers["Retry-After"] == "12"
    assert _body(RateLimited("ann", 5, 12))["retry_after_s"] == 12
    replay = error_response(ReplayLimited("the fleet's run slots are taken", 0.2))
    assert replay.headers["Retry-After"] == "1"  # never 0: "now" would be refused again
    assert _body(ReplayLimited("quota spent", 61.1))["retry_after_s"] == 62
    down = error_response(DatabaseUnavailable("restarting", 5))
    assert down.headers["Retry-After"] == "5" and _body(DatabaseUnavailable("restarting", 5))["retry_after_s"] == 5
    assert "Retry-After" not in error_response(NotFound("no run 'r'")).headers


def test_bad_input_in_names_the_field_of_the_kinds_given_only() -> None:
    with pytest.raises(BadInput) as caught, bad_input_in("model", ConfigError, prefix="model: "):
        raise ContainerConfigError("unknown provider 'x'")  # a ConfigError
    assert caught.value.field == "model" and str(caught.value) == "model: unknown provider 'x'"
    assert isinstance(caught.value.__cause__, ContainerConfigError)
    with pytest.raises(NotFound), bad_input_in("model", ConfigError):
        raise NotFound("no run 'r'")  # not of the kinds: on as it is, a 404
