"""W3C trace context on Kafka records, and a handler invoker that opens one span per attempt.

Why here and this small: ``traceparent`` already travels with a record through retry tiers, the
DLQ and redrive as an ordinary user header (``kworkers.retry_tiers.headers`` keeps user headers),
so every attempt of one record can join the producer's trace. What is left is to read the
header strictly (a malformed one must start a new trace, never crash a handler or attach to a
wrong trace) and to open a span around each attempt. The span is a child of the record's
``traceparent``, so the first attempt, each retry and a redriven run all appear under the one
trace that produced the record, with ``kworkers.attempt`` telling them apart.

OpenTelemetry is an optional extra (``pip install kworkers[otel]``). Without it ``traced_invoke``
just calls the handler: the same worker code runs with and without tracing installed.

Parsing follows W3C Trace Context level 1: ``version-traceid-parentid-flags`` in lowercase hex;
version ``ff``, an all-zero trace id or parent id, uppercase hex or a wrong length make the
header invalid; a version above ``00`` may carry more fields after a ``-``, which are ignored.
"""

from __future__ import annotations

import importlib
import inspect
import re
import secrets
from collections.abc import Awaitable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from kworkers.activity import ActivityInvoker
from kworkers.consumer.ports import Handler, Invoker, Records
from kworkers.message import Message

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

_TRACEPARENT = re.compile(
    r"(?P<version>[0-9a-f]{2})-(?P<trace_id>[0-9a-f]{32})-(?P<span_id>[0-9a-f]{16})-"
    r"(?P<flags>[0-9a-f]{2})(?P<rest>.*)", re.DOTALL)
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
SAMPLED = 0x01


