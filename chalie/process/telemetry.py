"""Traces and metrics of every turn, over OTLP/HTTP with the OpenTelemetry SDK.

Off unless ``[telemetry] otlp_endpoint`` is set (:class:`chalie.process.config.TelemetryConfig`).
Off, every hook below returns at its first line and this module has imported nothing of
OpenTelemetry; on, it needs the extra (``pip install 'chalie[telemetry]'``:
opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http).

Lifecycle, in order:

1. :func:`start` (the daemon, before its actors): a TracerProvider with a batch exporter
   to ``<endpoint>/v1/traces``, set as the process's provider (so the MCP SDK's own
   spans are exported too), and a MeterProvider exporting to ``<endpoint>/v1/metrics``
   every ``metrics_interval`` seconds.
2. The hooks, one line each where things happen; they key spans by ids, so an actor
   keeps no span of its own:

   - ``chalie.turn`` (:func:`turn_started` / :func:`turn_ended`, actors/conversation/turn.py): its
     parent is the ``traceparent`` its message came with (:func:`turn_parent`; an inbound
     ``talk_to_chalie``: the MCP server's span, which continues the caller's
     ``_meta.traceparent``), else the tool call that started a delegate's conversation,
     else none.
   - ``chat MODEL`` (:func:`model_started` / :func:`model_ended`): a model request, a
     child of its turn, with its token counts.
   - ``execute_tool TOOL`` (:func:`tool_started`, :func:`tool_gated`,
     :func:`tool_executing`, :func:`tool_ended`, actors/calls/dispatcher.py): a child of its
     turn, with the gate's decision, who decided, the executor and the result's code.
     find_tools is one of these.
   - MCP requests: the MCP SDK's own client spans (``MCP send tools/call X``), made while
     :func:`within_call` holds the tool call's span current (chalie/mcp/session.py); the
     SDK also sends the trace on in the request's ``_meta``.
3. :func:`stop` (the daemon, after its actors): the last spans and metrics are sent.

Metrics: ``chalie.tool.calls``, ``chalie.tool.errors`` (counters) and
``chalie.tool.duration`` (a histogram, seconds), by ``gen_ai.tool.name``; and
``chalie.model.tokens`` (a counter) by model and ``gen_ai.token.type``.

No content: spans carry names, ids, codes, counts and timings. Messages, answers, tool
arguments (as the trail keeps them: secrets redacted) and results are added only with
``[telemetry] include_content = true``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from chalie.process.config import TelemetryConfig
    from chalie.providers.types import ModelResponse, ProviderError
    from chalie.wire.messages import ToolCall

__all__ = [
    "current_traceparent",
    "enabled",
    "model_ended",
    "model_started",
    "start",
    "stop",
    "tool_ended",
    "tool_executing",
    "tool_gated",
    "tool_started",
    "turn_ended",
    "turn_parent",
    "turn_started",
    "within_call",
]

log = logging.getLogger("chalie.process.telemetry")

# The longest text an attribute holds (include_content only).
MAX_CONTENT: Final = 4096
# Spans open at once, each kind; past it the oldest is ended (a hook that never came).
MAX_OPEN: Final = 10_000
# W3C trace context: version 00, a trace id and a parent id not all zeros, flags.
TRACEPARENT: Final = re.compile(r"^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")
# The MCP SDK's spans; its pings (a heartbeat each server, outside any call) are not sent.
MCP_SCOPE: Final = "mcp-python-sdk"
QUIET: Final = frozenset({"MCP send ping"})
UNRESOLVED: Final = "(unresolved)"  # a metric's tool name before the registry named it


class _Open:
    """Spans open at once, by id; the oldest ended past MAX_OPEN (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: dict[str, Any] = {}

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._spans[key] = value
            oldest = next(iter(self._spans)) if len(self._spans) > MAX_OPEN else None
            dropped = self._spans.pop(oldest) if oldest is not None else None
        if dropped is not None and not isinstance(dropped, str):  # a span (not a parent)
            _span_of(dropped).end()

    def get(self, key: str) -> Any:
        with self._lock:
            return self._spans.get(key)

    def pop(self, key: str) -> Any:
        with self._lock:
            return self._spans.pop(key, None)

    def drain(self) -> list[Any]:
        with self._lock:
            found, self._spans = list(self._spans.values()), {}
        return found


class _Tool:
    """An open tool call: its span, its start, the registry's name once known."""

    __slots__ = ("name", "span", "started")

    def __init__(self, span: Any) -> None:
        self.span = span
        self.started = time.monotonic()
        self.name = UNRESOLVED


def _span_of(value: Any) -> Any:
    return value.span if isinstance(value, _Tool) else value


class _Telemetry:
    """What :func:`start` made: the tracer, the instruments and the open spans."""

    def __init__(self, tracer: Any, meters: Any, content: bool) -> None:
        self.tracer = tracer
        self.meters = meters
        self.content = content
        meter = meters.get_meter("chalie")
        self.calls = meter.create_counter("chalie.tool.calls", unit="{call}")
        self.errors = meter.create_counter("chalie.tool.errors", unit="{call}")
        self.duration = meter.create_histogram("chalie.tool.duration", unit="s")
        self.tokens = meter.create_counter("chalie.model.tokens", unit="{token}")
        self.turns = _Open()  # turn_id -> span
        self.parents = _Open()  # turn_id -> the traceparent its sender gave, until it starts
        self.models = _Open()  # turn_id -> span of its open model request
        self.tools = _Open()  # call_id -> _Tool

    def text(self, value: str) -> str:
        return value[:MAX_CONTENT]


_on: _Telemetry | None = None
_pipeline: Any = None  # the process's tracer provider and its exporter switch (set once)


# -- start and stop ------------------------------------------------------------------------


def enabled() -> bool:
    return _on is not None


def start(config: TelemetryConfig) -> bool:
    """Export to ``config.otlp_endpoint`` from now on; False (and nothing imported) when
    it is unset. Raises ImportError with the extra to install when the SDK is missing."""
    global _on
    if config.otlp_endpoint is None:
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ImportError(
            f"[telemetry] otlp_endpoint is set but OpenTelemetry is not installed ({exc}); "
            "pip install 'chalie[telemetry]'"
        ) from None
    stop()
    base = config.otlp_endpoint.rstrip("/")
    resource = Resource.create({"service.name": config.service_name})
    pipeline = _tracer_pipeline(resource)
    pipeline.switch.target = BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces"))
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=f"{base}/v1/metrics"),
        export_interval_millis=config.metrics_interval * 1000,
    )
    meters = MeterProvider(resource=resource, metric_readers=[reader])
    _on = _Telemetry(pipeline.provider.get_tracer("chalie"), meters, config.include_content)
    log.info("telemetry on", extra={"otlp_endpoint": base, "content": config.include_content})
    return True


