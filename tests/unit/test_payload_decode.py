"""The worker's deserializers through the front door (``Worker(consumer=..., sender=...)``):
what the handler sees, what a hand-off writes, what a permanent and a transient failure do.
The real registry's part is in tests/integration/test_typed_payloads.py."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import Future
from typing import Any, cast

import pytest
from confluent_kafka.schema_registry import SchemaRegistryError

from kworkers import BatchError, ConfigError, Message, RetryableError, Worker
from kworkers.consumer.ports import Delivered
from kworkers.consumer.stall import Hold
from kworkers.envelope import SingleObjectCodec
from kworkers.kafka.serialization import context
from kworkers.message import Headers
from kworkers.payloads.decode import DecodeBackoff, PayloadError, RecordDecoder
from tests.unit.test_batch_handlers import _final, _run
from tests.unit.test_loop_with_fake_consumer import ScriptedConsumer

FRAMED = b"\x00\x00\x00\x00\x07"  # Confluent framing, schema id 7


class Sender:
    """Records every hand-off with its headers."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None, dict[str, bytes]]] = []

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             headers: Headers, done: Delivered) -> None:
        self.sent.append((topic, key, value, dict(headers)))
        f: Future[None] = Future()
        f.add_done_callback(lambda x: done(x.exception()))
        f.set_result(None)


def _msgs(values: list[bytes]) -> list[Message]:
    return [Message("t", 0, i, b"k%d" % i, v) for i, v in enumerate(values)]


def _worker(consumer: ScriptedConsumer, sender: Sender, **kw: Any) -> Worker:
    idle = ScriptedConsumer([], [], "g.retry")
    idle.go.set()
    return Worker(topics=["t"], group_id="g", concurrency=2, sender=sender,
                  consumer=lambda g: consumer if g == "g" else idle, **kw)


def json_value(data: bytes | None, ctx: Any) -> Any:
    """A deserializer of the shape kworkers takes: JSON after a Confluent header."""
    assert data is not None and ctx.topic == "t" and ctx.field == "value"
    if data[:1] != b"\x00":
        raise ValueError(f"wrong magic byte {data[:1].hex()}")
    if data[1:5] == b"\x00\x00\x00\x63":
        raise SchemaRegistryError(404, 40403, "Schema 99 not found.")
    return json.loads(data[5:])


def test_the_handler_sees_decoded_values_and_hand_offs_write_the_bytes() -> None:
    values = [FRAMED + json.dumps({"n": i}).encode() for i in range(4)]
    consumer, sender = ScriptedConsumer(_msgs(values), []), Sender()
    w = _worker(consumer, sender, value_deserializer=json_value,
                key_deserializer=lambda data, ctx: (ctx.field, data.decode()))
    seen: list[Message] = []

    @w.handler
    def handle(msg: Message) -> None:
        seen.append(msg)
        if cast("dict[str, int]", msg.value)["n"] == 2:  # decoded: not bytes
            raise RetryableError("Later", "to a tier")

    _run(w, consumer, lambda: _final(consumer).get(("t", 0)) == 4)
    # decoded: what the deserializers made of the bytes
    assert [cast(object, m.value) for m in seen] == [{"n": i} for i in range(4)]
    assert [cast(object, m.key) for m in seen] == [("key", f"k{i}") for i in range(4)]
    assert [m.raw_value for m in seen] == values and all(m.decoded for m in seen)
    assert [m.value_bytes for m in seen] == values
    assert [m.key_bytes for m in seen] == [b"k%d" % i for i in range(4)]
    # the tier gets the record as read, not a re-encoding
    assert [(k, v) for _t, k, v, _h in sender.sent] == [(b"k2", values[2])]
    assert sender.sent[0][0].startswith("t.retry.")


