"""The benchmark scripts run end to end on small sizes and report figures.

These check that ``bench/`` keeps working as the code moves (real databases,
broker, workers and containers, as in a full run); they assert what the
scripts measured happened (runs answered, rows found, plans read), never
how fast: speed is reported by the scripts, not asserted (docs/performance.md).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PG_URL, REDIS_URL, docker_available, pg_available, redis_available, require_service
from tests.web_browser import chromium_path

ROOT = Path(__file__).resolve().parents[2]
# A Redis database of its own: the bench's broker queues must not meet the tests' workers.
BENCH_REDIS = re.sub(r"/\d+$", "", REDIS_URL) + "/13"


def bench(module: str, *args: str, timeout: float = 600) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{module} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def numbers(pattern: str, text: str) -> list[float]:
    """Every number ``pattern``'s groups capture in ``text``, in order."""
    found = [float(g.replace(",", "")) for m in re.finditer(pattern, text) for g in m.groups()]
    assert found, f"no {pattern!r} in:\n{text}"
    return found


@pytest.fixture
def services() -> None:
    require_service(pg_available(), "PostgreSQL")
    require_service(redis_available(), "Redis")


@pytest.fixture
def docker_engine() -> None:
    require_service(docker_available(), "a Docker engine")


def test_ingest_bench_measures_both_backends_against_the_floor(services: None) -> None:
    out = bench("bench.ingest", "--messages", "60", "--rounds", "2", "--pg", PG_URL, "--redis", BENCH_REDIS)
    lines = out.splitlines()
    for backend in ("sqlite + filesystem://", "postgresql + redis"):
        line = next((x for x in lines if x.startswith(backend)), None)
        assert line is not None, out
        floor, busy, idle = numbers(r"([\d.]+) msg/s", line)
        assert floor > 0 and busy > 0 and idle > 0
        assert len(numbers(r"ratio ([\d.]+)", line)) == 2


def test_history_bench_assembles_every_size_and_reads_the_plans(services: None) -> None:
    out = bench(
        "bench.history", "--total", "3000", "--groups", "20", "--sizes", "200,500,1000", "--reps", "2", "--pg", PG_URL
    )
    for backend in ("sqlite", "postgresql"):
        section = out.split(f"{backend}: ", 1)[1]
        assert len(re.findall(r"-message group, table of +3,000 messages", section)) >= 3, section
        # Every assembly produced an input (its size in bytes) and a time.
        assert all(size > 1000 for size in numbers(r"input ([\d,]+) bytes", section))
        assert all(ms > 0 for ms in numbers(r"([\d.]+) ms \(max", section))
    sqlite_plans = out.split("sqlite: ", 1)[1].split("postgresql: ", 1)[0]
    assert sqlite_plans.count("USING INDEX idx_messages_chat_seq") == 4, sqlite_plans


def test_throughput_bench_answers_every_message(docker_engine: None) -> None:
    # Warm sessions only here (their first runs are cold starts); the cold mode is the same code path.
    out = bench("bench.throughput", "--groups", "2", "--messages", "2", "--raw", "2", "--modes", "warm")
    assert numbers(r"(\d+) thread\(s\): +([\d.]+) containers/s", out)
    assert not any(x.startswith("cold ") for x in out.splitlines())
    for mode in ("warm",):
        for workers in (1, 2):
            line = next(x for x in out.splitlines() if x.startswith(f"{mode} {workers} worker(s):"))
            runs, _, rate = numbers(r"(\d+) runs in +([\d.]+) s = +([\d.]+) runs/s", line)[:3]
            assert runs == 4 and rate > 0, line
            assert "0 failed runs" in line, line
        assert f"{mode}: 2 workers / 1 worker = " in out


def test_memory_bench_reads_the_worker_and_the_warm_container(docker_engine: None) -> None:
    out = bench("bench.memory", "--runs", "2")
    for mode in ("cold", "warm"):
        peak = numbers(rf"{mode}: worker peak during 2 runs: +([\d.]+) MiB RSS", out)[0]
        assert 20 < peak < 4096, out
    assert numbers(r"idle warm container \S+: docker stats +([\d.]+) MiB", out)[0] > 0


def test_overhead_bench_measures_cold_warm_and_the_baselines(docker_engine: None) -> None:
    out = bench("bench.overhead", "--runs", "2")
    for name in (
        "docker run --rm (floor)",
        "cold container",
        "warm session",
        "quiet group, no standby",
        "quiet group, standby",
        "2 s polling loop (model)",
    ):
        line = next(x for x in out.splitlines() if x.startswith(name))
        p50, p95 = numbers(r"(\d+)ms", line)
        assert 0 < p50 <= p95, line
    assert "cold sandbox run" in out and "first event" in out
    # The warm run's steps, each with its Docker calls, and the in-process runs' counts.
    steps = [
        x for x in out.splitlines() if re.match(r"  (had \+ input|first event|rest of stream|finish|clean-up) ", x)
    ]
    assert len(steps) == 5 and all(re.search(r"[\d.]+ ms +[\d.]+ calls", x) for x in steps), out
    assert re.search(r"message -> reply p50 [\d.]+ ms .*: [\d.]+ Docker calls, [\d.]+ transactions", out), out
    assert "quiet group with standby / floor (p50)" in out  # root here: standby is on


