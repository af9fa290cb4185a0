"""A fake OpenTelemetry collector: OTLP/HTTP traces in the real protobuf wire format.

``FakeCollector`` serves ``POST /v1/traces`` on loopback TCP (``with collector.serve()
as endpoint``), decodes each body as an ``ExportTraceServiceRequest`` (the
``opentelemetry-proto`` messages the SDK's exporter encodes with; gzip-compressed
bodies too), answers with an encoded ``ExportTraceServiceResponse`` and keeps every
span as a :class:`Span`: names, ids in hex, parent, kind, attributes, links and the
sending service, so a test follows a trace across the processes that exported it.
Any other route gets a 404.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

TRACES_PATH = "/v1/traces"
KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    kind: str
    attributes: dict[str, Any]
    links: list[tuple[str, str]]  # (trace id, span id)
    service: str
    error: bool
    resource: dict[str, Any] = field(default_factory=dict)


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    return None if which is None else getattr(v, which)


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class FakeCollector:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self._lock = threading.Lock()

    def named(self, name: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.name == name]

    def by_id(self) -> dict[str, Span]:
        with self._lock:
            return {s.span_id: s for s in self.spans}

    def _receive(self, body: bytes) -> bytes:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        found: list[Span] = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    found.append(
                        Span(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            kind=KINDS.get(s.kind, str(s.kind)),
                            attributes=_attributes(s.attributes),
                            links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                            service=str(resource.get("service.name", "")),
                            error=s.status.code == 2,
                            resource=resource,
                        )
                    )
        with self._lock:
            self.requests += 1
            self.spans.extend(found)
        return ExportTraceServiceResponse().SerializeToString()

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Serve on a free loopback port; yields the traces endpoint's URL."""
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path != TRACES_PATH:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                answer = collector._receive(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True, name="fake-otlp-collector")
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}{TRACES_PATH}"
        finally:
            server.shutdown()
            server.server_close()
            thread.join()
