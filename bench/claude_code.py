"""Claude Code's reply time: from a triggering message being stored to Claude
Code's first model request, and to its reply being stored, with a model that
answers at once, for cold runs and warm ones.

The model is the fake Messages API (``fakes/anthropic_api.py``, the
streaming wire format) on loopback, answering every request with a short
text at once, so what is measured is everything but the model: ingest, the
Celery signal, a ``celery worker`` process, the model gateway, the
container (the image's ``claude-code`` variant), the runner, the Claude
Code CLI's start and the resume of its session, the reply stored.  The
model's clock is the fake's (when a request arrives); the messages' are
their stored timestamps, one machine, one clock.

Rows:

* ``claude-code, cold``: no warm containers (``ORCHESTRATOR_WARM_IDLE_S=0``):
  each run starts a container, the runner, the CLI, and resumes the
  session from the group's session folder;
* ``claude-code, warm``: a warm container per group (its runner serves each
  run on its socket and keeps the CLI running with the session open between
  runs: ``container/agent_runner/claude_code/live.py``);
* ``built-in loop, cold`` / ``warm``: the same through the runner's own
  turn loop (``anthropic:`` provider, same fake): the baseline, what the
  path costs without the CLI.

Each message is sent once the previous run has ended, as in a conversation;
the first run of each row is not timed (the worker's first connections,
the first container).  Then, per row, the medians of message -> run
created -> first model request -> reply stored, and the requests per run.

Last, where Claude Code's own part goes, inside one container of the
variant (no network, the fake reached through the runner's loopback relay
on a mounted unix socket), ``--runs`` times each: the CLI's start (the
SDK's ``connect``: the process and its initialize handshake), a new
session's first query to its first model request, a resumed session's
(a new CLI with ``resume``: what a cold run pays, and a warm one before the
CLI was kept), and a turn of a session kept open (the SDK's streaming input:
what a warm run pays).

    .venv/bin/python -m bench.claude_code [--runs N] [--no-build]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from bench.common import Workers, install, pct, remove_install_containers, signals_for
from bench.overhead import answering_run, wait_finished
from fakes.anthropic_api import FakeAnthropic, Recorded, Reply, message
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.sandbox.containers import docker_client
from orchestrator.sandbox.image import ensure_agent_image, image_name
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after

JID = "main@local"  # bench.overhead's helpers read this chat
# A name the CLI knows (its tool set depends on it); the fake answers any.
CLAUDE_CODE_MODEL = "claude-code:claude-sonnet-4-5"
BUILT_IN_MODEL = "anthropic:claude-sonnet-4-5"
REPLY = "pong"


@dataclass(frozen=True)
class Timing:
    """One run, seconds from the triggering message's stored timestamp."""

    run_created: float
    first_request: float
    reply: float
    requests: int


class Model:
    """Answers every request at once and notes when each arrived (wall clock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.arrivals: list[float] = []

    def __call__(self, rec: Recorded) -> Reply:
        with self.lock:
            self.arrivals.append(time.time())
        return message([{"type": "text", "text": REPLY}], "end_turn")

    def since(self, t: float) -> list[float]:
        with self.lock:
            return [a for a in self.arrivals if a >= t]


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def measure(data_dir: Path, image: str, model_spec: str, n: int, warm_idle_s: float) -> list[Timing]:
    """``n`` timed runs (after one untimed), one after another, through a real worker."""
    model = Model()
    fake = FakeAnthropic(*[model] * (50 * (n + 1)))
    timings: list[Timing] = []
    with fake.serve() as base_url:
        # The CLI (Node) needs more than the default 512m; every row gets the same.  No
        # session folder quota: as root it loop-mounts a volume that would outlive the data dir.
        settings, db = install(data_dir, image, warm_idle_s=warm_idle_s, container_memory="1g", session_quota="0")
        ensure_main_group(db)
        env = {
            "ORCHESTRATOR_MODEL": model_spec,
            "ORCHESTRATOR_ANTHROPIC_BASE_URL": base_url,
            "ORCHESTRATOR_ANTHROPIC_API_KEY": "bench-claude-code-key",
            "ORCHESTRATOR_CONTAINER_MEMORY": "1g",
            "ORCHESTRATOR_SESSION_QUOTA": "0",
            "NO_PROXY": "127.0.0.1",
            "no_proxy": "127.0.0.1",
        }
        try:
            with Workers(settings, 1, env=env) as workers:
                time.sleep(3)  # the worker's start-up (not part of any run)
                for i in range(n + 1):
                    sent = ingest(
                        db,
                        settings,
                        IncomingMessage(chat_jid=JID, sender="bench", content=f"ping {i}"),
                        signal=signals_for(settings).group,
                    ).message
                    deadline = time.monotonic() + 180
                    while not (replies := [m for m in get_messages_after(JID, sent.seq, db=db) if m.sender == "bot"]):
                        if time.monotonic() > deadline:
                            raise SystemExit(f"no reply to run {i} within 180 s; the worker's log:\n{workers.logs()}")
                        time.sleep(0.01)
                    wait_finished(db, sent.seq)
                    t0 = _ts(sent.timestamp)
                    requests = model.since(t0)
                    if not requests:
                        raise SystemExit(f"run {i} answered without asking the model: {replies[0].content!r}")
                    if replies[0].content != REPLY:
                        raise SystemExit(f"run {i} answered {replies[0].content!r}, not the model's {REPLY!r}")
                    if i > 0:  # the first run also pays for the worker's first connections
                        timings.append(
                            Timing(
                                run_created=answering_run(db, sent.seq).created_at.timestamp() - t0,
                                first_request=requests[0] - t0,
                                reply=_ts(replies[0].timestamp) - t0,
                                requests=len(requests),
                            )
                        )
        finally:
            remove_install_containers(settings)
            db.dispose()
    return timings


# Runs inside the claude-code variant (python3 -c): times the CLI's phases against the fake
# on the mounted socket; prints one JSON object per measurement.
PHASES_PROBE = r"""
import asyncio, json, sys, tempfile, time
import claude_agent_sdk as sdk
from agent_runner.relay import UnixRelay