def test_warm_stages_bench_splits_a_warm_reply_through_the_worker(docker_engine: None) -> None:
    out = bench("bench.warm_stages", "--runs", "2")
    stages = numbers(r"(?m)^ +(-?[\d.]+)  (?:message stored|->)", out)
    assert len(stages) == 5, out
    # Each moment comes after the one before it (one clock; the database's timestamps
    # are the same wall clock's).
    assert all(stage > 0 for stage in stages), out
    (total,) = numbers(r"message stored -> reply stored: p50 ([\d.]+) ms", out)
    assert total > 0 and abs(sum(stages) - total) < total, out
    (send_task,) = numbers(r"send_task holds its caller: p50 ([\d.]+) ms", out)
    assert 0 < send_task < total, out


def test_run_path_bench_times_each_step_of_a_warm_run_in_order(docker_engine: None) -> None:
    out = bench("bench.run_path", "--runs", "2")
    (total,) = numbers(r"in one process, n = 2: p50 ([\d.]+) ms", out)
    steps = {}
    for line in out.splitlines():
        found = re.match(r" *([\d.]+) +([\d.]+)  +(\S+)$", line)
        if found:
            steps[found.group(3)] = (float(found.group(1)), float(found.group(2)))
    # The lease first, then the run's row (its input with it), the warm container, the reply, the end.
    order = ["leases.take", "pipeline.take_slot", "WarmPool.start", "ChatOutputs.emit", "pipeline.conclude"]
    assert all(name in steps for name in order), out
    starts = [steps[name][0] for name in order]
    assert starts == sorted(starts), out
    assert "pipeline.record_input" not in steps  # no write of its own for the input
    (reply,) = numbers(r"the reply stored at ([\d.]+) ms", out)
    assert steps["ChatOutputs.emit"][0] < reply < total, out


def test_claude_code_bench_times_the_first_request_and_the_reply_cold_and_warm(docker_engine: None) -> None:
    out = bench("bench.claude_code", "--runs", "1")
    lines = out.splitlines()
    rows = ("claude-code, cold", "claude-code, warm", "built-in loop, cold", "built-in loop, warm")
    for name in rows:
        first_p50, first_min, first_max, reply_p50, reply_min, reply_max = numbers(
            r"(\d+)", next(x for x in lines if x.startswith(name)).removeprefix(name)
        )
        assert 0 < first_min <= first_p50 <= first_max, out
        assert first_p50 <= reply_p50 and 0 < reply_min <= reply_p50 <= reply_max, out
        # The breakdown: every run asked the fake model, and the reply it stored was the model's.
        split = next(x for x in lines if x.strip().startswith(name) and "request(s)" in x)
        assert numbers(r"(\d+) request\(s\)", split)[0] >= 1, split
    assert "warm: Claude Code's first request" in out
    # The CLI's phases inside a container: each measured (two starts a round).
    for phase in ("the CLI's start", "new session:", "resumed session:", "session kept open:"):
        p50, low, high = numbers(r"(\d+)", next(x for x in lines if x.strip().startswith(phase)).split(")", 1)[-1])
        assert 0 < low <= p50 <= high, out


def test_wakeup_bench_measures_both_broker_modes(docker_engine: None) -> None:
    out = bench("bench.wakeup", "--runs", "2", "--idle-s", "2", "--rounds", "1")
    for name in ("poll every", "inotify"):
        line = next(x for x in out.splitlines() if x.startswith(name))
        p50, p95, to_run = numbers(r"(\d+)ms", line)
        assert 0 < p50 <= p95 and 0 < to_run, line
        assert numbers(r"([\d.]+)% of a core", line)[0] >= 0, line


def test_api_bench_measures_the_http_path_against_in_process_ingest(services: None) -> None:
    out = bench(
        "bench.api", "--requests", "40", "--clients", "4", "--rounds", "1", "--pg", PG_URL, "--redis", BENCH_REDIS
    )
    lines = out.splitlines()
    for stack in ("sqlite + filesystem://", "postgresql + redis"):
        at = next(i for i, x in enumerate(lines) if x.startswith(stack))
        assert numbers(r"in-process ingest (\d+) msg/s", lines[at])[0] > 0
        health, posts = numbers(r"p50 ([\d.]+) ms", lines[at + 1])
        rate, ratio = numbers(r"clients (\d+) msg/s, ratio to in-process ingest ([\d.]+)", lines[at + 1])
        assert health > 0 and posts > 0 and rate > 0 and ratio > 0, lines[at + 1]