@pytest.mark.parametrize(("value", "reason"), [
    (FRAMED[:1] + b"\x00\x00\x00\x63" + b"{}", "(schema id 99) cannot be decoded: "
                                                "SchemaRegistryError: Schema 99 not found."),
    (b"\x01\x00\x00\x00\x07{}", "cannot be decoded: ValueError: wrong magic byte 01"),
    (FRAMED + b'{"n": ', "(schema id 7) cannot be decoded: JSONDecodeError"),
])
def test_a_record_that_cannot_be_decoded_is_dead_lettered_without_a_handler_call(
        value: bytes, reason: str) -> None:
    good = FRAMED + b'{"n": 1}'
    consumer, sender = ScriptedConsumer(_msgs([good, value, good]), []), Sender()
    w = _worker(consumer, sender, value_deserializer=json_value)
    seen: list[int] = []

    @w.handler
    def handle(msg: Message) -> None:
        seen.append(msg.offset)

    _run(w, consumer, lambda: _final(consumer).get(("t", 0)) == 3)
    assert seen == [0, 2]  # never called for the bad one
    assert len(sender.sent) == 1
    topic, key, raw, headers = sender.sent[0]
    assert (topic, key, raw) == ("t.dlq", b"k1", value)  # one attempt, the bytes as read
    assert headers["kw-error-type"] == b"DeserializationError"
    assert reason in headers["kw-error-message"].decode(), headers["kw-error-message"]
    assert headers["kw-attempt"] == b"1"
    framed = value[:1] == b"\x00" and len(value) >= 5
    assert headers.get("kw-schema-id") == (  # issue #46: a header of its own
        b"%d" % int.from_bytes(value[1:5], "big") if framed else None)


def test_a_registry_that_does_not_answer_holds_the_partition_not_an_attempt() -> None:
    up = threading.Event()
    calls = {"down": 0}

    def flaky(data: bytes | None, ctx: Any) -> Any:
        if not up.is_set():
            calls["down"] += 1
            raise ConnectionRefusedError(111, "Connection refused")
        return json_value(data, ctx)

    values = [FRAMED + b'{"n": %d}' % i for i in range(5)]
    consumer, sender = ScriptedConsumer(_msgs(values), []), Sender()
    w = _worker(consumer, sender, value_deserializer=flaky, message_timeout=0.05,
                decode_backoff=DecodeBackoff(0.01, 0.05))
    seen: list[int] = []

    @w.handler
    def handle(msg: Message) -> None:
        seen.append(msg.offset)

    def waiting() -> bool:
        if up.is_set():
            return True
        if calls["down"] < 10:  # several tries, each past the message deadline
            return False
        assert w._decoder is not None
        if w._decoder.waiting() != {("t", 0)}:
            return False
        loop = w._loops[0]
        views = {v.tp: v.hold for v in getattr(loop, "stall_views", ())}
        if views.get(("t", 0)) is not Hold.REGISTRY:
            return False
        up.set()
        return True

    _run(w, consumer, lambda: waiting() and _final(consumer).get(("t", 0)) == 5)
    assert calls["down"] >= 10
    assert seen == [0, 1, 2, 3, 4]  # each once, in order, after the registry came back
    assert sender.sent == []  # nothing dead-lettered, nothing sent to a tier
    assert w._decoder is not None and w._decoder.waiting() == set()
    text = w.metrics.registry.get_sample_value(
        "kworkers_payload_decode_failures_total",
        {"group": "g", "field": "value", "kind": "transient"})
    assert text is not None and text >= 10


def test_batch_handlers_see_decoded_records_and_a_batch_error_hands_off_originals() -> None:
    values = [FRAMED + b'{"n": %d}' % i for i in range(4)] + [b"\x05junk"]
    consumer, sender = ScriptedConsumer(_msgs(values), []), Sender()
    w = _worker(consumer, sender, value_deserializer=json_value, consume_batch=5)
    batches: list[list[Any]] = []

    @w.batch_handler(max_size=10)
    def handle(msgs: list[Message]) -> None:
        batches.append([m.value for m in msgs])
        raise BatchError({m: ValueError("no") for m in msgs
                          if cast("dict[str, int]", m.value)["n"] == 3})

    _run(w, consumer, lambda: _final(consumer).get(("t", 0)) == 5)
    assert [v for b in batches for v in b] == [{"n": i} for i in range(4)]
    sent = {v: t for t, _k, v, _h in sender.sent}
    assert set(sent) == {values[3], values[4]}  # the originals, each once
    assert sent[values[4]] == "t.dlq" and sent[values[3]].startswith("t.retry.")


