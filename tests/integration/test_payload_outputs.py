"""Records kworkers produces for the user, typed: the outbox's serializer seam, end to end.

``Outbox(store, value_serializer=AvroSerializer(client, schema), key_serializer=...)``: the
handler enqueues a dict in its effect's transaction, the relay produces it to the real broker,
and the bytes read back are Confluent-framed Avro that a consumer decodes through the real
registry, under the subject of the record's own topic. A value the schema refuses fails the
effect's transaction: no effect, no row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext, StringSerializer

from kworkers.errors import ConfigError
from kworkers.idempotency import Outbox, SqliteStore
from kworkers.idempotency.outbox import blocking_send
from kworkers.kafka.producer import KafkaSender
from kworkers.kafka.settings import producer_settings
from kworkers.testing import Broker
from kworkers.testing.registry import SchemaRegistryServer
from kworkers.testing.workload import make_topic, read_all, unique
from tests.payload_schemas import ORDER_AVRO, client

pytestmark = pytest.mark.integration


def test_the_outbox_produces_typed_records(kafka_broker: Broker,
                                           schema_registry: SchemaRegistryServer,
                                           tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap_servers
    topic = make_topic(bs, unique("typed-out"), 1)
    c = client(schema_registry.url)
    store = SqliteStore(str(tmp_path / "store.db"))
    outbox = Outbox(store, key_serializer=StringSerializer(),
                    value_serializer=AvroSerializer(c, ORDER_AVRO))
    with store.atomic() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY)")

    def effect(order: dict[str, Any]) -> Any:
        def apply(conn: Any) -> None:
            conn.execute("INSERT INTO orders VALUES (?)", (order["id"],))
            outbox.enqueue(conn, topic, order["id"], order)
        return apply

    assert store.apply_once("o-1", effect({"id": "o-1", "qty": 2}))
    assert store.apply_once("o-2", effect({"id": "o-2", "qty": 5}))
    with pytest.raises(Exception, match="qty"):  # the schema refuses it: nothing commits
        store.apply_once("o-3", effect({"id": "o-3", "qty": "many"}))
    assert len(outbox.pending()) == 2
    with store.atomic() as conn:
        assert [r[0] for r in conn.execute("SELECT id FROM orders ORDER BY id")] == ["o-1", "o-2"]

    sender = KafkaSender(producer_settings(bs, {}))
    try:
        assert outbox.relay_once(blocking_send(sender)) == 2
    finally:
        sender.close()
    records = read_all(bs, topic, 5)
    ctx = SerializationContext(topic, MessageField.VALUE)
    decode = AvroDeserializer(client(schema_registry.url))  # a consumer elsewhere: no cache
    assert [(k, decode(v, ctx)) for k, v, _h in records] == [
        (b"o-1", {"id": "o-1", "qty": 2}), (b"o-2", {"id": "o-2", "qty": 5})]
    registered = c.get_latest_version(f"{topic}-value")  # the record's topic named the subject
    assert {int.from_bytes(cast(bytes, v)[1:5], "big")
            for _k, v, _h in records} == {registered.schema_id}


def test_without_a_serializer_the_outbox_takes_bytes_only(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "store.db"))
    outbox = Outbox(store)
    with pytest.raises(ConfigError, match="value_serializer"), store.atomic() as conn:
        outbox.enqueue(conn, "t", b"k", {"id": 1})
    with pytest.raises(ConfigError, match="callable"):
        Outbox(store, value_serializer="avro")  # type: ignore[arg-type]