def test_cli_bench_times_help_and_send_against_the_interpreter() -> None:
    out = bench("bench.cli", "--runs", "1", timeout=300)
    for row in (
        "python -c pass",
        "orchestrator --help",
        "orchestrator send (in process)",
        "orchestrator send (via the API)",
    ):
        line = next((x for x in out.splitlines() if x.startswith(row)), None)
        assert line is not None, out
        wall, cpu = numbers(r"(\d+)ms", line)
        assert wall > 0 and cpu >= 0, line
    floor_line = next(x for x in out.splitlines() if x.startswith("python -c pass"))
    assert numbers(r"([\d.]+)x", floor_line) == [1.0]
    assert '... CPU until "stored" (via the API)' in out and "target <= 500 ms" in out


def test_gateway_bench_times_open_close_memory_and_latency() -> None:
    out = bench("bench.gateway", "--rounds", "1", "--cycles", "3", "--requests", "5", "--long", "0", timeout=300)
    lines = out.splitlines()
    rows = [x for x in lines if x.startswith("orchestrator.sandbox.gateway")]
    assert len(rows) == 3, out  # cold start, memory, latency
    ready, close, total, p95, cpu = numbers(r"([\d.]+)", rows[0].split("gateway", 1)[1].split("|")[0])
    assert 0 < ready <= total <= p95 and close >= 0 and cpu > 0, rows[0]
    assert "overhead p50" in out


def test_egress_bench_times_requests_directly_and_through_the_proxy() -> None:
    out = bench("bench.egress", "--requests", "20", "--megabytes", "5", timeout=300)
    direct = numbers(r"direct\s+p50\s+([\d.]+) ms\s+p95\s+([\d.]+) ms\s+([\d.]+) MB/s", out)
    proxied = numbers(r"via proxy\s+p50\s+([\d.]+) ms\s+p95\s+([\d.]+) ms\s+([\d.]+) MB/s", out)
    assert all(v > 0 for v in [*direct, *proxied]) and direct[0] <= direct[1] and proxied[0] <= proxied[1], out


def test_recovery_bench_kills_a_worker_and_finds_the_answer_stored_once(docker_engine: None) -> None:
    # One fleet: the other (two host ids) is the failover of tests/integration/test_placement.py.
    out = bench("bench.recovery", "--trials", "1", "--baseline-trials", "0", "--fleets", "same")
    assert "two hosts" not in out
    for fleet in ("same host",):
        line = next(x for x in out.splitlines() if x.strip().startswith(f"{fleet}, recovery watch:"))
        median, worst = numbers(r"answer +([\d.]+) s median, +([\d.]+) s max", line)
        assert 0 < median <= worst, line
        assert "exactly once: yes" in line, out


def test_control_plane_bench_counts_what_each_run_sends_to_the_database(services: None) -> None:
    out = bench(
        "bench.control_plane",
        "--workers",
        "1,2",
        "--groups",
        "12",
        "--seconds",
        "4",
        "--warmup",
        "2",
        "--noop",
        "60",
        "--pg",
        PG_URL,
        "--redis",
        BENCH_REDIS,
    )
    sections = out.split("\n\n")
    for n in (1, 2):
        section = next(s for s in sections if s.startswith(f"{n} worker(s) x 2:"))
        rate, noop = numbers(r"([\d.]+) runs/s .* ([\d.]+) tasks/s", section.splitlines()[0])
        assert rate > 0 and noop > 0, section
        measured, sent = numbers(r"(\d+) runs measured, (\d+) messages sent, 0 runs not succeeded", section)
        # Every message sent in the window was answered by its own run; the groups pending
        # when it opened (at most 12) add one each.
        assert measured >= 10 and sent <= measured <= sent + 12, section
        workers, ingest = section.split("the driver's ingest, per message:")
        # Each run stores two outputs (the reply and its result_meta record), once each; runs
        # that straddle the window's start count in part, hence the margin.
        assert 1.5 <= numbers(r"INSERT messages +([\d.]+)", workers)[0] <= 2.5, section
        assert 0.75 <= numbers(r"INSERT runs +([\d.]+)", workers)[0] <= 1.25, section
        assert numbers(r"COMMIT +([\d.]+)", workers)[0] > 1, section
        assert numbers(r"INSERT messages +([\d.]+)", ingest)[0] == 1.0, section  # one message per ingest
        assert numbers(r"([\d.]+) ms of statements executing per run", section)[0] > 0, section
        assert "celery workers (parents + pool children)" in section
        # Celery's own CPU per empty task (the floor under a run's), the shared services' per run.
        floor, run = numbers(r"Celery alone \(the empty tasks\): ([\d.]+) ms .* a run: ([\d.]+) ms", section)
        assert 0 < floor and 0 < run, section
        assert numbers(r"would carry ~(\d+) runs/s", section)[0] > 0, section
    assert "best: " in out


