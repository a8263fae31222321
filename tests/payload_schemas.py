"""Schemas of one ``Order`` in Avro, JSON Schema and Protobuf, and a client for a test registry.

The Protobuf message class is built from a ``FileDescriptorProto`` at import (no ``protoc``, no
generated module checked in); confluent-kafka's Protobuf serializer registers the schema it
describes."""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.common._httpx_compat import httpx
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

#: the client's httpx (what the registry tests fake); a name of this module's own, for mypy
http = httpx

ORDER_AVRO = json.dumps({
    "type": "record", "name": "Order", "namespace": "kw.test",
    "fields": [{"name": "id", "type": "string"}, {"name": "qty", "type": "int"}],
})
#: ORDER_AVRO plus a field with a default: a BACKWARD-compatible next version.
ORDER_AVRO_V2 = json.dumps({
    "type": "record", "name": "Order", "namespace": "kw.test",
    "fields": [{"name": "id", "type": "string"}, {"name": "qty", "type": "int"},
               {"name": "note", "type": "string", "default": "none"}],
})
ORDER_JSON_SCHEMA = json.dumps({
    "$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
    "properties": {"id": {"type": "string"}, "qty": {"type": "integer"}},
    "required": ["id", "qty"],
})


def _order_proto() -> Any:
    fdp = descriptor_pb2.FileDescriptorProto(name="kw_test_order.proto", package="kw.test",
                                             syntax="proto3")
    msg = fdp.message_type.add(name="Order")
    f = descriptor_pb2.FieldDescriptorProto
    msg.field.add(name="id", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    msg.field.add(name="qty", number=2, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("kw.test.Order"))


OrderProto: Any = _order_proto()


def client(url: str, **conf: Any) -> SchemaRegistryClient:
    """A client that gives up fast: a test's registry outage must not cost seconds per call."""
    return SchemaRegistryClient({"url": url, "max.retries": 1, "retries.wait.ms": 50,
                                 "retries.max.wait.ms": 200, "timeout": 3, **conf})