def options(base_url, config_dir, resume=None):
    env = {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "via-gateway", "CLAUDE_CONFIG_DIR": config_dir,
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
           "DISABLE_AUTOUPDATER": "1", "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1", "CLAUDE_CODE_ENABLE_TASKS": "0",
           "ENABLE_TOOL_SEARCH": "false", "MAX_THINKING_TOKENS": "0", "ANTHROPIC_MODEL": "claude-sonnet-4-5",
           "ANTHROPIC_SMALL_FAST_MODEL": "claude-sonnet-4-5"}

    @sdk.tool("send_message", "Post into the chat", {"type": "object", "properties": {"text": {"type": "string"}}})
    async def send_message(args):
        return {"content": [{"type": "text", "text": "sent"}]}

    return sdk.ClaudeAgentOptions(
        model="claude-sonnet-4-5", cwd="/workspace", resume=resume, max_turns=5, permission_mode="bypassPermissions",
        env=env, include_partial_messages=True,
        mcp_servers={"chat": sdk.create_sdk_mcp_server("chat", tools=[send_message])},
        system_prompt={"type": "preset", "preset": "claude_code", "append": "You are Andy."})

async def turn(client, text, arrivals):
    t = time.time()
    await client.query(text)
    session = None
    async for m in client.receive_response():
        if type(m).__name__ == "ResultMessage":
            session = m.session_id
    return arrivals(t) - t, time.time() - t, session

def arrivals(log_path):
    def first_after(t):
        with open(log_path) as fh:
            return min(float(x) for x in fh.read().split() if float(x) >= t)
    return first_after

async def main(runs):
    first = arrivals("/probe/arrivals")
    config_dir = tempfile.mkdtemp()
    with UnixRelay("/probe/model.sock") as relay:
        for _ in range(runs):
            t0 = time.time()
            client = sdk.ClaudeSDKClient(options=options(relay.base_url, config_dir))
            await client.connect()
            start = time.time() - t0
            to_request, _, session = await turn(client, "hello", first)
            print(json.dumps({"phase": "start", "s": start}))
            print(json.dumps({"phase": "new", "s": to_request}))
            to_request, _, _ = await turn(client, "and again", first)
            print(json.dumps({"phase": "live", "s": to_request}))
            await client.disconnect()
            client = sdk.ClaudeSDKClient(options=options(relay.base_url, config_dir, resume=session))
            t0 = time.time()
            await client.connect()
            start = time.time() - t0
            to_request, _, _ = await turn(client, "resumed", first)
            print(json.dumps({"phase": "start", "s": start}))
            print(json.dumps({"phase": "resumed", "s": to_request}), flush=True)
            await client.disconnect()

