"""traceparent parsing (W3C Trace Context) and the span-per-attempt invoker."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest

from kworkers import Message, activity
from kworkers.consumer.ports import Invoker, Records
from kworkers.errors import BatchError, DecodeError
from kworkers.retry_tiers.headers import redrive_headers, user_headers
from kworkers.retry_tiers.router import failure_headers
from kworkers.testing.otel import memory_tracing
from kworkers.tracing import (
    Conventions,
    SpanLink,
    TracedInvoke,
    TraceParent,
    generate_traceparent,
    otel_span_starter,
    parse_traceparent,
    plan_span,
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


class FakeSpan:
    """An open span of ``FakeTracer``: its own context, attributes set on it land in ``rec``."""

    def __init__(self, rec: dict[str, Any], context: TraceParent | None) -> None:
        self.rec = rec
        self._context = context

    @property
    def context(self) -> TraceParent | None:
        return self._context

    def set_attribute(self, key: str, value: str | int) -> None:
        self.rec["attrs"][key] = value


class FakeTracer:
    """Records each span: name, parent, tracestate, attributes, links, its own context and the
    error it ended with."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.open = 0

    def __call__(self, name: str, parent: TraceParent | None, tracestate: str | None,
                 attributes: Mapping[str, str | int], links: Sequence[SpanLink] = ()
                 ) -> AbstractContextManager[Any]:
        @contextmanager
        def span() -> Iterator[FakeSpan]:
            own = (parent or generate_traceparent()).child()
            rec: dict[str, Any] = {"name": name, "parent": parent, "state": tracestate,
                                   "attrs": dict(attributes), "links": tuple(links),
                                   "context": own, "error": None}
            self.spans.append(rec)
            self.open += 1
            try:
                yield FakeSpan(rec, own)
            except BaseException as exc:
                rec["error"] = exc
                raise
            finally:
                self.open -= 1
        return span()


def test_sync_handler_runs_inside_a_span_per_attempt() -> None:
    tracer = FakeTracer()
    invoke: Invoker = TracedInvoke(tracer, conventions=Conventions())
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
    provider, exporter = memory_tracing()
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


# ---------------------------------------------------------------------- conventions, links

PREV = f"00-{TID}-{'a' * 16}-01"


@pytest.mark.parametrize(("value", "old", "new"), [
    (None, True, False), ("", True, False), ("http", True, False),
    ("messagingx", True, False), ("http, messaging", False, True),
    ("messaging,messaging/dup", True, True), (" messaging/dup ", True, True),
])
def test_the_opt_in_variable_picks_the_conventions(value: str | None, old: bool,
                                                   new: bool) -> None:
    assert Conventions.from_opt_in(value) == Conventions(old=old, new=new)


def test_a_conventions_value_carries_at_least_one_set() -> None:
    with pytest.raises(ValueError):
        Conventions(old=False, new=False)


def test_the_parent_is_the_records_traceparent_and_the_earlier_attempt_a_link() -> None:
    m = msg(("traceparent", VALID.encode()), ("kw-trace-previous", PREV.encode()), attempt=2)
    plan = plan_span(m)
    assert plan.parent == TraceParent(TID, SID)
    assert plan.links == (SpanLink(TraceParent(TID, SID), "creation"),
                          SpanLink(TraceParent(TID, "a" * 16), "previous_attempt"))


def test_without_a_traceparent_the_attempt_before_is_the_parent() -> None:
    """kworkers never writes a traceparent; its own header keeps the attempts in one trace."""
    plan = plan_span(msg(("kw-trace-previous", PREV.encode()), attempt=2))
    assert plan.parent == TraceParent(TID, "a" * 16)
    assert plan.links == (SpanLink(TraceParent(TID, "a" * 16), "previous_attempt"),)
    assert plan_span(msg(("kw-trace-previous", b"garbage"))).parent is None


def test_a_batch_links_every_records_creation_context_once() -> None:
    other = f"00-{'b' * 32}-{'c' * 16}-01".encode()
    batch = [msg(("traceparent", VALID.encode())), msg(("traceparent", other)),
             msg(("traceparent", VALID.encode()))]
    plan = plan_span(batch, Conventions(old=False, new=True))
    assert plan.parent == TraceParent(TID, SID)
    assert [lk.context.trace_id for lk in plan.links] == [TID, "b" * 32]
    assert plan.attributes["messaging.batch.message_count"] == 3
    assert "messaging.kafka.offset" not in plan.attributes  # new: single records only


def test_old_new_and_dup_names_and_attributes() -> None:
    m = msg(("kw-redrive-of", b"orders.dlq/0/7"))
    old = plan_span(m, Conventions(), group="billing")
    assert old.name == "orders process"
    assert dict(old.attributes) == {
        "messaging.system": "kafka", "messaging.operation.type": "process",
        "messaging.destination.name": "orders", "messaging.destination.partition.id": "3",
        "messaging.kafka.offset": 42, "kworkers.attempt": 1,
        "kworkers.redrive_of": "orders.dlq/0/7"}
    new = plan_span(m, Conventions(old=False, new=True), group="billing")
    assert new.name == "process orders"
    assert dict(new.attributes) == {
        **old.attributes, "messaging.operation.name": "process",
        "messaging.consumer.group.name": "billing"}
    dup = plan_span(m, Conventions(old=True, new=True), group="billing")
    assert (dup.name, dict(dup.attributes)) == (new.name, dict(new.attributes))


