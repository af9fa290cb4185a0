"""A message in, an agent run in a real Docker container, typed replies out.

Real parts only: the `orchestrator` CLI, a `celery worker` process, the
database and broker of each backend (embedded: SQLite + filesystem://; fleet:
PostgreSQL + Redis), the Docker engine and the agent image with the offline
model.
"""

from __future__ import annotations

import json

import docker
import pytest

from orchestrator.sandbox.containers import LABEL_RUN
from orchestrator.store.groups import add_group, ensure_main_group
from orchestrator.store.runs import Run, list_runs
from tests.conftest import wait_until

from .conftest import Stack


def _replies(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_command_message_runs_in_the_sandbox_and_replies(stack: Stack) -> None:
    ensure_main_group(stack.db)
    stack.start_worker()
    res = stack.cli("send", "main@local", "$ echo hello-from-sandbox", "--wait", "90", "--json")
    assert res.returncode == 0, res.stderr + stack.worker_logs()
    replies = _replies(res.stdout)
    tool_results = [r for r in replies if r["message_type"] == "tool_result"]
    assert len(tool_results) == 1
    assert "hello-from-sandbox" in tool_results[0]["content"]
    assert tool_results[0]["metadata"]["exit_code"] == 0
    answers = [r for r in replies if r["message_type"] == "assistant" and r["sender"] == "bot"]
    assert len(answers) == 1 and "hello-from-sandbox" in answers[0]["content"]

    hist = stack.cli("history", "main@local", "--json")
    assert hist.returncode == 0, hist.stderr
    history = json.loads(hist.stdout)
    assert [(m["message_type"], m["sender"]) for m in history] == [
        ("user", "cli-user"),
        ("assistant", "tool_use"),
        ("tool_result", "tool_result"),
        ("assistant", "bot"),
        ("assistant", "result_meta"),  # the run's record, last
    ]
    assert [m["seq"] for m in history] == sorted(m["seq"] for m in history)

    runs = list_runs(stack.db, chat_jid="main@local")
    assert [r.state for r in runs] == ["succeeded"]
    assert runs[0].container_id and runs[0].output_tokens > 0
    # The run container is gone, whatever its exit.
    left = docker.from_env().containers.list(all=True, filters={"label": f"{LABEL_RUN}={runs[0].id}"})
    assert left == []


def test_failing_command_and_plain_message(stack: Stack) -> None:
    add_group(stack.db, chat_jid="team@g.us", name="team", folder="team", requires_trigger=True)
    stack.start_worker()
    # Without the trigger: stored as context, no run.
    quiet = stack.cli("send", "team@g.us", "remember the milk", "--wait", "5")
    assert quiet.returncode == 0 and "does not wake the agent" in quiet.stderr
    res = stack.cli("send", "team@g.us", "@Andy please\n$ ls /nonexistent-dir", "--wait", "90", "--json")
    assert res.returncode == 0, res.stderr + stack.worker_logs()
    tool = [r for r in _replies(res.stdout) if r["message_type"] == "tool_result"]
    assert tool and tool[0]["metadata"]["exit_code"] != 0
    plain = stack.cli("send", "team@g.us", "@andy what did I ask you to remember?", "--wait", "90", "--json")
    assert plain.returncode == 0, plain.stderr + stack.worker_logs()
    answers = [r for r in _replies(plain.stdout) if r["sender"] == "bot"]
    assert len(answers) == 1 and "what did I ask you to remember?" in answers[0]["content"]
    assert [r.state for r in list_runs(stack.db, chat_jid="team@g.us")] == ["succeeded", "succeeded"]


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_a_busy_groups_series_of_runs_is_one_task_each(stack: Stack) -> None:
    """Messages that keep arriving while the group's agent runs make a series of runs.
    Celery's time limits (run timeout + 30 s, + 90 s) are sized for one run, so each run
    is its own ``drain_group`` task (the step re-signals the group for the next batch):
    a long series is never cut by a task's limit, and a worker slot is never held
    between runs.  Read from the runs table: every run names the task that ran it."""
    jid = "busy@g.us"
    add_group(stack.db, chat_jid=jid, name="busy", folder="busy", requires_trigger=False)
    stack.start_worker()

    def runs() -> list[Run]:
        return list(reversed(list_runs(stack.db, chat_jid=jid)))

    for n, command in enumerate(["$ sleep 3", "$ sleep 2", "$ sleep 2", "$ echo last"], 1):
        sent = stack.cli("send", jid, command)
        assert sent.returncode == 0, sent.stderr
        if n < 4:  # the next message arrives while this one's run is going on
            wait_until(
                lambda n=n: len(runs()) == n and runs()[-1].state == "running",
                90,
                f"run {n} running",
                stack.worker_logs,
            )
    wait_until(
        lambda: len(runs()) == 4 and all(r.finished_at for r in runs()), 120, "four runs done", stack.worker_logs
    )
    done = runs()
    assert [r.state for r in done] == ["succeeded"] * 4, [(r.state, r.error) for r in done]
    tasks = [r.celery_task_id for r in done]
    assert None not in tasks and len(set(tasks)) == 4, tasks


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_a_worker_writes_json_lines_with_the_runs_context(stack: Stack) -> None:
    """ORCHESTRATOR_LOG_FORMAT=json in a real worker: Celery's lines and ours are JSON
    objects, and the run's own lines name its run, chat and host."""
    stack.env.update(ORCHESTRATOR_LOG_FORMAT="json", ORCHESTRATOR_HOST_ID="json-host")
    ensure_main_group(stack.db)
    stack.start_worker()
    res = stack.cli("send", "main@local", "$ echo logged", "--wait", "90")
    assert res.returncode == 0, res.stderr + stack.worker_logs()
    [run] = list_runs(stack.db, chat_jid="main@local")
    wait_until(
        lambda: f'"run_id": "{run.id}"' in stack.logs[0].read_text(), 30, "the run's end logged", stack.worker_logs
    )
    lines = [json.loads(x) for x in stack.logs[0].read_text().splitlines() if x.startswith("{")]
    assert any(x["logger"].startswith("celery") for x in lines)  # Celery's own lines, JSON too
    [ended] = [x for x in lines if x["run_id"] == run.id and "ended succeeded" in x["message"]]
    assert (ended["chat_jid"], ended["host"], ended["level"]) == ("main@local", "json-host", "INFO")


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_a_worker_serves_the_metrics_of_its_pool_children(stack: Stack) -> None:
    """ORCHESTRATOR_METRICS_PORT in a real worker: the run is counted in a pool child
    (prefork) and the main process serves the sum over its processes on /metrics."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stack.env.update(ORCHESTRATOR_METRICS_PORT=str(port), ORCHESTRATOR_HOST_ID="metered")
    ensure_main_group(stack.db)
    worker = stack.start_worker()
    res = stack.cli("send", "main@local", "$ echo metered", "--wait", "90")
    assert res.returncode == 0, res.stderr + stack.worker_logs()
    folder = stack.settings.data_dir / "metrics" / f"metered-{worker.pid}"
    assert any(folder.glob("counter_*.db")), stack.worker_logs()  # the children's files, where the setting says

    def scrape() -> list[str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode().splitlines()

    wanted = [
        'orchestrator_runs_finished_total{state="succeeded"} 1.0',
        'orchestrator_container_start_seconds_count{mode="cold"} 1.0',
    ]
    wait_until(
        lambda: all(w in scrape() for w in wanted),
        30,
        f"{wanted} on /metrics",
        lambda: "\n".join(scrape()) + stack.worker_logs(),
    )
    assert "orchestrator_runs_started_total 1.0" in scrape()
