"""OpenTelemetry traces: one trace per message that wakes the agent.

The trace of such a message, span by span (the process each runs in)::

    ingest                                  the API, the CLI, a channel's poller (run/ingest.py)
    └─ signal drain_group      producer     the same process (run/queue.py): the span's W3C
       │                                    ``traceparent`` rides in the Celery message's headers
       └─ task drain_group     consumer     a worker's pool process (workers/tasks.py)
          └─ run                            one per attempt (run/run_trace.py)
             ├─ agent container             the container from start to exit (run/pipeline.py)
             │  └─ store assistant, store tool_result, ...   each output as it is stored
             │     └─ signal deliver → task deliver           its delivery to the channels
             └─ store host                  a 🏠 message the run ends with, if any

A scheduled task's message is a trace of its own the same way (``scheduled task``
instead of ``ingest``; run/schedules.py).

The database holds the truth, not the broker: ingest stores the ``traceparent``
of a message that wakes the agent with the message (``messages.traceparent``,
store/traces.py), and a run's span joins the trace of the first message of its
batch that has one, whichever signal started it (the message's own, a follow-up
after the previous run, the sweeper, the recovery watch, a retry's countdown):
under the task's span when that task is part of the same trace, else directly
under the message's ``ingest`` span with a link to the task's.  The batch's other
messages' traces are links of the run's span.  The context also goes into the
container's input (``ContainerInput.traceparent``, the attempt's span); the
runner exports nothing (it has no network): the host makes the spans of what
the container writes as it stores it.

Exporters (the settings' ``OTEL_*`` variables; core/settings.py): ``none``, the
default, costs nothing: this module imports nothing of OpenTelemetry until a
process configures an exporter, and every helper below returns at once
(``orchestrator --help`` and ``send`` pay no import: docs/performance.md).
``console`` writes one JSON object per finished span on stderr (stdout is the
CLI's data), as it ends; ``otlp`` batches them to a collector over HTTP/protobuf
(the ``otlp`` extra).  The SDK reads the rest of the standard's variables itself
(headers, timeouts, batching, sampling, resource attributes): how to export is
the specification's business, what and whether is ours.

Spans come from this module's own provider, not OpenTelemetry's global one, so a
test can install an in-memory exporter (:func:`install`) and take it away again;
the context they nest in is OpenTelemetry's (a ``ContextVar``), so the current
span is the one of this thread or task.
"""

from __future__ import annotations

import contextlib
import enum
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Literal

from orchestrator.core.errors import ConfigError
from orchestrator.core.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Link, SpanContext, Tracer

# The Celery message header (and the W3C Trace Context field) that carries a span's context.
HEADER = "traceparent"
INSTRUMENTATION = "orchestrator"
Kind = Literal["internal", "producer", "consumer"]
AttributeValue = str | bool | int | float


class Parent(enum.Enum):
    """Where a span goes when no ``traceparent`` is given: under the current span, or a new trace."""

    CURRENT = "current"
    ROOT = "root"


CURRENT = Parent.CURRENT
ROOT = Parent.ROOT


class _State:
    """This process's tracing: off (``tracer`` None) until an exporter is configured."""

    def __init__(self) -> None:
        self.configured = False
        self.provider: TracerProvider | None = None
        self.tracer: Tracer | None = None


_state = _State()
_lock = threading.Lock()


def enabled() -> bool:
    """Whether this process makes spans (an exporter is configured)."""
    return _state.tracer is not None


def configure(settings: Settings) -> None:
    """Set this process's exporters from ``settings`` (``OTEL_TRACES_EXPORTER``), once: the
    process's entry point decides (``orchestrator/core/process.py``; never a composition
    root), later calls return at once.  With ``none`` nothing is imported."""
    with _lock:
        if _state.configured:
            return
        _state.configured = True
        exporters = settings.telemetry.trace_exporters
        if not exporters:
            return
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        processors: list[SpanProcessor] = []
        for name in exporters:
            if name == "console":
                # As each span ends, on this thread: a trace printed for one message is
                # complete even when the process is killed right after.
                processors.append(SimpleSpanProcessor(console_exporter()))
            else:
                processors.append(BatchSpanProcessor(_otlp_exporter(settings)))
        _start(processors, settings.telemetry.otel_service_name, settings.fleet.effective_host_id)


def console_exporter(out: IO[str] | None = None) -> SpanExporter:
    """The SDK's console exporter, one compact JSON object per span and line on ``out``
    (default: stderr, where the log lines go; stdout is the CLI's data, ``send --json``)."""
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    def line(span: ReadableSpan) -> str:
        return str(span.to_json(indent=None)) + "\n"

    return ConsoleSpanExporter(out=out or sys.stderr, formatter=line)


def _otlp_exporter(settings: Settings) -> SpanExporter:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise ConfigError(
            "OTEL_TRACES_EXPORTER=otlp needs the OTLP exporter: pip install 'agent-orchestrator[otlp]'"
        ) from exc
    endpoint = settings.telemetry.otel_exporter_otlp_traces_endpoint or (
        settings.telemetry.otel_exporter_otlp_endpoint.rstrip("/") + "/v1/traces"
        if settings.telemetry.otel_exporter_otlp_endpoint
        else None
    )  # None: the SDK's default, http://localhost:4318/v1/traces
    return OTLPSpanExporter(endpoint=endpoint)