def test_a_failed_attempt_hands_its_span_to_the_hand_off() -> None:
    """The exception carries ``kw-trace-previous`` (beside a failure's own headers) into
    ``failure_headers``, which the router appends to the tier or DLQ record."""
    tracer = FakeTracer()
    schema = DecodeError("bad payload")
    schema.failure_headers = (("kw-schema-id", b"7"),)  # type: ignore[attr-defined]

    def handler(m: Message) -> None:
        raise schema

    with pytest.raises(DecodeError):
        TracedInvoke(tracer, conventions=Conventions(old=False, new=True))(
            handler, msg(("traceparent", VALID.encode())))
    (span,) = tracer.spans
    assert failure_headers(schema) == (
        ("kw-schema-id", b"7"), ("kw-trace-previous", span["context"].header().encode()))
    assert span["attrs"]["error.type"] == "DecodeError"


def test_each_hop_replaces_the_link_and_a_redrive_keeps_it() -> None:
    m = msg(("traceparent", VALID.encode()), ("kw-trace-previous", PREV.encode()), attempt=2)
    newer = f"00-{TID}-{'d' * 16}-01".encode()
    tier = (*user_headers(m.headers), ("kw-trace-previous", newer))
    assert [v for k, v in tier if k == "kw-trace-previous"] == [newer]
    dead = Message("orders.dlq", 0, 5, None, None, tier)
    replay = redrive_headers(dead)
    assert dict(replay)["kw-trace-previous"] == newer
    assert dict(replay)["traceparent"] == VALID.encode()  # the user's, unchanged
    assert "kw-trace-previous" not in dict(redrive_headers(dead._replace(headers=())))


def test_the_opt_in_variable_renames_a_real_span(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the environment, as an operator sets it: the OpenTelemetry SDK's spans."""
    provider, exporter = memory_tracing()
    m = msg(("traceparent", VALID.encode()), ("kw-trace-previous", PREV.encode()), attempt=2)
    names = {}
    for value in (None, "messaging", "messaging/dup"):
        if value is None:
            monkeypatch.delenv("OTEL_SEMCONV_STABILITY_OPT_IN", raising=False)
        else:
            monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", value)
        exporter.clear()
        invoke = TracedInvoke(otel_span_starter(provider)).in_group("billing")
        invoke(lambda x: None, m)
        (span,) = exporter.get_finished_spans()
        names[value] = (span.name, span.attributes.get("messaging.operation.name"),
                        span.attributes.get("messaging.consumer.group.name"))
        assert format(span.parent.span_id, "016x") == SID
        assert [(format(lk.context.span_id, "016x"), lk.attributes["kworkers.link"])
                for lk in span.links] == [(SID, "creation"), ("a" * 16, "previous_attempt")]
    assert names == {None: ("orders process", None, None),
                     "messaging": ("process orders", "process", "billing"),
                     "messaging/dup": ("process orders", "process", "billing")}


def test_the_link_to_the_attempt_before_names_the_hop_between() -> None:
    prev = ("kw-trace-previous", PREV.encode())
    tier = Message("orders.retry.5s", 0, 1, None, None, (prev,), None, 2)
    redriven = msg(prev, ("kw-redrive-of", b"orders.dlq/0/7"))
    assert [lk.via for lk in plan_span(tier).links] == ["retry tier orders.retry.5s"]
    assert [lk.via for lk in plan_span(redriven).links] == ["dead letter orders.dlq/0/7"]
    assert plan_span(redriven).links[0].attributes() == {
        "kworkers.link": "previous_attempt", "kworkers.link.via": "dead letter orders.dlq/0/7"}


def test_an_async_failure_hands_its_span_to_the_hand_off_too() -> None:
    tracer = FakeTracer()
    boom = ConnectionError("down")

    async def handler(m: Message) -> None:
        raise boom

    with pytest.raises(ConnectionError):
        asyncio.run(TracedInvoke(tracer)(handler, msg(("traceparent", VALID.encode()))))
    assert failure_headers(boom) == (
        ("kw-trace-previous", tracer.spans[0]["context"].header().encode()),)


def test_a_span_that_is_not_recorded_writes_no_link() -> None:
    class Unrecorded(FakeTracer):
        def __call__(self, *args: Any, **kwargs: Any) -> AbstractContextManager[Any]:
            @contextmanager
            def span() -> Iterator[FakeSpan]:
                yield FakeSpan({"attrs": {}}, None)
            return span()

    boom = ConnectionError("down")

    def handler(m: Message) -> None:
        raise boom

    with pytest.raises(ConnectionError):
        TracedInvoke(Unrecorded())(handler, msg())
    assert failure_headers(boom) == ()


def test_a_batch_error_hands_the_batch_span_to_each_failed_record() -> None:
    tracer = FakeTracer()
    a, b = msg(), msg()._replace(offset=43)
    ea, eb = ConnectionError("a"), ValueError("b")

    def handler(ms: list[Message]) -> None:
        raise BatchError({a: ea, b: eb})

    with pytest.raises(BatchError):
        TracedInvoke(tracer)(handler, [a, b])
    link = ("kw-trace-previous", tracer.spans[0]["context"].header().encode())
    assert failure_headers(ea) == failure_headers(eb) == (link,)
