"""traceparent parsing (W3C Trace Context) and the span-per-attempt invoker."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest

from kworkers import Message, activity
from kworkers.consumer.ports import Invoker, Records
from kworkers.tracing import (
    TracedInvoke,
    TraceParent,
    generate_traceparent,
    otel_span_starter,
    parse_traceparent,
    span_attributes,
    trace_context_of,
    traced_invoke,
)

TID = "4bf92f3577b34da6a3ce929d0e0e4736"
SID = "00f067aa0ba902b7"
VALID = f"00-{TID}-{SID}-01"


def msg(*headers: tuple[str, bytes], attempt: int = 1) -> Message:
    return Message("orders", 3, 42, b"k", b"v", tuple(headers), 0, attempt)


# ---------------------------------------------------------------------- parsing


def test_parse_valid() -> None:
    tp = parse_traceparent(VALID)
    assert tp == TraceParent(TID, SID, 1, 0)
    assert tp is not None and tp.sampled and tp.header() == VALID
    assert parse_traceparent(VALID.encode()) == tp
    unsampled = parse_traceparent(f"00-{TID}-{SID}-00")
    assert unsampled is not None and not unsampled.sampled


@pytest.mark.parametrize("value", [
    None, "", "garbage",
    f"00-{TID}-{SID}-0",                  # short flags
    f"00-{TID}-{SID}-01-extra",           # version 00 has exactly four fields
    f"00-{TID}-{SID}-011",                # too long
    f"00-{TID.upper()}-{SID}-01",         # uppercase hex
    f"00-{'0' * 32}-{SID}-01",            # all-zero trace id
    f"00-{TID}-{'0' * 16}-01",            # all-zero parent id
    f"ff-{TID}-{SID}-01",                 # version ff is forbidden
    f"0-{TID}-{SID}-01",                  # short version
    f"00_{TID}_{SID}_01",                 # wrong separators
    f"00-{TID[:-1]}g-{SID}-01",           # not hex
    f"01-{TID}-{SID}-01x",                # future version: more data must follow a '-'
    b"\xff\xfe",                          # not ASCII
])
def test_parse_invalid(value: str | bytes | None) -> None:
    assert parse_traceparent(value) is None


def test_future_version_keeps_the_known_fields() -> None:
    tp = parse_traceparent(f"cc-{TID}-{SID}-01-what-the-future-holds")
    assert tp == TraceParent(TID, SID, 1, 0xCC)
    assert tp.header() == VALID  # we write the version we know


def test_surrounding_whitespace_is_tolerated() -> None:
    assert parse_traceparent(f"  {VALID}\t") == TraceParent(TID, SID)


def test_generate_and_child() -> None:
    a, b = generate_traceparent(), generate_traceparent(sampled=False)
    assert a.trace_id != b.trace_id and a.sampled and not b.sampled
    assert parse_traceparent(a.header()) == a
    c = a.child()
    assert c.trace_id == a.trace_id and c.span_id != a.span_id and c.flags == a.flags


def test_traceparent_value_is_validated() -> None:
    with pytest.raises(ValueError):
        TraceParent("0" * 32, SID)
    with pytest.raises(ValueError):
        TraceParent(TID, "xyz")


def test_trace_context_of_a_record() -> None:
    parent, state = trace_context_of(msg(("traceparent", VALID.encode()),
                                         ("tracestate", b"vendor=1")))
    assert parent == TraceParent(TID, SID) and state == "vendor=1"
    assert trace_context_of(msg()) == (None, None)
    # tracestate is ignored without a valid traceparent
    assert trace_context_of(msg(("traceparent", b"bad"), ("tracestate", b"v=1"))) == (None, None)
    # the same value twice is one context; two different values are none
    same = msg(("traceparent", VALID.encode()), ("traceparent", VALID.encode()))
    assert trace_context_of(same)[0] == TraceParent(TID, SID)
    other = f"00-{TID}-{'1' * 16}-01".encode()
    assert trace_context_of(msg(("traceparent", VALID.encode()), ("traceparent", other))) == (
        None, None)


# ---------------------------------------------------------------------- invoker


class FakeTracer:
    """Records each span: name, parent, tracestate, attributes, and the error it ended with."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.open = 0

    def __call__(self, name: str, parent: TraceParent | None, tracestate: str | None,
                 attributes: Mapping[str, str | int]) -> AbstractContextManager[Any]:
        @contextmanager
        def span() -> Iterator[dict[str, Any]]:
            rec: dict[str, Any] = {"name": name, "parent": parent, "state": tracestate,
                                   "attrs": dict(attributes), "error": None}
            self.spans.append(rec)
            self.open += 1
            try:
                yield rec
            except BaseException as exc:
                rec["error"] = exc
                raise
            finally:
                self.open -= 1
        return span()


