"""The ``result_meta`` record read back: what a run wrote reads as it was, and a record
whose state or limit this version does not know is refused, naming the word, by the
reader and by the run diff that reads it (orchestrator/run/result_meta.py)."""

from __future__ import annotations

import pytest

from agent_runner.protocol import Usage
from orchestrator.core.errors import StoreError
from orchestrator.run.result_meta import read_result_meta, result_meta_message
from orchestrator.run.run_diff import diff_runs
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import store_message_direct
from orchestrator.store.runs import create_run, finish_run

JID = "team@g.us"


def _record(**changed: object) -> dict[str, object]:
    out = result_meta_message(
        run_id="r1",
        provider="anthropic",
        model="claude-sonnet-4-5",
        state="timed_out",
        stop_reason=None,
        limit="timeout",
        num_turns=3,
        attempts=1,
        duration_s=8.25,
        usage=Usage(input_tokens=1200, output_tokens=40, cache_read_input_tokens=1000),
    )
    assert out.metadata is not None
    return {**out.metadata, **changed}


def test_a_written_record_reads_back_as_it_was() -> None:
    written = _record()
    # The pipeline adds the run's id and cursor: not part of the record.
    read = read_result_meta({**written, "run_id": "r1", "cursor": 7})
    assert read == written
    assert (read["state"], read["limit"], read["usage"]["cache_read_input_tokens"]) == ("timed_out", "timeout", 1000)


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        ({"state": "evaporated"}, r"Invalid enum value 'evaporated' - at `\$\.state`"),
        ({"limit": "patience"}, r"Invalid enum value 'patience' - at `\$\.limit`"),
        ({"num_turns": "three"}, r"Expected `int`, got `str` - at `\$\.num_turns`"),
    ],
)
def test_a_record_this_version_cannot_read_is_refused(changed: dict[str, object], named: str) -> None:
    with pytest.raises(StoreError, match=f"a result_meta record this version cannot read: {named}"):
        read_result_meta(_record(**changed))
    record = _record()
    del record["state"]
    with pytest.raises(StoreError, match="missing required field `state`"):
        read_result_meta(record)


def test_the_run_diff_reads_the_record_and_refuses_an_unknown_state(db: Database) -> None:
    add_group(db, chat_jid=JID, name="Team", folder="team")
    runs = [create_run(db, chat_jid=JID, cursor_from=0, cursor_to=1, celery_task_id=None) for _ in range(2)]
    for run, state in zip(runs, ("timed_out", "evaporated"), strict=True):
        finish_run(db, run.id, state="timed_out", input_tokens=1, output_tokens=1)
        store_message_direct(
            db=db,
            id=f"{run.id}-meta",
            chat_jid=JID,
            sender="result_meta",
            sender_name="result",
            content="facts",
            timestamp="2026-01-01T00:00:00Z",
            message_type="assistant",
            metadata=_record(state=state),
        )
    a = diff_runs(db, runs[0].id, runs[0].id).a
    assert (a.model, a.stop_reason, a.num_turns) == ("anthropic:claude-sonnet-4-5", None, 3)
    assert (a.input_tokens, a.output_tokens, a.cache_read_input_tokens) == (1200, 40, 1000)
    with pytest.raises(StoreError, match=r"Invalid enum value 'evaporated' - at `\$\.state`"):
        diff_runs(db, runs[0].id, runs[1].id)
