"""Typed payloads on a Worker, on the real broker and the real schema registry.

- Avro, JSON Schema and Protobuf records are decoded for the handler by confluent-kafka's own
  deserializers; a record retried through a tier is decoded again under its *source* topic
  (the deserializer here knows only source topics), and the tier holds the bytes as read.
- A record with an unknown schema id, one with a wrong magic byte and one with a truncated body
  are each dead-lettered once, with the reason, after one attempt; the handler never sees
  them; the DLQ holds their original bytes (read back), and a redrive replays them to the
  source byte for byte.
- The registry stopped while records arrive: nothing is dead-lettered, the partition resumes
  when the registry returns, every record is handled once (the handler's own ledger, the DLQ
  and the committed offsets read back). Its canary treats "registry down" as a decode failure
  and is caught: records land in the DLQ.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

import pytest
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError
from google.protobuf import json_format

from kworkers import Message, RetryableError, RetryPolicy, TierLadder, Worker
from kworkers.dlq.reader import read_dlq
from kworkers.payloads.decode import DecodeBackoff
from kworkers.testing import Broker
from kworkers.testing.registry import SchemaRegistryServer
from kworkers.testing.workload import committed_total, make_topic, produce, read_all, unique
from tests.integration.conftest import running, wait_for
from tests.integration.test_cli_support import cli
from tests.payload_schemas import (
    ORDER_AVRO,
    ORDER_AVRO_V2,
    ORDER_JSON_SCHEMA,
    OrderProto,
    client,
)

pytestmark = pytest.mark.integration

PROTO = {"use.deprecated.format": False}


class Ledger:
    """What the handler saw, appended under a lock (the test's own record, not kworkers')."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[Message] = []

    def add(self, msg: Message) -> None:
        with self.lock:
            self.seen.append(msg)

    def keys(self) -> Counter[bytes]:
        with self.lock:
            return Counter(m.key_bytes or b"" for m in self.seen)


