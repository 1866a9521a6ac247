"""A real OTLP/HTTP receiver on loopback: what an OpenTelemetry collector gets, decoded.

``OtlpReceiver()`` listens on 127.0.0.1 (port 0) and answers ``POST /v1/traces`` and
``POST /v1/metrics`` as a collector does: the body is a protobuf
``ExportTraceServiceRequest`` / ``ExportMetricsServiceRequest`` (gzip or not), decoded with
opentelemetry-proto, and the answer is an empty ``Export...ServiceResponse``. A body that
does not decode is answered 400 and counted in ``rejected``.

``spans()`` gives every span received as a :class:`Span` (ids as hex, attributes as
Python values, its instrumentation scope and its resource's ``service.name``);
``sums()`` the total of every counter data point received, by metric name and attributes;
``histograms()`` the count of every histogram's points likewise.

Run alone (``python3 -m tools.otlp_receiver``) it prints each span as it arrives.
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

MAX_BODY = 64 * 1024 * 1024


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_id: str  # '' for a root
    name: str
    kind: int
    scope: str
    service: str
    attributes: dict[str, Any] = field(default_factory=dict)
    status: int = 0  # 0 unset, 1 ok, 2 error
    start_ns: int = 0
    end_ns: int = 0


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attributes(v.kvlist_value.values)
    if kind == "bytes_value":
        return bytes(v.bytes_value)
    return getattr(v, kind)


def attributes(pairs: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for pair in pairs:
        assert isinstance(pair, KeyValue)
        found[pair.key] = value(pair.value)
    return found


class OtlpReceiver:
    """A loopback OTLP/HTTP endpoint; ``url`` is what ``[telemetry] otlp_endpoint`` takes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[Span] = []
        self._metrics: list[ExportMetricsServiceRequest] = []
        self.rejected = 0
        self.requests: list[tuple[str, str]] = []  # (path, content-type)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(min(length, MAX_BODY))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                ctype = self.headers.get("Content-Type", "")
                receiver.requests.append((self.path, ctype))
                try:
                    answer = receiver.receive(self.path, ctype, body)
                except (DecodeError, ValueError):
                    with receiver._lock:
                        receiver.rejected += 1
                    self.send_response(400)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="otlp-receiver", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- decoding ----------------------------------------------------------------------
    def receive(self, path: str, ctype: str, body: bytes) -> bytes:
        if ctype != "application/x-protobuf":
            raise ValueError(f"not protobuf: {ctype!r}")
        if path == "/v1/traces":
            request = ExportTraceServiceRequest.FromString(body)
            spans = list(_spans(request))
            with self._lock:
                self._spans.extend(spans)
            return ExportTraceServiceResponse().SerializeToString()
        if path == "/v1/metrics":
            metrics = ExportMetricsServiceRequest.FromString(body)
            with self._lock:
                self._metrics.append(metrics)
            return ExportMetricsServiceResponse().SerializeToString()
        raise ValueError(f"no OTLP endpoint {path!r}")

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)

    def sums(self) -> dict[tuple[str, tuple[tuple[str, Any], ...]], float]:
        """Each counter's latest cumulative value, by name and sorted attributes."""
        return {
            key: float(point.as_int if point.WhichOneof("value") == "as_int" else point.as_double)
            for key, point in self._points("sum")
        }

    def histograms(self) -> dict[tuple[str, tuple[tuple[str, Any], ...]], int]:
        """Each histogram's latest cumulative count, by name and sorted attributes."""
        return {key: int(point.count) for key, point in self._points("histogram")}

    def _points(self, data: str) -> list[tuple[tuple[str, tuple[tuple[str, Any], ...]], Any]]:
        """Every data point of the metrics holding ``data`` ("sum", "histogram"), in the
        order received (a later point of the same key is the latest)."""
        return [
            ((metric.name, tuple(sorted(attributes(point.attributes).items()))), point)
            for metric in self._each_metric()
            if metric.WhichOneof("data") == data
            for point in getattr(metric, data).data_points
        ]

    def _each_metric(self) -> list[Any]:
        with self._lock:
            requests = list(self._metrics)
        return [
            metric
            for request in requests
            for resource in request.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        ]


def _spans(request: ExportTraceServiceRequest) -> list[Span]:
    found = []
    for resource in request.resource_spans:
        service = attributes(resource.resource.attributes).get("service.name", "")
        for scope in resource.scope_spans:
            for span in scope.spans:
                found.append(
                    Span(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        name=span.name,
                        kind=span.kind,
                        scope=scope.scope.name,
                        service=str(service),
                        attributes=attributes(span.attributes),
                        status=span.status.code,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                    )
                )
    return found


def main() -> None:
    with OtlpReceiver() as receiver:
        print(f"listening on {receiver.url}", flush=True)
        seen = 0
        try:
            while True:
                threading.Event().wait(0.5)
                spans = receiver.spans()
                for span in spans[seen:]:
                    print(span, flush=True)
                seen = len(spans)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