def install(
    exporter: SpanExporter, *, batch: bool = False, service_name: str = "agent-orchestrator", host: str = ""
) -> None:
    """Export this process's spans to ``exporter`` from now on, whatever was configured
    (the tests' in-memory exporter); :func:`shutdown` takes it away."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    shutdown()
    with _lock:
        _state.configured = True
        _start([BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)], service_name, host)


def _start(processors: Sequence[SpanProcessor], service_name: str, host: str) -> None:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    attributes: dict[str, AttributeValue] = {"service.name": service_name}
    if host:
        attributes["orchestrator.host"] = host
    # shutdown_on_exit: the batch is flushed when the process exits normally (the CLI, the
    # API); a worker's pool child ends without atexit, workers/app.py flushes it.
    provider = TracerProvider(resource=Resource.create(attributes), shutdown_on_exit=True)
    for processor in processors:
        provider.add_span_processor(processor)
    _state.provider = provider
    _state.tracer = provider.get_tracer(INSTRUMENTATION)


def flush(timeout_s: float = 5.0) -> None:
    """Export the spans waiting in a batch now (a worker's pool child before it ends)."""
    if _state.provider is not None:
        _state.provider.force_flush(int(timeout_s * 1000))


def shutdown() -> None:
    """Flush and stop the exporters; tracing is off afterwards and :func:`configure` acts again."""
    with _lock:
        provider = _state.provider
        _state.provider = _state.tracer = None
        _state.configured = False
    if provider is not None:
        provider.shutdown()


# -- spans ---------------------------------------------------------------------------------


@contextlib.contextmanager
def span(
    name: str,
    *,
    kind: Kind = "internal",
    parent: str | Parent = CURRENT,
    join: Sequence[str] = (),
    attributes: Mapping[str, AttributeValue | None] | None = None,
) -> Iterator[None]:
    """A span around the block, current inside it; nothing at all while tracing is off.

    ``parent``: a ``traceparent`` (one that does not parse starts a new trace), the
    current span (default) or :data:`ROOT`.  ``join``: the ``traceparent`` of each
    piece of work the span does (a run's messages), the first one's trace being the
    span's: under the current span when that is in the same trace, else under the
    first one with a link to the current span; the others are links.  An exception
    leaving the block is recorded on the span and marks it an error."""
    tracer = _state.tracer
    if tracer is None:
        yield
        return
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind

    links: list[Link] = []
    context: Context | None = None  # None: the current context
    if parent is ROOT:
        context = Context()
    elif isinstance(parent, str):
        found = _span_context(parent)
        context = trace.set_span_in_context(trace.NonRecordingSpan(found)) if found is not None else Context()
    if join:
        contexts = [c for c in (_span_context(t) for t in join) if c is not None]
        current = trace.get_current_span().get_span_context()
        if contexts and not (current.is_valid and current.trace_id == contexts[0].trace_id):
            context = trace.set_span_in_context(trace.NonRecordingSpan(contexts[0]))
            if current.is_valid:
                links.append(trace.Link(current, {"orchestrator.link": "started by"}))
        seen = {(c.trace_id, c.span_id) for c in contexts[:1]}
        for other in contexts[1:]:
            if (other.trace_id, other.span_id) not in seen:
                seen.add((other.trace_id, other.span_id))
                links.append(trace.Link(other, {"orchestrator.link": "also answers"}))
    with tracer.start_as_current_span(
        name,
        context=context,
        kind=SpanKind[kind.upper()],
        links=links,
        attributes={k: v for k, v in (attributes or {}).items() if v is not None},
    ):
        yield


def _span_context(traceparent: str) -> SpanContext | None:
    """The remote span a W3C ``traceparent`` names, or None when it does not parse."""
    if not traceparent:
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    found = trace.get_current_span(TraceContextTextMapPropagator().extract({HEADER: traceparent}))
    context = found.get_span_context()
    return context if context.is_valid else None


def traceparent() -> str:
    """The current span's W3C ``traceparent`` ("" while tracing is off or outside a span)."""
    if _state.tracer is None:
        return ""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get(HEADER, "")


def headers() -> dict[str, str] | None:
    """The Celery message headers that carry the current span to the task (None: none)."""
    value = traceparent()
    return {HEADER: value} if value else None


def trace_id() -> str:
    """The current trace's id, 32 hex digits ("" while off or outside a span): log lines carry it."""
    if _state.tracer is None:
        return ""
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else ""


def annotate(**attributes: AttributeValue | None) -> None:
    """Set attributes on the current span (what is known only inside it: a seq, a state)."""
    if _state.tracer is None:
        return
    from opentelemetry import trace

    current = trace.get_current_span()
    for key, value in attributes.items():
        if value is not None:
            current.set_attribute(f"orchestrator.{key}", value)


def failed(description: str) -> None:
    """Mark the current span an error (a run that did not succeed), with ``description``."""
    if _state.tracer is None:
        return
    from opentelemetry import trace

    trace.get_current_span().set_status(trace.Status(trace.StatusCode.ERROR, description[:500]))
