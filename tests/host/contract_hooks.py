"""schemathesis hooks for tests/host/test_api_contract.py (loaded by the ``st`` process).

``POST /webhooks/inbound`` takes a body signed with the inbound webhook secret
(over a timestamp, a fresh nonce and the body): unsigned, every generated request
would stop at the 401 and its body would never be checked.  So each request to
it is signed here the way a sender signs, over the bytes that go on the wire:
requests' ``json=`` serialization (``json.dumps(body, allow_nan=False)``,
UTF-8), which is what schemathesis sends a JSON body with.  The secret comes
from ``CONTRACT_WEBHOOK_SECRET``.  ``POST /slack/events`` likewise, with Slack's v0
signature over a timestamp and the body, and ``CONTRACT_SLACK_SECRET``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import schemathesis
from schemathesis.core import NotSet

from orchestrator.channels.slack_inbound import EVENTS_PATH, signed_headers
from orchestrator.channels.webhook import INBOUND_PATH, inbound_headers

SECRET = os.environ["CONTRACT_WEBHOOK_SECRET"]
SLACK_SECRET = os.environ["CONTRACT_SLACK_SECRET"]


@schemathesis.hook
def before_call(context: Any, case: Any, **kwargs: Any) -> None:
    if case.operation.path not in (INBOUND_PATH, EVENTS_PATH) or isinstance(case.body, NotSet):
        return
    try:
        raw = json.dumps(case.body, allow_nan=False).encode()
    except (TypeError, ValueError):
        return  # not JSON (a negative case of another media type): sent unsigned, a 401
    if case.operation.path == EVENTS_PATH:
        signed = signed_headers(SLACK_SECRET, raw)
        signed.pop("content-type")  # schemathesis sets the media type of the case
        case.headers = {**(case.headers or {}), **signed}
        return
    case.headers = {**(case.headers or {}), **inbound_headers(SECRET, raw)}