def test_async_handlers_get_async_deserializers() -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    class AsyncDeserializer:  # the shape of confluent-kafka's AsyncAvroDeserializer
        def __call__(self, data: bytes | None, ctx: Any) -> Any:
            return self._decode(data, ctx)

        async def _decode(self, data: bytes | None, ctx: Any) -> Any:
            loops.append(asyncio.get_running_loop())
            await asyncio.sleep(0)
            return json_value(data, ctx)

    values = [FRAMED + b'{"n": %d}' % i for i in range(3)]
    consumer, sender = ScriptedConsumer(_msgs(values), []), Sender()
    w = _worker(consumer, sender, value_deserializer=AsyncDeserializer())
    seen: list[Any] = []

    @w.handler
    async def handle(msg: Message) -> None:
        seen.append(msg.value)

    _run(w, consumer, lambda: _final(consumer).get(("t", 0)) == 3)
    assert seen == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert loops and all(lp is loops[0] for lp in loops)  # awaited on kworkers' loop


def test_a_tier_record_is_decoded_under_its_source_topic() -> None:
    topics: list[str] = []

    def record(data: bytes | None, ctx: Any) -> Any:
        topics.append(ctx.topic)
        return data

    d = RecordDecoder(record, context=context)
    for topic in ("orders", "orders.retry.5s", "orders.retry.1m"):
        got = d.decode(Message(topic, 0, 0, None, b"x"), lambda: False)
        assert isinstance(got, Message) and got.value == b"x" and got.decoded
    assert topics == ["orders"] * 3


def test_a_wait_ends_when_the_partition_halts() -> None:
    halted = threading.Event()

    def down(data: bytes | None, ctx: Any) -> Any:
        halted.set()  # the revoke arrives while the registry is away
        raise TimeoutError("read timed out")

    d = RecordDecoder(down, context=context, backoff=DecodeBackoff(0.01, 0.01))
    assert d.decode(Message("t", 0, 0, None, b"x"), halted.is_set) is None
    assert d.waiting() == set()
    condemned = RecordDecoder(lambda _d, _c: (_ for _ in ()).throw(EOFError()),
                              context=context)
    got = condemned.decode(Message("t", 0, 0, None, FRAMED), lambda: False)
    assert isinstance(got, PayloadError) and got.failure.schema_id == 7


def test_wiring_errors_are_config_errors() -> None:
    consumer = ScriptedConsumer([], [])
    with pytest.raises(ConfigError, match="inline"):
        _worker(consumer, Sender(), value_deserializer=json_value, execution="inline")
    with pytest.raises(ConfigError, match="codec and value_deserializer"):
        _worker(consumer, Sender(), value_deserializer=json_value, codec=SingleObjectCodec())
    with pytest.raises(ConfigError, match="callable"):
        _worker(consumer, Sender(), value_deserializer="avro")
    with pytest.raises(ConfigError, match="backoff"):
        DecodeBackoff(0, 1)


def test_decode_series_carry_the_group_that_runs_not_the_code_s() -> None:
    """``kworkers run --group G`` applies G with ``with_config``: the registry-wait gauge and
    the decode failure counters are G's from the first scrape, and the code's group leaves no
    series behind (found by tests/integration/test_prometheus_scrape.py, whose worker's code
    says ``placeholder``)."""
    import dataclasses

    w = Worker(topics=["t"], group_id="placeholder", value_deserializer=json_value)

    @w.handler
    def handle(msg: Message) -> None:
        pass

    run = w.with_config(dataclasses.replace(w.config, group_id="orders"))
    reg = run.metrics.registry
    groups = {s.labels["group"] for m in reg.collect() for s in m.samples
              if s.name.startswith(("kworkers_payload_waiting_partitions",
                                    "kworkers_payload_decode_failures_total"))}
    assert groups == {"orders"}
    assert reg.get_sample_value("kworkers_payload_decode_failures_total",
                                {"group": "orders", "field": "value", "kind": "transient"}) == 0
    assert run._decoder is not None and run._decoder is not w._decoder
