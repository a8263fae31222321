"""The span tree of one record that fails on every hop, is dead-lettered and redriven (#49).

A real broker, a real worker, the OpenTelemetry SDK's in-memory exporter: the test's producer
opens a "send" span and writes its context as the record's ``traceparent``; the handler fails
on the source topic and on both retry tiers (three attempts, two tier hops), the third failure
dead-letters the record, ``kworkers.dlq.redrive.redrive`` replays it and the fourth attempt
succeeds. What a person reading the trace must see (``kworkers.tracing``'s rule):

- one trace id on every span;
- each attempt's span a child of the producer's span (the record's ``traceparent``, which
  arrives unchanged on every hop), never of another attempt;
- each attempt after the first linked to the attempt before (``kw-trace-previous``), across the
  tier hops *and* across the DLQ and the redrive; every attempt linked to its creation context;
- the current conventions' names and attributes (the worker runs with ``messaging``), the
  consumer group of the loop that ran it, the failures' ``error.type``, and the redriven
  attempt naming its dead letter.

Canaries (kept in the suite): the hand-off not writing the link header, and a redrive dropping
it; each must fail the link check. ``KWORKERS_DRAW_TRACE=<path>`` writes the tree of the
passing run there (how ``docs/TRACING.md``'s picture was made).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from kworkers import Message, RetryPolicy, TierLadder, Worker, tracing
from kworkers.dlq import replayer
from kworkers.dlq.redrive import redrive
from kworkers.message import Headers
from kworkers.retry_tiers.headers import TRACE_PREVIOUS, redrive_headers
from kworkers.retry_tiers.policy import no_jitter
from kworkers.testing import Broker
from kworkers.testing.otel import memory_tracing
from kworkers.testing.workload import make_topic, produce, read_all, unique
from tests.integration.conftest import running, wait_for

pytestmark = pytest.mark.integration

otel = pytest.importorskip("opentelemetry.trace")
propagate = pytest.importorskip("opentelemetry.trace.propagation.tracecontext")


def _hex(n: int, width: int) -> str:
    return format(n, f"0{width}x")


def _link_of(span: Any, kind: str) -> list[str]:
    return [_hex(lk.context.span_id, 16) for lk in span.links
            if lk.attributes.get("kworkers.link") == kind]


def check_tree(spans: list[Any], topic: str, tiers: list[str], group: str, retry_group: str,
               dlq: str) -> list[Any]:
    """Every assertion about the tree; returns the four attempt spans in order."""
    (send,) = [s for s in spans if s.kind == otel.SpanKind.PRODUCER]
    attempts = sorted((s for s in spans if s.kind == otel.SpanKind.CONSUMER),
                      key=lambda s: s.start_time)
    assert len(attempts) == 4, [s.name for s in attempts]
    assert {s.context.trace_id for s in spans} == {send.context.trace_id}, "one trace"
    for s in attempts:  # the producer's span is every attempt's parent, never an attempt
        assert s.parent is not None and s.parent.span_id == send.context.span_id, s.name
        assert _link_of(s, "creation") == [_hex(send.context.span_id, 16)], s.name
    where = [s.attributes["messaging.destination.name"] for s in attempts]
    assert where == [topic, *tiers, topic], where
    assert [s.name for s in attempts] == [f"process {t}" for t in where]
    assert [s.attributes["kworkers.attempt"] for s in attempts] == [1, 2, 3, 1]
    assert [s.attributes["messaging.consumer.group.name"] for s in attempts] == [
        group, retry_group, retry_group, group]
    for s in attempts:
        assert s.attributes["messaging.system"] == "kafka"
        assert s.attributes["messaging.operation.name"] == "process"
        assert s.attributes["messaging.operation.type"] == "process"
        assert s.attributes["messaging.destination.partition.id"] == "0"
        assert isinstance(s.attributes["messaging.kafka.offset"], int)
    assert [s.status.is_ok for s in attempts] == [False, False, False, True]
    assert [s.attributes.get("error.type") for s in attempts] == [
        "ConnectionError", "ConnectionError", "ConnectionError", None]
    assert attempts[3].attributes["kworkers.redrive_of"] == f"{dlq}/0/0"
    previous = [_link_of(s, "previous_attempt") for s in attempts]
    want: list[list[str]] = [[]] + [[_hex(s.context.span_id, 16)] for s in attempts[:3]]
    assert previous == want, f"a previous attempt link is missing or wrong: {previous}"
    vias = [lk.attributes.get("kworkers.link.via") for s in attempts[1:] for lk in s.links
            if lk.attributes.get("kworkers.link") == "previous_attempt"]
    assert vias == [f"retry tier {where[1]}", f"retry tier {where[2]}",
                    f"dead letter {dlq}/0/0"], vias
    return attempts


def draw(spans: list[Any]) -> str:
    """The tree as text: parent-child by indentation, links under each span."""
    (send,) = [s for s in spans if s.kind == otel.SpanKind.PRODUCER]
    attempts = sorted((s for s in spans if s.kind == otel.SpanKind.CONSUMER),
                      key=lambda s: s.start_time)
    short = {s.context.span_id: _hex(s.context.span_id, 16)[:8] for s in spans}
    label = {send.context.span_id: "send"}
    for i, s in enumerate(attempts, 1):
        label[s.context.span_id] = f"#{i}"
    t0 = send.start_time
    lines = [f"trace {_hex(send.context.trace_id, 32)}",
             f"send  {send.name}  [PRODUCER, span {short[send.context.span_id]}; its context "
             f"is the record's traceparent]"]
    for i, s in enumerate(attempts, 1):
        last = i == len(attempts)
        bar, pad = ("└─", "   ") if last else ("├─", "│  ")
        outcome = "OK" if s.status.is_ok else f"ERROR {s.attributes.get('error.type')}"
        extra = (f"  kworkers.redrive_of={s.attributes['kworkers.redrive_of']}"
                 if "kworkers.redrive_of" in s.attributes else "")
        lines.append(
            f"{bar} #{i} {s.name}  [CONSUMER, span {short[s.context.span_id]}, "
            f"+{(s.start_time - t0) / 1e9:.2f} s]")
        lines.append(
            f"{pad}    kworkers.attempt={s.attributes['kworkers.attempt']}  "
            f"group={s.attributes.get('messaging.consumer.group.name')}  {outcome}{extra}")
        for lk in s.links:
            target = label.get(lk.context.span_id, short.get(lk.context.span_id, "?"))
            via = lk.attributes.get("kworkers.link.via")
            lines.append(f"{pad}    link {lk.attributes.get('kworkers.link')} -> {target}"
                         + (f"  (via {via})" if via else ""))
    return "\n".join(lines) + "\n"


def _without_link(dead: Message) -> Headers:
    return tuple((k, v) for k, v in redrive_headers(dead) if k != TRACE_PREVIOUS)


@pytest.mark.parametrize("canary", ["none", "hand-off", "redrive"])
def test_a_record_dead_lettered_and_redriven_is_one_followable_trace(
        kafka_broker: Broker, canary: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if canary == "hand-off":  # the failed attempt's span never reaches the tier/DLQ record
        monkeypatch.setattr(tracing, "mark_failed_attempt", lambda exc, span: None)
    elif canary == "redrive":  # a redrive that treats the link header as any other of ours
        monkeypatch.setattr(replayer, "redrive_headers", _without_link)
    provider, exporter = memory_tracing()
    bs = kafka_broker.bootstrap_servers
    topic, group = make_topic(bs, unique("trace"), 1), unique("g")
    invoke = tracing.TracedInvoke(tracing.otel_span_starter(provider),
                                  conventions=tracing.Conventions(old=False, new=True))
    # no jitter: attempt 2 waits in the 0.1 s tier, attempt 3 in the 0.2 s one
    w = Worker(topics=[topic], group_id=group, bootstrap_servers=bs, invoke=invoke,
               retry=RetryPolicy(initial=0.1, max_attempts=3), tiers=TierLadder((0.1, 0.2)),
               jitter=no_jitter)
    w.create_topics()
    healed = threading.Event()
    calls: list[int] = []

    @w.handler
    def handle(msg: Message) -> None:
        calls.append(msg.attempt)
        if not healed.is_set():
            raise ConnectionError("downstream is down")

    tracer = provider.get_tracer("the test's producer")
    with tracer.start_as_current_span(f"send {topic}", kind=otel.SpanKind.PRODUCER):
        carrier: dict[str, str] = {}
        propagate.TraceContextTextMapPropagator().inject(carrier)
    sent = carrier["traceparent"].encode()
    produce(bs, topic, [(b"k", b"v")], headers=[("traceparent", sent)])
    dlq = w.config.tiers.dlq_topic(topic)
    with running(w):
        wait_for(lambda: len(read_all(bs, dlq, 3)) == 1, 60, "the dead letter")
        healed.set()
        assert redrive(bs, dlq).redriven == 1
        wait_for(lambda: len(exporter.get_finished_spans()) == 5, 60, "the redriven span")
    (dead,) = read_all(bs, dlq, 3)
    assert dead[2]["traceparent"] == sent  # the user's header, unchanged
    assert calls == [1, 2, 3, 1]
    spans = list(exporter.get_finished_spans())
    tiers = [t.topic for t in w.config.tiers.tiers(topic)]
    args = (spans, topic, tiers, group, w.config.retry_group_id, dlq)
    if canary != "none":
        with pytest.raises(AssertionError, match="previous attempt link") as caught:
            check_tree(*args)
        print(f"canary {canary} caught: {str(caught.value).splitlines()[0]}")
        return
    check_tree(*args)
    out = os.environ.get("KWORKERS_DRAW_TRACE")
    if out:
        Path(out).write_text(draw(spans))
