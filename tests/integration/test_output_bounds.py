"""The agent attacks the host through its output, with the real agent image
through the real pipeline, cold and warm (orchestrator/sandbox/bounded_io.py).

The host's bounds must hold whatever the runner sends, so these runs stand for a
runner the agent has taken over: the image's runner leaves itself reachable
(``reachable_image``: the one difference from the agent image, whose runner the
agent cannot reach, ``agent_runner/undumpable.py``), and the agent's bash tool
writes to the runner's own stdout and stderr (``/proc/1/fd/1``, ``/proc/1/fd/2``):
a stderr flood, an endless stdout line, a flood of events (forged in cold
mode, where stdout is the protocol channel; many real tool calls in warm
mode, where the protocol is a socket the agent cannot open), and too much
to store.  Every time: the process running the pipeline (this one) stays
within a bounded amount of memory above where it started, a broken limit
ends the run failed (once, not retried) with a 🏠 message naming the limit
and its value, and the group's next run works.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from fakes.channel import RecordingChannel, attach_recorder
from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline, RunOutcome
from orchestrator.sandbox.containers import LABEL_INSTALL, LABEL_MANAGED, LABEL_WARM
from orchestrator.sandbox.warm import WarmPool
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after
from tests.conftest import require_service

JID = "main@local"
MIB = 1024 * 1024
# Generous: the old reader kept a 400 MB stderr flood whole (the worker went
# from 435 MiB to 3.1 GiB); bounded reading needs a few MiB at most.
MEMORY_BOUND = 200 * MIB
FLOOD = 400_000_000


# The agent image with a runner that does not make itself undumpable: what the agent could
# make of it if it ever reached into it.
REACHABLE_RUNNER = b"""ARG AGENT_IMAGE
FROM ${AGENT_IMAGE}
ENTRYPOINT ["python3", "-c", "import runpy, agent_runner.undumpable as u; u.make_undumpable = lambda: None; \\
runpy.run_module('agent_runner', run_name='__main__', alter_sys=True)"]
"""


@pytest.fixture(scope="session")
def reachable_image(agent_image: str) -> str:
    tag = "orchestrator-agent-reachable:test"
    docker.from_env().images.build(
        fileobj=io.BytesIO(REACHABLE_RUNNER),
        tag=tag,
        rm=True,
        network_mode="none",
        buildargs={"AGENT_IMAGE": agent_image},
    )
    return tag


@pytest.fixture(params=["cold", "warm"])
def pipe(
    request: pytest.FixtureRequest, tmp_path: Path, reachable_image: str
) -> Iterator[tuple[Pipeline, RecordingChannel]]:
    if request.param == "gvisor":
        require_service("runsc" in (docker.from_env().info().get("Runtimes") or {}), "gVisor (scripts/gvisor.sh)")
    settings = Settings.load(
        data_dir=tmp_path / "data",
        agent_image=reachable_image,
        run_timeout_s=150,
        bash_timeout_s=120,
        warm_idle_s=0 if request.param == "cold" else 60,
        # "gvisor": warm, under gVisor (tests/integration/test_gvisor.py registers nothing:
        # scripts/gvisor.sh does, in .ci/run).
        sandbox_runtime="runsc" if request.param == "gvisor" else "runc",
        # The next run sees only its own message: the offline model would
        # otherwise answer the unanswered attack again, with it.
        context_messages=0,
        env_file=None,
    )
    settings.ensure_dirs()
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    db.migrate()
    ensure_main_group(db)
    rec = attach_recorder(db, JID)
    pipeline = Pipeline(settings, db, ChannelRegistry([rec]))
    yield pipeline, rec
    if isinstance(pipeline.sandbox, WarmPool):  # a cold pipeline has no warm containers
        pipeline.sandbox.stop_all()
    labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={settings.install_id}"]
    leftover = docker.from_env().containers.list(all=True, filters={"label": labels})
    for c in leftover:
        c.remove(force=True)
    db.dispose()
    assert [c for c in leftover if c.labels.get(LABEL_WARM) != "1"] == [], "a run container outlived its run"


def _configure(pipeline: Pipeline, **limits: int) -> None:
    pipeline.settings = pipeline.settings.replace(**limits)


def _ask(pipeline: Pipeline, text: str) -> tuple[RunOutcome, list[StoredMessage]]:
    sent = ingest(
        pipeline.db, pipeline.settings, IncomingMessage(chat_jid=JID, sender="u", content=text), signal=None
    ).message
    outcomes = pipeline.drain_group(JID)
    assert len(outcomes) == 1, outcomes
    return outcomes[0], get_messages_after(JID, sent.seq, db=pipeline.db)


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} in /proc/self/status")


class PeakMemory:
    """This process's peak resident memory above where it was when entered.

    Resets the kernel's high-water mark (``/proc/self/clear_refs`` ``5``)
    and reads ``VmHWM`` at the end; a sampling thread is the fallback (and
    a cross-check) where the reset is not allowed.
    """

    def __enter__(self) -> PeakMemory:
        self.before = _status_kib("VmRSS") * 1024
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self._hwm = True
        except OSError:
            self._hwm = False
        self._sampled = self.before
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.02):
            self._sampled = max(self._sampled, _status_kib("VmRSS") * 1024)

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        peak = self._sampled
        if self._hwm:
            peak = max(peak, _status_kib("VmHWM") * 1024)
        self.growth = peak - self.before


def _host_messages(rec: RecordingChannel) -> list[str]:
    return [m.text for m in rec.sent if m.message_type == "host"]


def _next_run_works(pipeline: Pipeline) -> None:
    outcome, outputs = _ask(pipeline, "$ echo still-alive")
    assert outcome.run.state == "succeeded", outcome.run.error
    assert [m.content.strip() for m in outputs if m.message_type == "tool_result"] == ["still-alive"]


# -- floods ----------------------------------------------------------------------------


@pytest.mark.parametrize("pipe", ["cold", "warm", "gvisor"], indirect=True)
def test_a_stderr_flood_keeps_the_host_small(pipe: tuple[Pipeline, RecordingChannel]) -> None:
    pipeline, rec = pipe
    start = time.monotonic()
    with PeakMemory() as mem:
        outcome, outputs = _ask(pipeline, f'$ head -c {FLOOD} /dev/zero | tr "\\0" a > /proc/1/fd/2; echo flooded')
    print(
        f"stderr flood ({pipeline.settings.sandbox.warm_idle_s and 'warm' or 'cold'}): "
        f"+{mem.growth / MIB:.1f} MiB peak over {mem.before / MIB:.0f} MiB, {time.monotonic() - start:.1f}s"
    )
    assert mem.growth < MEMORY_BOUND
    # Writing to the log is not an error: the run ends normally.
    assert outcome.run.state == "succeeded", outcome.run.error
    assert [m.content.strip() for m in outputs if m.message_type == "tool_result"] == ["flooded"]
    _next_run_works(pipeline)


def test_an_endless_stdout_line(pipe: tuple[Pipeline, RecordingChannel]) -> None:
    pipeline, rec = pipe
    warm = pipeline.settings.sandbox.warm_idle_s > 0
    start = time.monotonic()
    with PeakMemory() as mem:
        outcome, _ = _ask(pipeline, f'$ head -c {FLOOD} /dev/zero | tr "\\0" a > /proc/1/fd/1; echo flooded')
    print(
        f"stdout flood ({'warm' if warm else 'cold'}): +{mem.growth / MIB:.1f} MiB peak over "
        f"{mem.before / MIB:.0f} MiB, {time.monotonic() - start:.1f}s"
    )
    assert mem.growth < MEMORY_BOUND
    if warm:
        # The runner's stdout is not the protocol channel here: it lands in
        # Docker's log of the container, which is capped on disk.
        assert outcome.run.state == "succeeded", outcome.run.error
        # This test's installation's only: another one's warm containers may run on this engine.
        [container] = docker.from_env().containers.list(
            filters={"label": [f"{LABEL_WARM}=1", f"{LABEL_INSTALL}={pipeline.settings.install_id}"]}
        )
        config = container.attrs["HostConfig"]["LogConfig"]
        assert config == {"Type": "json-file", "Config": {"max-file": "1", "max-size": "1m"}}
        log_path = Path(container.attrs["LogPath"])
        if log_path.exists():  # readable where the test runs as root
            assert log_path.stat().st_size < 4 * MIB
    else:
        assert outcome.run.state == "failed" and outcome.run.attempts == 1
        assert outcome.run.error is not None and "longer than 1048576 bytes" in outcome.run.error
        [host] = _host_messages(rec)
        assert host.startswith("🏠 ⚠️ Agent error: output limit") and "ORCHESTRATOR_MAX_EVENT_LINE_BYTES=1048576" in host
        assert time.monotonic() - start < 60  # stopped at the limit, not at the run's time limit
    _next_run_works(pipeline)


def test_a_flood_of_events(pipe: tuple[Pipeline, RecordingChannel]) -> None:
    pipeline, rec = pipe
    _configure(pipeline, max_run_events=300)
    if pipeline.settings.sandbox.warm_idle_s > 0:
        # The protocol socket is out of the agent's reach: many real tool calls instead.
        text = "\n".join(["$ true"] * 400)
    else:
        text = """$ yes '{"type":"assistant","text":"spam"}' | head -n 1000000 > /proc/1/fd/1"""
    with PeakMemory() as mem:
        outcome, outputs = _ask(pipeline, text)
    print(f"event flood: +{mem.growth / MIB:.1f} MiB peak")
    assert mem.growth < MEMORY_BOUND
    assert outcome.run.state == "failed" and outcome.run.attempts == 1, outcome.run.error
    assert outcome.run.error is not None and "more than 300 output lines" in outcome.run.error
    [host] = _host_messages(rec)
    assert "ORCHESTRATOR_MAX_RUN_EVENTS=300" in host
    assert len(outputs) <= 300 + 2  # what was read before the cap, the host message and the run's record
    _next_run_works(pipeline)


def test_too_much_to_store(pipe: tuple[Pipeline, RecordingChannel]) -> None:
    pipeline, rec = pipe
    _configure(pipeline, max_run_stored_bytes=MIB)
    if pipeline.settings.sandbox.warm_idle_s > 0:
        # Real tool results of 16 kB each (the runner's own cap on bash output).
        text = "\n".join(["$ head -c 20000 /dev/zero | tr '\\0' b"] * 100)
    else:
        text = (
            '$ python3 -c \'import json; line = json.dumps({"type": "assistant", "text": "x" * 100000}); '
            "[print(line) for _ in range(50)]' > /proc/1/fd/1"
        )
    outcome, outputs = _ask(pipeline, text)
    assert outcome.run.state == "failed" and outcome.run.attempts == 1, outcome.run.error
    assert outcome.run.error is not None and "more than 1048576 bytes of output to store" in outcome.run.error
    [host] = _host_messages(rec)
    assert "ORCHESTRATOR_MAX_RUN_STORED_BYTES=1048576" in host
    assert sum(len(m.content.encode()) for m in outputs) <= MIB + 1000
    _next_run_works(pipeline)


# Cold only: a tool result can be forged only on the cold protocol channel
# (stdout); in warm mode the protocol socket is out of the agent's reach and
# the runner's own tools cap their output far below the host's limit.
@pytest.mark.parametrize("pipe", ["cold"], indirect=True)
def test_a_huge_tool_result_is_stored_cut(pipe: tuple[Pipeline, RecordingChannel]) -> None:
    pipeline, _ = pipe
    _configure(pipeline, max_tool_result_bytes=100_000)
    forged = (
        '$ python3 -c \'import json; print(json.dumps({"type": "tool_result", "tool_use_id": "f", '
        '"name": "bash", "output": "b" * 500000, "exit_code": 0}))\' > /proc/1/fd/1; echo real'
    )
    outcome, outputs = _ask(pipeline, forged)
    assert outcome.run.state == "succeeded", outcome.run.error
    results = [m for m in outputs if m.message_type == "tool_result"]
    cut = [m for m in results if (m.metadata or {}).get("output_truncated")]
    assert len(cut) == 1 and cut[0].metadata is not None and cut[0].metadata["output_bytes"] == 500_000
    assert cut[0].content.startswith("b" * 100_000) and len(cut[0].content) < 100_200
    assert "[output truncated by the host: showing the first 100000 of 500000 bytes]" in cut[0].content
    assert results[-1].content.strip() == "real"