@dataclass(frozen=True)
class TraceParent:
    """A parsed ``traceparent``: which trace a record belongs to and the span that sent it."""

    trace_id: str
    span_id: str
    flags: int = SAMPLED
    version: int = 0

    def __post_init__(self) -> None:
        if not (re.fullmatch(r"[0-9a-f]{32}", self.trace_id) and self.trace_id != _ZERO_TRACE):
            raise ValueError(f"trace_id: 32 lowercase hex digits, not all zero: "
                             f"{self.trace_id!r}")
        if not (re.fullmatch(r"[0-9a-f]{16}", self.span_id) and self.span_id != _ZERO_SPAN):
            raise ValueError(f"span_id: 16 lowercase hex digits, not all zero: {self.span_id!r}")
        if not 0 <= self.flags <= 0xFF or not 0 <= self.version < 0xFF:
            raise ValueError(f"flags/version out of range: {self.flags}, {self.version}")

    @property
    def sampled(self) -> bool:
        return bool(self.flags & SAMPLED)

    def header(self) -> str:
        """The header value; always written as version 00, the only version defined."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"

    def child(self, span_id: str | None = None) -> TraceParent:
        """The context a span of this trace passes on: same trace, its own span id."""
        return TraceParent(self.trace_id, span_id or new_span_id(), self.flags)


def parse_traceparent(value: str | bytes | None) -> TraceParent | None:
    """The trace context in a ``traceparent`` value, or None when absent or invalid."""
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    m = _TRACEPARENT.fullmatch(value.strip(" \t"))
    if m is None:
        return None
    version = int(m["version"], 16)
    rest = m["rest"]
    if version == 0xFF or (version == 0 and rest) or (rest and not rest.startswith("-")):
        return None
    if m["trace_id"] == _ZERO_TRACE or m["span_id"] == _ZERO_SPAN:
        return None
    return TraceParent(m["trace_id"], m["span_id"], int(m["flags"], 16), version)


def new_trace_id() -> str:
    while True:
        tid = secrets.token_hex(16)
        if tid != _ZERO_TRACE:
            return tid


def new_span_id() -> str:
    while True:
        sid = secrets.token_hex(8)
        if sid != _ZERO_SPAN:
            return sid


def generate_traceparent(sampled: bool = True) -> TraceParent:
    """A new trace (for a producer that starts one, like the demo)."""
    return TraceParent(new_trace_id(), new_span_id(), SAMPLED if sampled else 0)


def trace_context_of(msg: Message) -> tuple[TraceParent | None, str | None]:
    """The record's (traceparent, tracestate). Several ``traceparent`` headers that disagree
    are invalid (as repeated HTTP headers would be); ``tracestate`` is only read when the
    ``traceparent`` is valid, as the spec requires."""
    values = {v for k, v in msg.headers if k == TRACEPARENT}
    if len(values) != 1:
        return None, None
    parent = parse_traceparent(values.pop())
    if parent is None:
        return None, None
    state = msg.header_str(TRACESTATE)
    return parent, (state if state else None)


def span_attributes(msg: Message) -> dict[str, str | int]:
    """OpenTelemetry messaging attributes of one attempt (topic, partition, offset, attempt)."""
    return {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": msg.topic,
        "messaging.destination.partition.id": str(msg.partition),
        "messaging.kafka.offset": msg.offset,
        "kworkers.attempt": msg.attempt,
    }


class SpanStarter(Protocol):
    """Opens a span: the one seam between kworkers and a tracing library (tests pass a fake)."""

    def __call__(self, name: str, parent: TraceParent | None, tracestate: str | None,
                 attributes: Mapping[str, str | int]) -> AbstractContextManager[Any]: ...


def otel_span_starter(tracer_provider: Any = None) -> SpanStarter | None:
    """A ``SpanStarter`` backed by the OpenTelemetry API, or None when it is not installed.

    ``tracer_provider``: the provider to use (default: the global one the application set).

    The parent comes from the record's headers through OpenTelemetry's own W3C propagator, so
    the span joins the producer's trace whatever tracer provider the application set up.
    """
    try:
        trace: Any = importlib.import_module("opentelemetry.trace")
        tc: Any = importlib.import_module("opentelemetry.trace.propagation.tracecontext")
    except ImportError:
        return None
    # without a provider argument this is a proxy until the app sets the global one: fine
    tracer = trace.get_tracer("kworkers", tracer_provider=tracer_provider)
    propagator = tc.TraceContextTextMapPropagator()
    consumer_kind = trace.SpanKind.CONSUMER

    def start(name: str, parent: TraceParent | None, tracestate: str | None,
              attributes: Mapping[str, str | int]) -> AbstractContextManager[Any]:
        carrier: dict[str, str] = {}
        if parent is not None:
            carrier[TRACEPARENT] = parent.header()
            if tracestate:
                carrier[TRACESTATE] = tracestate
        # an empty carrier yields an empty context: a new root span, never the poll thread's
        ctx = propagator.extract(carrier, context=_empty_context())
        cm: AbstractContextManager[Any] = tracer.start_as_current_span(
            name, context=ctx, kind=consumer_kind, attributes=dict(attributes))
        return cm

    return start


def _empty_context() -> Any:
    context: Any = importlib.import_module("opentelemetry.context")
    return context.Context()


class TracedInvoke:
    """An ``Invoker`` (see ``kworkers.consumer.ports``) that runs each attempt in its own span.

    It wraps another invoker (``inner``; None: call the handler directly), so tracing composes
    with the activity context: ``traced_invoke`` wraps a store-less ``ActivityInvoker``, what a
    ``Worker`` uses by default; a worker with an idempotency store passes
    ``TracedInvoke(inner=ActivityInvoker(store, ...))``. The span encloses the inner invoker,
    so a claim on the store is part of the attempt it belongs to.

    Sync handlers run inside the span; for an async handler the invoker returns a coroutine
    that opens the span, awaits the inner invoker's coroutine and closes it, so the span
    measures the attempt and not the time it waited for a slot. An exception leaves the span
    marked as failed (OpenTelemetry records it) and goes on to the loop, which routes the
    record to a tier or the DLQ as usual.
    """

    def __init__(self, start_span: SpanStarter | None = None, *, inner: Invoker | None = None,
                 auto: bool = True) -> None:
        self._start = start_span
        self._resolved = start_span is not None or not auto
        self._inner = inner

    def _starter(self) -> SpanStarter | None:
        if not self._resolved:  # resolved on first use: importing kworkers stays cheap
            self._start = otel_span_starter()
            self._resolved = True
        return self._start

    def _call(self, handler: Handler, msg: Records) -> Any:
        return handler(msg) if self._inner is None else self._inner(handler, msg)

    def __call__(self, handler: Handler, msg: Records) -> Any:
        start = self._starter()
        if start is None:
            return self._call(handler, msg)
        if inspect.iscoroutinefunction(handler):  # the loop's own test for an async handler
            return self._run_async(start, handler, msg)
        with self._span(start, msg):
            return self._call(handler, msg)

    async def _run_async(self, start: SpanStarter, handler: Handler, msg: Records) -> Any:
        with self._span(start, msg):
            pending: Awaitable[Any] = self._call(handler, msg)
            return await pending

    @staticmethod
    def _span(start: SpanStarter, msg: Records) -> AbstractContextManager[Any]:
        """One span per attempt; a batch's span continues its first record's trace."""
        first = msg[0] if isinstance(msg, list) else msg
        parent, state = trace_context_of(first)
        attrs = dict(span_attributes(first))
        if isinstance(msg, list):
            attrs["messaging.batch.message_count"] = len(msg)
        return start(f"{first.topic} process", parent, state, attrs)


#: the invoker to pass as ``Worker(invoke=...)``: the Worker's default activity context, inside
#: an OpenTelemetry span per attempt when OpenTelemetry is installed (else no span at all)
traced_invoke = TracedInvoke(inner=ActivityInvoker())