def stop() -> None:
    """Send what is left (spans still open are ended as they are) and turn the hooks off."""
    global _on
    on, _on = _on, None
    if on is None:
        return
    for kind in (on.tools, on.models, on.turns):
        for found in kind.drain():
            _span_of(found).end()
    switch = _pipeline.switch
    target, switch.target = switch.target, None
    with contextlib.suppress(Exception):
        target.shutdown()  # exports what the batch holds
    with contextlib.suppress(Exception):
        on.meters.shutdown()  # one last collection, exported


def _tracer_pipeline(resource: Any) -> Any:
    """The process's TracerProvider, made and set once (OpenTelemetry allows one); each
    :func:`start` puts its own exporter behind its switch."""
    global _pipeline
    if _pipeline is not None:
        return _pipeline
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

    class Switch(SpanProcessor):
        """Passes spans to the exporter of the current start; drops the SDK's pings."""

        target: Any = None

        def on_start(self, span: Any, parent_context: Any = None) -> None:
            target = self.target
            if target is not None:
                target.on_start(span, parent_context=parent_context)

        def on_end(self, span: ReadableSpan) -> None:
            target = self.target
            scope = span.instrumentation_scope
            if target is None or (
                scope is not None and scope.name == MCP_SCOPE and span.name in QUIET
            ):
                return
            target.on_end(span)

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            target = self.target
            return bool(target.force_flush(timeout_millis)) if target is not None else True

    class Pipeline:
        def __init__(self) -> None:
            self.provider = TracerProvider(resource=resource)
            self.switch = Switch()
            self.provider.add_span_processor(self.switch)

    _pipeline = Pipeline()
    trace.set_tracer_provider(_pipeline.provider)
    return _pipeline


# -- context ---------------------------------------------------------------------------------


def current_traceparent() -> str:
    """The W3C ``traceparent`` of the span current here ('' when off or none): what a
    message carries to the turn it starts on another thread."""
    if _on is None:
        return ""
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get("traceparent", "")


def _parent(traceparent: str) -> Any:
    """The context a ``traceparent`` names (None: malformed or empty)."""
    if not TRACEPARENT.match(traceparent):
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def _under(span: Any) -> Any:
    from opentelemetry import trace

    return trace.set_span_in_context(span)


@contextlib.contextmanager
def within_call(call_id: str) -> Iterator[None]:
    """Hold the tool call's span current (this task): the MCP SDK's request spans made
    here are its children, and the request carries its trace on."""
    tool = _on.tools.get(call_id) if _on is not None and call_id else None
    if tool is None:
        yield
        return
    from opentelemetry import trace

    with trace.use_span(tool.span, end_on_exit=False):
        yield


# -- turns and model requests (actors/conversation/turn.py)
# -------------------------------------------------


def turn_parent(turn_id: str, traceparent: str) -> None:
    """The trace a turn continues (its message's ``traceparent``), said where the message
    is taken (actors/conversation/conversations.py), before the turn may start on another thread."""
    if _on is not None and traceparent:
        _on.parents.put(turn_id, traceparent)