def test_sync_handler_runs_inside_a_span_per_attempt() -> None:
    tracer = FakeTracer()
    invoke: Invoker = TracedInvoke(tracer)
    seen: list[int] = []

    def handler(m: Message) -> str:
        seen.append(tracer.open)
        return "done"

    record = msg(("traceparent", VALID.encode()), attempt=3)
    assert invoke(handler, record) == "done"
    assert seen == [1]  # the span was open while the handler ran
    (span,) = tracer.spans
    assert span["name"] == "orders process"
    assert span["parent"] == TraceParent(TID, SID)
    assert span["attrs"] == {
        "messaging.system": "kafka", "messaging.operation.type": "process",
        "messaging.destination.name": "orders", "messaging.destination.partition.id": "3",
        "messaging.kafka.offset": 42, "kworkers.attempt": 3}
    assert tracer.open == 0


def test_a_failing_attempt_marks_its_span_and_still_raises() -> None:
    tracer = FakeTracer()

    def handler(m: Message) -> None:
        raise ConnectionError("db down")

    with pytest.raises(ConnectionError):
        TracedInvoke(tracer)(handler, msg())
    assert isinstance(tracer.spans[0]["error"], ConnectionError)
    assert tracer.spans[0]["parent"] is None  # no header: a new trace


def test_async_handler_gets_a_wrapped_coroutine() -> None:
    tracer = FakeTracer()
    seen: list[int] = []

    async def handler(m: Message) -> int:
        await asyncio.sleep(0)
        seen.append(tracer.open)
        return m.offset

    result = TracedInvoke(tracer)(handler, msg(("traceparent", VALID.encode())))
    assert asyncio.iscoroutine(result)
    assert tracer.spans == []  # nothing opened until the loop awaits it
    assert asyncio.run(result) == 42
    assert seen == [1] and tracer.open == 0
    assert tracer.spans[0]["parent"] == TraceParent(TID, SID)


def test_async_failure_is_recorded() -> None:
    tracer = FakeTracer()

    async def handler(m: Message) -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError):
        asyncio.run(TracedInvoke(tracer)(handler, msg()))
    assert isinstance(tracer.spans[0]["error"], ValueError)


def test_no_tracer_is_a_plain_call() -> None:
    invoke = TracedInvoke(None, auto=False)
    calls: list[Message] = []
    m = msg(("traceparent", VALID.encode()))
    def sync(x: Message) -> str:
        calls.append(x)
        return "r"

    assert invoke(sync, m) == "r"
    assert calls == [m]

    async def handler(x: Message) -> str:
        return "a"

    assert asyncio.run(invoke(handler, m)) == "a"


def test_the_span_wraps_the_inner_invoker() -> None:
    tracer = FakeTracer()
    order: list[str] = []

    def inner(handler: Any, msg: Records) -> Any:
        order.append(f"inner open={tracer.open}")
        return handler(msg)

    def handler(m: Message) -> str:
        order.append("handler")
        return "x"

    assert TracedInvoke(tracer, inner=inner)(handler, msg()) == "x"
    assert order == ["inner open=1", "handler"]

    async def ahandler(m: Message) -> str:
        order.append("async handler")
        return "y"

    def ainner(handler: Any, msg: Records) -> Any:
        order.append(f"async inner open={tracer.open}")
        return handler(msg)

    order.clear()
    assert asyncio.run(TracedInvoke(tracer, inner=ainner)(ahandler, msg())) == "y"
    assert order == ["async inner open=1", "async handler"]


def test_traced_invoke_keeps_the_activity_context() -> None:
    seen: list[int] = []

    def handler(m: Message) -> None:
        seen.append(activity.attempt())

    traced_invoke(handler, msg(attempt=4))

    async def ahandler(m: Message) -> None:
        seen.append(activity.attempt())

    asyncio.run(traced_invoke(ahandler, msg(attempt=5)))
    assert seen == [4, 5]


HAVE_OTEL = importlib.util.find_spec("opentelemetry") is not None


def test_without_opentelemetry_traced_invoke_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    if HAVE_OTEL:  # hide it: a None entry makes the import fail as if it were not installed
        monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)
    assert otel_span_starter() is None
    m = msg(("traceparent", VALID.encode()))
    assert traced_invoke(lambda x: x.offset, m) == 42


def test_span_attributes_follow_the_record() -> None:
    a = span_attributes(Message("t", 0, 7, None, None, (), None, 2))
    assert (a["messaging.destination.name"], a["messaging.kafka.offset"],
            a["kworkers.attempt"]) == ("t", 7, 2)


def test_opentelemetry_span_joins_the_records_trace() -> None:
    """Runs where the `otel` extra is installed: a real span, parented by the header."""
    sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
    export = pytest.importorskip("opentelemetry.sdk.trace.export")
    memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
    exporter = memory.InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    start = otel_span_starter(provider)  # not the global provider: that can be set only once
    assert start is not None
    invoke = TracedInvoke(start)

    def handler(m: Message) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        invoke(handler, msg(("traceparent", VALID.encode()), attempt=2))
    (span,) = exporter.get_finished_spans()
    assert span.name == "orders process"
    assert format(span.context.trace_id, "032x") == TID
    assert format(span.parent.span_id, "016x") == SID
    assert span.attributes["kworkers.attempt"] == 2
    assert span.attributes["messaging.kafka.offset"] == 42
    assert not span.status.is_ok
