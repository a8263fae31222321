"""A record value seen through a schema registry, for operators (``dlq show``, the console).

A dead letter's value is whatever its producer wrote; when it carries Confluent framing the
registry knows its schema, so the operator sees the schema id, its type and subject(s), and the
value decoded to JSON: Avro and JSON Schema with confluent-kafka's deserializers, Protobuf with
a message class made from the writer's own schema (no generated code needed). Anything that
goes wrong is said in ``problem`` and the caller falls back to text or hex: looking at a record
never fails because its bytes are odd or the registry is away.

Needs the ``registry`` extra.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kworkers.errors import ConfigError
from kworkers.payloads.failures import failure_of, schema_id_of
from kworkers.payloads.settings import RegistrySettings


@dataclass(frozen=True)
class ValueView:
    schema_id: int
    schema_type: str | None = None
    subjects: tuple[str, ...] = ()
    #: the value decoded, as indented JSON
    decoded: str | None = None
    #: why it was not decoded (secrets masked)
    problem: str | None = None


def registry_client(settings: RegistrySettings) -> SchemaRegistryClient:
    """A client that answers an operator fast: one retry, a short timeout. Settings the
    client refuses are a ``ConfigError`` (one line, secrets masked)."""
    try:
        return SchemaRegistryClient({"max.retries": 1, "retries.wait.ms": 100, "timeout": 10,
                                     **settings.client_config()})
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"schema registry {settings.shown_url}: "
                          f"{settings.redact(str(exc))}") from None


def _no_subject(_ctx: object, _record_name: object) -> None:
    """The writer's schema is all a view needs: no subject, so no latest-version lookups."""
    return None


_CONF = {"subject.name.strategy": _no_subject}
#: the deserializers want a context; with no subject it only names the field
_CTX = SerializationContext("", MessageField.VALUE)


def _protobuf(client: SchemaRegistryClient, schema_id: int, value: bytes) -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

    writer = client.get_schema(schema_id, fmt="serialized")
    fdp = descriptor_pb2.FileDescriptorProto.FromString(
        base64.b64decode(writer.schema_str or ""))
    pool = descriptor_pool.DescriptorPool()
    for ref in writer.references or []:  # imported files, registered under their subjects
        dep = client.get_version(ref.subject or "", ref.version or "latest",
                                 fmt="serialized").schema
        pool.Add(descriptor_pb2.FileDescriptorProto.FromString(
            base64.b64decode(dep.schema_str or "")))
    file = pool.Add(fdp)
    first = next(iter(file.message_types_by_name.values()))
    # the deserializer reads the message indexes and picks the writer's message; it needs a
    # message class to hand back, which only the first message's is when indexes say [0]
    message = ProtobufDeserializer(message_factory.GetMessageClass(first),
                                   {"use.deprecated.format": False, **_CONF},
                                   schema_registry_client=client)(value, _CTX)
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def describe(client: SchemaRegistryClient, value: bytes | None,
             settings: RegistrySettings | None = None) -> ValueView | None:
    """``value`` through the registry; None when it has no Confluent framing."""
    schema_id = schema_id_of(value)
    if value is None or schema_id is None:
        return None
    redact = settings.redact if settings is not None else (lambda s: s)
    try:
        schema = client.get_schema(schema_id)
    except Exception as exc:
        return ValueView(schema_id, problem=redact(_why(exc, value)))
    kind = schema.schema_type or "AVRO"
    try:
        subjects = tuple(client.get_subjects_by_schema_id(schema_id))
    except Exception:
        subjects = ()  # a registry without that endpoint still decodes
    try:
        if kind == "AVRO":
            decoded = AvroDeserializer(client, conf=_CONF)(value, _CTX)
        elif kind == "JSON":
            decoded = JSONDeserializer(None, schema_registry_client=client, conf=_CONF)(value,
                                                                                        _CTX)
        elif kind == "PROTOBUF":
            decoded = _protobuf(client, schema_id, value)
        else:
            return ValueView(schema_id, kind, subjects, problem=f"{kind} is not decoded here")
    except Exception as exc:
        return ValueView(schema_id, kind, subjects, problem=redact(_why(exc, value)))
    text = json.dumps(decoded, indent=2, default=_bytes_text, ensure_ascii=False)
    return ValueView(schema_id, kind, subjects, decoded=text)


def _why(exc: BaseException, value: bytes) -> str:
    f = failure_of(exc, value)
    return f"{f.error_type}: {f.reason}" + (" (the registry did not answer)"
                                            if f.kind == "transient" else "")


def _bytes_text(obj: object) -> str:
    if isinstance(obj, bytes):
        return "0x" + obj.hex()
    return str(obj)
