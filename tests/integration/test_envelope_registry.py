"""The task envelope in Confluent's framing, through the real schema registry.

``ConfluentCodec`` is confluent-kafka's Avro serializer and deserializer over a
``SchemaRegistryClient``; these run it against the registry the suite starts (Apicurio's
Confluent-compatible API): the wire layout and registration, schema evolution (a reader with a
newer compatible schema decodes records an older writer produced), and the rule that bad bytes
and an unknown id are a ``DecodeError`` while an unreachable registry is not.
"""

from __future__ import annotations

import io
import json
import uuid
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from fastavro import parse_schema, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kworkers.envelope import SCHEMA, ActivityTask, ConfluentCodec, SingleObjectCodec
from kworkers.errors import DecodeError, is_non_retryable
from kworkers.payloads.failures import kind_of
from kworkers.testing.broker import free_port
from kworkers.testing.registry import SchemaRegistryServer
from tests.payload_schemas import ORDER_AVRO, client
from tests.unit.test_envelope import TASK, tasks

pytestmark = pytest.mark.integration

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def _subject() -> str:
    return f"kw-test.ActivityTask-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def codec(schema_registry: SchemaRegistryServer) -> ConfluentCodec:
    return ConfluentCodec(client(schema_registry.url), _subject())


@FUZZ
@given(task=tasks)
def test_round_trip(codec: ConfluentCodec, task: ActivityTask) -> None:
    back = codec.decode(codec.encode(task))
    assert back == task
    assert back.idempotency_key == f"{task.workflow_id}/{task.activity_id}"


def test_wire_layout_and_registration(schema_registry: SchemaRegistryServer) -> None:
    subject = _subject()
    c = client(schema_registry.url)
    data = ConfluentCodec(c, subject).encode(TASK)
    assert data[:1] == b"\x00"
    registered = c.get_latest_version(subject)
    assert int.from_bytes(data[1:5], "big") == registered.schema_id
    assert data[5:] == SingleObjectCodec().encode(TASK)[10:]  # the same Avro body
    # a reader in another process (a fresh client, no cache) looks the id up
    assert ConfluentCodec(client(schema_registry.url), subject).decode(data) == TASK


def test_an_unknown_schema_id_is_a_decode_error(codec: ConfluentCodec) -> None:
    data = codec.encode(TASK)
    sid = 2**31 - 11
    with pytest.raises(DecodeError, match=f"unknown schema id {sid}") as info:
        codec.decode(b"\x00" + sid.to_bytes(4, "big") + data[5:])
    assert is_non_retryable(info.value)


def test_an_unreachable_registry_is_not_a_decode_error(codec: ConfluentCodec) -> None:
    data = codec.encode(TASK)
    down = ConfluentCodec(client(f"http://127.0.0.1:{free_port()}"), _subject())
    with pytest.raises(Exception) as info:
        down.decode(data)
    assert not isinstance(info.value, DecodeError)  # transient: waits, never dead-lettered
    assert kind_of(info.value) == "transient"


def test_the_schema_of_another_record_is_a_decode_error(
        schema_registry: SchemaRegistryServer, codec: ConfluentCodec) -> None:
    ctx = SerializationContext(f"other-{uuid.uuid4().hex[:6]}", MessageField.VALUE)
    other = AvroSerializer(client(schema_registry.url), ORDER_AVRO)({"id": "o", "qty": 1}, ctx)
    with pytest.raises(DecodeError):
        codec.decode(other)


# --- evolution: records of an older writer schema, read with the current one -----------------

OLD = {
    "type": "record",
    "name": "ActivityTask",
    "namespace": "kworkers",
    "fields": [f for f in SCHEMA["fields"] if f["name"] not in ("headers", "schema_version")],
}


def test_a_newer_compatible_reader_decodes_older_records(
        schema_registry: SchemaRegistryServer) -> None:
    subject = _subject()
    c = client(schema_registry.url)
    old_writer = AvroSerializer(c, json.dumps(OLD), conf={
        "subject.name.strategy": lambda _ctx, _name: subject})
    rec = {"workflow_id": "w", "activity_id": "a", "activity_type": "t", "payload": b"p",
           "created_at_ms": 5}
    old_bytes = old_writer(rec, SerializationContext("t", MessageField.VALUE))
    # the current schema is a compatible next version of the subject
    c.set_compatibility(subject, "BACKWARD")
    assert c.test_compatibility(subject, Schema(json.dumps(SCHEMA), "AVRO"))
    codec = ConfluentCodec(c, subject)
    new_bytes = codec.encode(TASK)
    assert new_bytes[1:5] != old_bytes[1:5]  # two versions, two ids
    assert [v for v in c.get_versions(subject)] == [1, 2]
    # added fields take their defaults
    assert codec.decode(old_bytes) == ActivityTask("w", "a", "t", b"p", 5)
    assert codec.decode(new_bytes) == TASK


# --- every malformed input is a DecodeError ---------------------------------------------------


def _body(**overrides: Any) -> bytes:
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(SCHEMA), {**TASK._record(), **overrides})
    return buf.getvalue()


def test_malformed_values_are_decode_errors(codec: ConfluentCodec) -> None:
    good = codec.encode(TASK)
    hdr = good[:5]
    cases: dict[str, Any] = {
        "none": None, "empty": b"", "str": "not bytes", "wrong magic": b"\x01" + good[1:],
        "single-object bytes": SingleObjectCodec().encode(TASK), "header only": hdr,
        "short header": good[:3], "truncated body": good[:-1], "garbage body": hdr + b"\xff" * 9,
        "empty workflow id": hdr + _body(workflow_id=""), "slash in id": hdr + _body(
            activity_id="a/b"),
    }
    for name, data in cases.items():
        with pytest.raises(DecodeError) as info:
            codec.decode(data)
        assert str(info.value), name
        assert is_non_retryable(info.value), name
    for n in range(len(good)):
        with pytest.raises(DecodeError):
            codec.decode(good[:n])


@FUZZ
@given(data=st.binary(max_size=120))
def test_fuzz_random_bodies(codec: ConfluentCodec, data: bytes) -> None:
    hdr = codec.encode(TASK)[:5]
    for value in (data, hdr + data):
        try:
            got = codec.decode(value)
        except DecodeError:
            continue
        assert isinstance(got, ActivityTask)