def test_db_reach_bench_replays_the_recorded_run_path_through_pgbench(services: None) -> None:
    # The recording must have the run path's shape (else the bench stops and names the
    # difference), and every replayed run must go through: each take finds its lease free,
    # each statement its rows.
    out = bench("bench.db_reach", "--seconds", "3", "--clients", "2", "--per-client", "3", "--pg", PG_URL)
    statements, commits = numbers(r"recorded: (\d+) statements and (\d+) COMMITs", out)
    assert statements >= 20 and commits >= 5, out
    rate, runs, failed = numbers(r"([\d.]+) runs/s \(target 300: \w+\), (\d+) runs, (\d+) failed", out)
    assert rate > 0 and runs >= 10 and failed == 0, out
    assert numbers(r"postgres backends of this database +([\d.]+) CPU-s", out)[0] > 0, out


def test_delivery_bench_measures_both_layouts(docker_engine: None) -> None:
    out = bench("bench.delivery", "--messages", "2", "--busy-s", "5")
    lines = out.splitlines()
    for layout in ("one pool (", "own deliverer ("):
        line = next((x for x in lines if x.strip().startswith(layout)), None)
        assert line is not None, out
        p50, p95, worst = numbers(r"p50 +([\d.]+) ms, p95 +([\d.]+) ms, max +([\d.]+) ms", line)
        assert 0 < p50 <= p95 <= worst, line
        assert "2/2 delivered" in line, line
    # The deliverer's messages went out while the only agent slot was still busy.
    own = next(x for x in lines if x.strip().startswith("own deliverer ("))
    assert "2/2 while the busy run still ran" in own, out
    assert numbers(r"baseline p50 / own deliverer p50 = ([\d.]+)x", out)[0] > 0


def test_continuity_bench_reports_tokens_and_cache_reads_per_run() -> None:
    out = bench("bench.continuity", "--turns", "4", "--small-budget", "2000", timeout=300)
    runs = [line for line in out.splitlines() if re.match(r"\s+\d+\s", line)]
    assert len(runs) == 4, out
    totals = {
        m.group(1).strip(): (int(m.group(2)), float(m.group(3)))
        for m in re.finditer(r"^\s*(.+?): input\s+(\d+) tokens,\s+([\d.]+)% read", out, re.M)
    }
    assert set(totals) == {"before", "text history, cached", "after", "after, budget 2000"}, out
    assert totals["before"][1] == 0 and totals["after"][1] > 0  # no cache before; read from it after


def test_streaming_bench_sees_text_before_the_stored_reply(docker_engine: None) -> None:
    out = bench("bench.streaming", "--runs", "1", "--words", "15", "--word-delay", "0.1", "--first-delay", "0.2")
    first = numbers(r"first visible text\s+p50\s+([\d.]+) s", out)[0]
    stored = numbers(r"stored message\s+p50\s+([\d.]+) s", out)[0]
    # 15 words 0.1 s apart: the first text shows about 1.4 s before the reply is stored.
    assert 0 < first < stored, out
    assert numbers(r"median draft events per reply: (\d+)", out)[0] >= 2, out


def test_stream_push_bench_times_both_modes_on_both_databases() -> None:
    require_service(pg_available(), "PostgreSQL")
    out = bench("bench.stream_push", "--deltas", "4", "--interval", "0.05", "--idle-s", "1", "--pg", PG_URL)
    lines = out.splitlines()
    for backend in ("sqlite", "postgresql"):
        for mode in ("poll every 0.2 s (baseline)", "push (2 s safety poll)"):
            at = next((i for i, x in enumerate(lines) if x.startswith(backend) and mode in x), None)
            assert at is not None, out
            draft_p50, draft_p95, message_p50, message_p95 = numbers(r"([\d.]+)ms", lines[at])
            assert 0 < draft_p50 <= draft_p95 and 0 < message_p50 <= message_p95, lines[at]
            # The baseline's stream looked every 0.2 s: its queries were counted.
            stream_qps = numbers(r"idle stream +([\d.]+) q/s", lines[at])[0]
            assert stream_qps > 0 if "baseline" in mode else stream_qps >= 0, lines[at]
            if chromium_path() is not None:  # the page, timed in Chromium
                page_p50, page_p95 = numbers(r"([\d.]+)ms", lines[at + 1])
                assert "Chromium" in lines[at + 1] and 0 < page_p50 <= page_p95, lines[at + 1]
        summary = next(x for x in lines if x.startswith(f"{backend}: poll / push"))
        assert len(numbers(r"(?:p50|p95) ([\d.]+)x", summary)) >= 3, summary