def _ctx(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


def test_avro_json_and_protobuf_records_are_decoded_for_the_handler(
        kafka_broker: Broker, schema_registry: SchemaRegistryServer) -> None:
    bs = kafka_broker.bootstrap_servers
    name = unique("typed")
    t_avro, t_json, t_proto = (make_topic(bs, f"{name}-{k}", 1) for k in ("avro", "json", "pb"))
    c = client(schema_registry.url)
    produced = {
        t_avro: [AvroSerializer(c, ORDER_AVRO)({"id": f"a{i}", "qty": i}, _ctx(t_avro))
                 for i in range(3)],
        t_json: [JSONSerializer(ORDER_JSON_SCHEMA, c)({"id": f"j{i}", "qty": i}, _ctx(t_json))
                 for i in range(3)],
        t_proto: [ProtobufSerializer(OrderProto, c, PROTO)(OrderProto(id=f"p{i}", qty=i),
                                                           _ctx(t_proto)) for i in range(3)],
    }
    reader = client(schema_registry.url)  # the worker's own client: nothing cached
    by_topic: dict[str, Callable[[Any, Any], Any]] = {
        t_avro: AvroDeserializer(reader),
        t_json: JSONDeserializer(None, schema_registry_client=reader),
        # the generated class is the reader's schema; no registry client: Apicurio 3.3.3 answers
        # the writer-schema lookup this deserializer makes (format=serialized) with a 500 for
        # schemas registered as descriptors and never for .proto text (checked by hand)
        t_proto: ProtobufDeserializer(OrderProto, PROTO),
    }
    contexts: list[str] = []

    def value(data: bytes | None, ctx: Any) -> Any:
        contexts.append(ctx.topic)
        return by_topic[ctx.topic](data, ctx)  # a tier's name would be a KeyError: the DLQ

    w = Worker(topics=[t_avro, t_json, t_proto], group_id=unique("g"), bootstrap_servers=bs,
               value_deserializer=value, retry=RetryPolicy(initial=0.2, max_attempts=3),
               tiers=TierLadder((0.25,)))
    w.create_topics()
    for topic, values in produced.items():
        produce(bs, topic, ((f"{topic}-{i}".encode(), v) for i, v in enumerate(values)))
    ledger = Ledger()
    retry_me = f"{t_avro}-1".encode()

    @w.handler
    def handle(msg: Message) -> None:
        ledger.add(msg)
        if msg.key == retry_me and msg.attempt == 1:
            raise RetryableError("Later", "once through the tier")

    with running(w):
        wait_for(lambda: sum(ledger.keys().values()) == 10, 90, "9 records and one retry")
    seen = {(m.key, m.attempt): m for m in ledger.seen}
    for topic, values in produced.items():
        for i, raw in enumerate(values):
            m = seen[(f"{topic}-{i}".encode(), 1)]
            assert m.decoded and m.raw_value == raw and m.topic == topic
            if topic == t_proto:
                got = json_format.MessageToDict(m.value)
                got["qty"] = got.get("qty", 0)  # proto3 leaves a zero out
            else:
                got = m.value
            prefix = {t_avro: "a", t_json: "j", t_proto: "p"}[topic]
            assert got == {"id": f"{prefix}{i}", "qty": i}, (topic, got)
    again = seen[(retry_me, 2)]
    assert again.topic.startswith(f"{t_avro}.retry.") and cast(object, again.value) == {
        "id": "a1", "qty": 1}  # decoded: not bytes
    assert set(contexts) == {t_avro, t_json, t_proto}  # never a tier's name
    # the tier holds the record as read, and nothing was dead-lettered
    tier = [v for k, v, _h in read_all(bs, again.topic, 5) if k == retry_me]
    assert tier == [produced[t_avro][1]]
    for topic in produced:
        assert read_dlq(bs, f"{topic}.dlq").dead_letters == []


def _bad_records(good: bytes) -> dict[str, bytes]:
    unknown = 2**31 - 3
    return {
        "unknown-id": b"\x00" + unknown.to_bytes(4, "big") + good[5:],
        "wrong-magic": b"\x01" + good[1:],
        "truncated": good[:-1],
    }


def test_undecodable_records_are_dead_lettered_once_and_redriven_byte_for_byte(
        kafka_broker: Broker, schema_registry: SchemaRegistryServer) -> None:
    bs = kafka_broker.bootstrap_servers
    topic = make_topic(bs, unique("undecodable"), 1)
    c = client(schema_registry.url)
    good = [AvroSerializer(c, ORDER_AVRO)({"id": f"g{i}", "qty": 7}, _ctx(topic))
            for i in range(2)]
    bad = _bad_records(good[0])
    w = Worker(topics=[topic], group_id=unique("g"), bootstrap_servers=bs,
               value_deserializer=AvroDeserializer(client(schema_registry.url)),
               retry=RetryPolicy(initial=0.2, max_attempts=3), tiers=TierLadder((0.25,)))
    w.create_topics()
    records = [(b"good-0", good[0]), *((k.encode(), v) for k, v in bad.items()),
               (b"good-1", good[1])]
    produce(bs, topic, records)
    ledger = Ledger()

    @w.handler
    def handle(msg: Message) -> None:
        ledger.add(msg)

    dlq = w.config.tiers.dlq_topic(topic)
    with running(w):
        wait_for(lambda: len(read_dlq(bs, dlq).dead_letters) >= 3
                 and ledger.keys() == Counter({b"good-0": 1, b"good-1": 1}), 90,
                 "3 dead letters, 2 handled")
    assert ledger.keys() == Counter({b"good-0": 1, b"good-1": 1})  # never the bad ones
    dead = read_dlq(bs, dlq).dead_letters
    assert sorted((d.key or b"").decode() for d in dead) == sorted(bad)  # each once
    by_key = {(d.key or b"").decode(): d for d in dead}
    for key, raw in bad.items():
        d = by_key[key]
        assert d.attempts == 1 and d.error_type == "DeserializationError", d
        assert d.value == raw  # the bytes as produced, read back from the DLQ
    assert f"(schema id {2**31 - 3})" in by_key["unknown-id"].error_message
    assert "40403" in by_key["unknown-id"].error_message
    assert "the value cannot be decoded" in by_key["wrong-magic"].error_message
    sid = int.from_bytes(good[0][1:5], "big")
    assert f"(schema id {sid})" in by_key["truncated"].error_message
    assert "EOFError" in by_key["truncated"].error_message
    # issue #46: the schema id in a header of its own, and the source's topic id, although no
    # attempt ran (the hand-off reads nothing; the decoder read the origin before it)
    ids = {k: dict(d.headers).get("kw-schema-id") for k, d in by_key.items()}
    assert ids == {"unknown-id": b"%d" % (2**31 - 3), "truncated": b"%d" % sid,
                   "wrong-magic": None}, ids
    assert all(dict(d.headers).get("kw-original-topic-id") for d in dead), [
        d.headers for d in dead]

    # a redrive (the worker stopped) replays them to the source, byte for byte
    run = cli("dlq", "redrive", "-b", bs, "--dlq", dlq)
    assert run.returncode == 0, run.stderr
    replays = {(k or b"").decode(): v for k, v, h in read_all(bs, topic, 5)
               if "kw-redrive-of" in h}
    assert replays == bad


class _Canary:
    """The broken variant: every deserializer failure is a decode failure (the chain that says
    "the registry did not answer" is dropped), so an outage dead-letters records."""

    def __init__(self, inner: Callable[[Any, Any], Any]) -> None:
        self.inner = inner

    def __call__(self, data: bytes | None, ctx: Any) -> Any:
        try:
            return self.inner(data, ctx)
        except Exception as exc:
            raise SerializationError(f"cannot decode: {exc}") from None


@pytest.mark.parametrize("canary", [False, True], ids=["worker", "canary"])
def test_a_registry_outage_dead_letters_nothing_and_the_partition_resumes(
        kafka_broker: Broker, fault_registry: SchemaRegistryServer, canary: bool) -> None:
    bs = kafka_broker.bootstrap_servers
    topic = make_topic(bs, unique("outage"), 2)
    c = client(fault_registry.url)
    before = [AvroSerializer(c, ORDER_AVRO)({"id": f"b{i}", "qty": i}, _ctx(topic))
              for i in range(6)]
    # records of a schema the worker has never seen, serialized while the registry is up
    v2 = AvroSerializer(c, ORDER_AVRO_V2, conf={
        "subject.name.strategy": lambda _c, _n: f"{topic}-v2"})
    during = [v2({"id": f"d{i}", "qty": i, "note": "x"}, _ctx(topic)) for i in range(20)]
    assert {v[1:5] for v in during} != {before[0][1:5]}
    real = AvroDeserializer(client(fault_registry.url, timeout=1))
    w = Worker(topics=[topic], group_id=unique("g"), bootstrap_servers=bs,
               value_deserializer=_Canary(real) if canary else real,
               decode_backoff=DecodeBackoff(0.1, 0.5), message_timeout=0.5,
               retry=RetryPolicy(initial=0.2, max_attempts=2), tiers=TierLadder((0.25,)))
    w.create_topics()
    ledger = Ledger()

    @w.handler
    def handle(msg: Message) -> None:
        ledger.add(msg)

    dlq = w.config.tiers.dlq_topic(topic)
    keys = [f"k{i}".encode() for i in range(len(before) + len(during))]
    with running(w):
        produce(bs, topic, zip(keys[:len(before)], before, strict=True))
        wait_for(lambda: sum(ledger.keys().values()) == len(before), 60, "the first records")
        fault_registry.stop()
        produce(bs, topic, zip(keys[len(before):], during, strict=True))
        decoder = w._decoder
        assert decoder is not None
        # the outage has met the records: both partitions wait (or, for the canary, the DLQ
        # fills); a sync point only, the verdict below is read back
        wait_for(lambda: len(decoder.waiting()) == 2 or len(read_dlq(bs, dlq).dead_letters) > 0,
                 60, "records meeting the outage")
        handled_in_outage = sum(ledger.keys().values()) - len(before)
        fault_registry.start()
        wait_for(lambda: len(set(ledger.keys()) | {d.key for d in read_dlq(bs, dlq).dead_letters})
                 == len(keys), 90, "every record handled or dead-lettered")
    dead = read_dlq(bs, dlq).dead_letters
    if canary:
        assert len(dead) > 0, "the canary dead-lettered nothing: the outage was never met"
        return
    assert dead == []  # nothing dead-lettered because the registry was down
    assert handled_in_outage == 0  # the outage's records waited for the registry
    assert ledger.keys() == Counter({k: 1 for k in keys})  # each applied once
    assert all(m.attempt == 1 for m in ledger.seen)  # the wait was not an attempt
    assert committed_total(bs, w.config.group_id, topic, 2) == len(keys)


def test_an_async_handler_gets_the_clients_async_deserializer(
        kafka_broker: Broker, schema_registry: SchemaRegistryServer) -> None:
    import asyncio

    from confluent_kafka.schema_registry import AsyncSchemaRegistryClient
    from confluent_kafka.schema_registry._async.avro import AsyncAvroDeserializer

    bs = kafka_broker.bootstrap_servers
    topic = make_topic(bs, unique("typed-async"), 1)
    c = client(schema_registry.url)
    values = [AvroSerializer(c, ORDER_AVRO)({"id": f"x{i}", "qty": i}, _ctx(topic))
              for i in range(3)]

    async def build() -> Any:  # made on the caller's loop, awaited on the worker's
        return await AsyncAvroDeserializer(
            AsyncSchemaRegistryClient({"url": schema_registry.url}))

    w = Worker(topics=[topic], group_id=unique("g"), bootstrap_servers=bs,
               value_deserializer=asyncio.run(build()))
    w.create_topics()
    produce(bs, topic, ((f"k{i}".encode(), v) for i, v in enumerate(values)))
    ledger = Ledger()

    @w.handler
    async def handle(msg: Message) -> None:
        ledger.add(msg)

    with running(w):
        wait_for(lambda: sum(ledger.keys().values()) == 3, 60, "3 records")
    assert sorted((cast("dict[str, Any]", m.value)["id"], m.raw_value) for m in ledger.seen) == [
        (f"x{i}", values[i]) for i in range(3)]
