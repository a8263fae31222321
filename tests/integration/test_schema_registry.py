"""The schema registry the payload tests run against speaks the Confluent protocol.

These pin the facts kworkers' decoding relies on, against the real server (Apicurio Registry's
ccompat API, or whatever ``KWORKERS_SCHEMA_REGISTRY_URL`` names): confluent-kafka's serializers
register and resolve Avro, JSON Schema and Protobuf; an unknown id is HTTP 404 with error code
40403 (permanent); a stopped registry is a transport error and a frozen one a timeout
(transient), and a stop keeps every id.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.schema_registry import SchemaRegistryError
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kworkers.testing.registry import SchemaRegistryServer
from tests.payload_schemas import ORDER_AVRO, ORDER_JSON_SCHEMA, OrderProto, client, http

pytestmark = pytest.mark.integration

PROTO_CONF = {"use.deprecated.format": False}


def _ctx() -> SerializationContext:
    return SerializationContext(f"orders-{uuid.uuid4().hex[:8]}", MessageField.VALUE)


def test_avro_json_and_protobuf_round_trip(schema_registry: SchemaRegistryServer) -> None:
    c = client(schema_registry.url)
    ctx = _ctx()
    avro = AvroSerializer(c, ORDER_AVRO)({"id": "a-1", "qty": 2}, ctx)
    assert avro[:1] == b"\x00"
    assert AvroDeserializer(c)(avro, ctx) == {"id": "a-1", "qty": 2}

    ctx = _ctx()
    js = JSONSerializer(ORDER_JSON_SCHEMA, c)({"id": "j-1", "qty": 3}, ctx)
    assert JSONDeserializer(None, schema_registry_client=c)(js, ctx) == {"id": "j-1", "qty": 3}

    ctx = _ctx()
    pb = ProtobufSerializer(OrderProto, c, PROTO_CONF)(OrderProto(id="p-1", qty=4), ctx)
    back = ProtobufDeserializer(OrderProto, PROTO_CONF, schema_registry_client=c)(pb, ctx)
    assert (back.id, back.qty) == ("p-1", 4)

    ids = {int.from_bytes(b[1:5], "big") for b in (avro, js, pb)}
    assert len(ids) == 3, ids  # three schemas, three ids
    kinds = {c.get_schema(i).schema_type for i in ids}
    assert kinds == {"AVRO", "JSON", "PROTOBUF"}


def test_an_unknown_schema_id_is_404_40403(schema_registry: SchemaRegistryServer) -> None:
    c = client(schema_registry.url)
    with pytest.raises(SchemaRegistryError) as err:
        c.get_schema(2**31 - 7)
    assert (err.value.http_status_code, err.value.error_code) == (404, 40403)


def test_a_stopped_registry_is_a_transport_error_and_keeps_its_ids(
        fault_registry: SchemaRegistryServer) -> None:
    ctx = _ctx()
    data = AvroSerializer(client(fault_registry.url), ORDER_AVRO)({"id": "s", "qty": 1}, ctx)
    sid = int.from_bytes(data[1:5], "big")

    fault_registry.stop()
    with pytest.raises(http.TransportError):
        client(fault_registry.url).get_schema(sid)
    fault_registry.start()
    # a fresh client (no cache) resolves the id the registry gave out before the stop
    assert AvroDeserializer(client(fault_registry.url))(data, ctx) == {"id": "s", "qty": 1}

    fault_registry.pause()
    try:
        with pytest.raises(http.TimeoutException):
            client(fault_registry.url, timeout=1).get_schema(sid)
    finally:
        fault_registry.resume()
    assert client(fault_registry.url).get_schema(sid).schema_type == "AVRO"