asyncio.run(main(int(sys.argv[1])))
"""
PHASES = {
    "start": "the CLI's start (process + initialize)",
    "new": "new session: query -> first request",
    "resumed": "resumed session: query -> first request",
    "live": "session kept open: query -> first request",
}


def cli_phases(image: str, runs: int) -> dict[str, list[float]]:
    """Claude Code's phases inside a container of ``image`` (the claude-code variant)."""
    model = Model()
    fake = FakeAnthropic(*[model] * (10 * runs + 10))
    out: dict[str, list[float]] = {k: [] for k in PHASES}
    with tempfile.TemporaryDirectory() as probe:
        os.chmod(probe, 0o777)  # the container's user reaches the socket, reads the arrivals
        arrivals = Path(probe) / "arrivals"
        arrivals.touch()
        os.chmod(arrivals, 0o644)

        def note(rec: Recorded) -> None:
            with arrivals.open("a") as fh:  # the wall clock, which the container shares
                fh.write(f"{time.time():.6f}\n")

        fake.on_request = note
        with fake.serve_unix(str(Path(probe) / "model.sock")):
            os.chmod(Path(probe) / "model.sock", 0o666)
            proc = subprocess.run(
                ["docker", "run", "--rm", "--network", "none", "--read-only", "--memory", "1g"]
                + ["--tmpfs", "/tmp", "--tmpfs", "/workspace:uid=1000", "-e", "HOME=/tmp", "-v", f"{probe}:/probe"]
                + ["--entrypoint", "python3", image, "-c", PHASES_PROBE, str(runs)],
                capture_output=True,
                text=True,
                timeout=60 + 30 * runs,
            )
    if proc.returncode != 0:
        raise SystemExit(f"the phase probe failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            out[row["phase"]].append(row["s"])
    return out


def _ms(values: list[float]) -> str:
    return f"{pct(values, 50) * 1000:6.0f} {min(values) * 1000:6.0f} {max(values) * 1000:6.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="timed runs per row (default 10)")
    parser.add_argument(
        "--no-build",
        action="store_true",
        help="use the agent image and its claude-code variant as they are, even if the runner changed since",
    )
    args = parser.parse_args()
    settings = Settings.load(env_file=None)
    if not args.no_build:
        ensure_agent_image(docker_client(settings), settings, variant="claude-code")
    image = settings.sandbox.agent_image
    variant = image_name(settings, "claude-code")
    rows: list[tuple[str, list[Timing]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec, idle in (
            ("claude-code, cold", CLAUDE_CODE_MODEL, 0.0),
            ("claude-code, warm", CLAUDE_CODE_MODEL, 300.0),
            ("built-in loop, cold", BUILT_IN_MODEL, 0.0),
            ("built-in loop, warm", BUILT_IN_MODEL, 300.0),
        ):
            rows.append((name, measure(Path(tmp) / name.replace(", ", "-"), image, spec, args.runs, idle)))
    phases = cli_phases(variant, args.runs)
    print(f"(n={args.runs} per row, the fake model answering at once; ms)")
    print(f"{'':22} {'trigger -> first model request':>31}   {'trigger -> reply stored':>24}")
    print(f"{'':22} {'p50':>10} {'min':>6} {'max':>6}        {'p50':>6} {'min':>6} {'max':>6}")
    for name, timings in rows:
        first = [t.first_request for t in timings]
        reply = [t.reply for t in timings]
        print(f"{name:22}     {_ms(first)}        {_ms(reply)}")
    print("where it goes (median ms): trigger -> run created -> first model request -> reply stored; requests a run")
    for name, timings in rows:
        created = statistics.median(t.run_created for t in timings)
        to_request = statistics.median(t.first_request - t.run_created for t in timings)
        to_reply = statistics.median(t.reply - t.first_request for t in timings)
        requests = statistics.median(t.requests for t in timings)
        print(
            f"  {name:22} {created * 1000:6.0f} + {to_request * 1000:6.0f} + {to_reply * 1000:6.0f}"
            f"   {requests:g} request(s)"
        )
    by = dict(rows)
    cc, loop = by["claude-code, warm"], by["built-in loop, warm"]
    gap = pct([t.first_request for t in cc], 50) - pct([t.first_request for t in loop], 50)
    print(f"warm: Claude Code's first request {gap * 1000:.0f} ms (p50) after the built-in loop's")
    print(f"Claude Code's own part, inside a container of {variant}:")
    print(f"  {'(ms)':44} {'p50':>6} {'min':>6} {'max':>6}")
    for key, label in PHASES.items():
        print(f"  {label:44} {_ms(phases[key])}")


if __name__ == "__main__":
    main()