def turn_started(
    conversation_id: str, turn_id: str, text: str, channel: str, parent_call: str
) -> None:
    on = _on
    if on is None:
        return
    parent = _parent(on.parents.pop(turn_id) or "")
    if parent is None and parent_call:
        tool = on.tools.get(parent_call)  # a delegate's conversation, run for that call
        parent = _under(tool.span) if tool is not None else None
    attributes = {
        "chalie.conversation.id": conversation_id,
        "chalie.turn.id": turn_id,
        "chalie.channel": channel,
    }
    if on.content:
        attributes["chalie.turn.message"] = on.text(text)
    on.turns.put(turn_id, on.tracer.start_span("chalie.turn", parent, attributes=attributes))


def turn_ended(turn_id: str, reason: str, text: str = "") -> None:
    on = _on
    if on is None:
        return
    model = on.models.pop(turn_id)
    if model is not None:
        _failed(model, "turn-ended")
        model.end()
    span = on.turns.pop(turn_id)
    if span is None:
        return
    span.set_attribute("chalie.turn.reason", reason)
    if on.content and text:
        span.set_attribute("chalie.turn.answer", on.text(text))
    if reason not in ("final", "cancelled"):
        _failed(span, reason)
    span.end()


def model_started(turn_id: str, model: str, provider: str) -> None:
    on = _on
    if on is None:
        return
    turn = on.turns.get(turn_id)
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": model,
        "gen_ai.provider.name": provider,
    }
    span = on.tracer.start_span(
        f"chat {model}", _under(turn) if turn is not None else None, attributes=attributes
    )
    earlier = on.models.pop(turn_id)
    if earlier is not None:
        earlier.end()
    on.models.put(turn_id, span)


def model_ended(
    turn_id: str, model: str, response: ModelResponse | None, error: ProviderError | None
) -> None:
    on = _on
    if on is None:
        return
    span = on.models.pop(turn_id)
    if response is not None:
        usage = response.usage
        for kind, count in (("input", usage.input_tokens), ("output", usage.output_tokens)):
            on.tokens.add(count, {"gen_ai.request.model": model, "gen_ai.token.type": kind})
    if span is None:
        return
    if response is not None:
        span.set_attributes(
            {
                "gen_ai.usage.input_tokens": response.usage.input_tokens,
                "gen_ai.usage.output_tokens": response.usage.output_tokens,
                "chalie.model.tool_calls": len(response.tool_calls),
            }
        )
        if on.content:
            span.set_attribute("chalie.model.answer", on.text(response.text))
    else:
        _failed(span, error.code if error is not None else "model-bad-response")
    span.end()


# -- tool calls (actors/calls/dispatcher.py)
# -----------------------------------------------------------


def tool_started(call: ToolCall) -> None:
    on = _on
    if on is None:
        return
    ctx = call.context
    turn = on.turns.get(ctx.turn_id) if ctx.turn_id else None
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.call.id": call.call_id,
        "chalie.turn.id": ctx.turn_id,
        "chalie.channel": str(ctx.channel),
        "chalie.initiator": str(ctx.initiator),
    }
    name = str(call.tool)[:128]
    span = on.tracer.start_span(
        f"execute_tool {name}", _under(turn) if turn is not None else None, attributes=attributes
    )
    on.tools.put(call.call_id, _Tool(span))


def tool_gated(
    call_id: str,
    tool: str,
    permission: str,
    decision: str,
    decided_by: str,
    arguments: str,
) -> None:
    """The registry's name, the permission and the gate's answer; ``arguments`` (the
    trail's redacted JSON) only with include_content."""
    on = _on
    found = on.tools.get(call_id) if on is not None else None
    if on is None or found is None:
        return
    found.name = tool
    found.span.update_name(f"execute_tool {tool}")
    found.span.set_attributes(
        {
            "gen_ai.tool.name": tool,
            "chalie.permission": permission,
            "chalie.gate.decision": decision,
            "chalie.gate.decided_by": decided_by,
        }
    )
    if on.content:
        found.span.set_attribute("chalie.tool.arguments", on.text(arguments))


def tool_executing(call_id: str, executor: str) -> None:
    found = _on.tools.get(call_id) if _on is not None else None
    if found is not None:
        found.span.set_attribute("chalie.executor", executor)


def tool_ended(call_id: str, status: str, code: str | None, envelope: str) -> None:
    on = _on
    found = on.tools.pop(call_id) if on is not None else None
    if on is None or found is None:
        return
    labels = {"gen_ai.tool.name": found.name}
    on.calls.add(1, labels)
    on.duration.record(time.monotonic() - found.started, labels)
    span = found.span
    span.set_attribute("chalie.status", status)
    if code:
        span.set_attribute("chalie.code", code)
    if status == "error":
        on.errors.add(1, {**labels, "error.type": code or "error"})
        _failed(span, code or "error")
    if on.content:
        span.set_attribute("chalie.tool.result", on.text(envelope))
    span.end()


def _failed(span: Any, code: str) -> None:
    from opentelemetry.trace import StatusCode

    span.set_attribute("error.type", code)
    span.set_status(StatusCode.ERROR, code)
