"""The task envelope: round trips, the exact wire bytes, and DecodeError for every bad input.

The Confluent framing goes through a real schema registry:
tests/integration/test_envelope_registry.py.
"""

from __future__ import annotations

import io
import json
import pickle
import struct
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from fastavro.schema import to_parsing_canonical_form
from hypothesis import example, given, settings
from hypothesis import strategies as st

import kworkers.envelope as envelope_pkg
from kworkers.envelope import (
    ACTIVITY_ID_HEADER,
    SCHEMA,
    SCHEMA_JSON,
    WORKFLOW_ID_HEADER,
    ActivityTask,
    EnvelopeCodec,
    SingleObjectCodec,
    ids_from_headers,
    ids_to_headers,
)
from kworkers.errors import ConfigError, DecodeError, is_non_retryable

TASK = ActivityTask("wf-1", "charge-card", "payments.Charge", b"\x00{json}", 1_700_000_000_000)


# --- an independent CRC-64-AVRO, straight from the Avro specification -------------------------

_EMPTY = 0xC15D213AA4D7A795
_MASK = 0xFFFFFFFFFFFFFFFF


def _table() -> list[int]:
    out = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY if fp & 1 else 0)
        out.append(fp & _MASK)
    return out


_TABLE = _table()


def crc64_avro(data: bytes) -> int:
    fp = _EMPTY
    for b in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ b) & 0xFF]
    return fp


def test_spec_crc_matches_the_known_value_for_null() -> None:
    # Java's SchemaNormalization.parsingFingerprint64 of the schema "null".
    assert crc64_avro(b'"null"') == 0x63DD24E7CC258F8A


# --- single-object encoding -------------------------------------------------------------------


def test_single_object_wire_layout() -> None:
    data = SingleObjectCodec().encode(TASK)
    canonical = to_parsing_canonical_form(parse_schema(SCHEMA)).encode()
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == struct.pack("<Q", crc64_avro(canonical))
    # The body is plain Avro binary of the record, starting with the workflow id string.
    assert data[10:11] == bytes([len("wf-1") * 2]) and data[11:15] == b"wf-1"


def test_canonical_schema_is_the_specified_record() -> None:
    canonical = json.loads(to_parsing_canonical_form(parse_schema(SCHEMA)))
    assert canonical["name"] == "kworkers.ActivityTask"
    assert [(f["name"], f["type"]) for f in canonical["fields"]] == [
        ("workflow_id", "string"),
        ("activity_id", "string"),
        ("activity_type", "string"),
        ("payload", "bytes"),
        ("created_at_ms", "long"),
        ("headers", {"type": "map", "values": "string"}),
        ("schema_version", "int"),
    ]
    defaults = {f["name"]: f.get("default") for f in json.loads(SCHEMA_JSON)["fields"]}
    assert defaults["headers"] == {} and defaults["schema_version"] == 1


ids = st.text(min_size=1, max_size=20).filter(lambda s: "/" not in s)
tasks = st.builds(
    ActivityTask,
    workflow_id=ids,
    activity_id=ids,
    activity_type=st.text(max_size=20),
    payload=st.binary(max_size=64),
    created_at_ms=st.integers(-(2**63), 2**63 - 1),
    headers=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4),
)


def _codecs() -> list[EnvelopeCodec]:
    return [SingleObjectCodec()]


@given(task=tasks)
def test_round_trip(task: ActivityTask) -> None:
    for codec in _codecs():
        back = codec.decode(codec.encode(task))
        assert back == task
        assert back.idempotency_key == f"{task.workflow_id}/{task.activity_id}"


# --- evolution: an older writer schema without headers/schema_version -------------------------

OLD = {
    "type": "record",
    "name": "ActivityTask",
    "namespace": "kworkers",
    "fields": [f for f in SCHEMA["fields"] if f["name"] not in ("headers", "schema_version")],
}


def _old_body() -> bytes:
    buf = io.BytesIO()
    rec = {"workflow_id": "w", "activity_id": "a", "activity_type": "t", "payload": b"p"}
    schemaless_writer(buf, parse_schema(OLD), {**rec, "created_at_ms": 5})
    return buf.getvalue()


def test_older_schema_resolves_with_defaults() -> None:
    want = ActivityTask("w", "a", "t", b"p", 5)
    fp = struct.pack("<Q", crc64_avro(to_parsing_canonical_form(parse_schema(OLD)).encode()))
    single = b"\xc3\x01" + fp + _old_body()
    assert SingleObjectCodec(older_schemas=[OLD]).decode(single) == want
    with pytest.raises(DecodeError, match="unknown schema fingerprint"):
        SingleObjectCodec().decode(single)


# --- every malformed input is a DecodeError ---------------------------------------------------


def _raw_body(**overrides: Any) -> bytes:
    rec = {**TASK._record(), **overrides}
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(SCHEMA), rec)
    return buf.getvalue()


SINGLE = SingleObjectCodec()
GOOD = SINGLE.encode(TASK)
HDR = GOOD[:10]

MALFORMED: dict[str, Any] = {
    "none": None,
    "empty": b"",
    "str": "not bytes",
    "wrong magic": b"\xc3\x02" + GOOD[2:],
    "confluent bytes": b"\x00\x00\x00\x00\x01" + GOOD[10:],
    "magic only": b"\xc3\x01",
    "short header": GOOD[:7],
    "wrong fingerprint": GOOD[:2] + bytes(8) + GOOD[10:],
    "header only": HDR,
    "truncated body": GOOD[:-1],
    "trailing bytes": GOOD + b"\x00",
    "garbage": b"\xff" * 40,
    "negative length": HDR + b"\x01",
    "huge length": HDR + b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01",
    "bad utf-8": HDR + b"\x04\xff\xfe" + GOOD[15:],
    "empty workflow id": HDR + _raw_body(workflow_id=""),
    "empty activity id": HDR + _raw_body(activity_id=""),
    "slash in id": HDR + _raw_body(activity_id="a/b"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_single_object_is_a_decode_error(name: str) -> None:
    with pytest.raises(DecodeError) as info:
        SINGLE.decode(MALFORMED[name])
    assert str(info.value)  # says what is wrong
    assert is_non_retryable(info.value)


def test_every_prefix_of_a_valid_encoding_is_a_decode_error() -> None:
    for n in range(len(GOOD)):
        with pytest.raises(DecodeError):
            SINGLE.decode(GOOD[:n])


def _decode_or_decode_error(codec: EnvelopeCodec, data: Any) -> None:
    try:
        got = codec.decode(data)
    except DecodeError:
        return
    assert isinstance(got, ActivityTask)


@settings(max_examples=500)
@given(data=st.one_of(st.none(), st.binary(max_size=200), st.text(max_size=10)))
@example(data=b"\x00\x00\x00\x00\x01")
def test_fuzz_random_bytes(data: Any) -> None:
    _decode_or_decode_error(SINGLE, data)
    if isinstance(data, bytes):  # past the header: the Avro reader gets the random bytes
        _decode_or_decode_error(SINGLE, HDR + data)


@settings(max_examples=500)
@given(
    task=tasks,
    edits=st.lists(
        st.tuples(
            st.sampled_from(["flip", "drop", "insert"]),
            st.integers(0, 10_000),
            st.integers(0, 255),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_fuzz_mutated_encodings(task: ActivityTask, edits: list[tuple[str, int, int]]) -> None:
    for codec in _codecs():
        data = bytearray(codec.encode(task))
        for kind, pos, byte in edits:
            i = pos % (len(data) + 1)
            if kind == "insert":
                data.insert(i, byte)
            elif data and kind == "drop":
                del data[i % len(data)]
            elif data:
                data[i % len(data)] ^= byte or 1
        _decode_or_decode_error(codec, bytes(data))


# --- the task value ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"workflow_id": ""},
        {"activity_id": ""},
        {"workflow_id": "a/b"},
        {"activity_id": "x/"},
        {"workflow_id": 7},
        {"activity_type": None},
        {"payload": "text"},
        {"created_at_ms": 2**63},
        {"created_at_ms": True},
        {"headers": {"k": 1}},
        {"headers": [("k", "v")]},
    ],
)
def test_invalid_task_is_a_config_error(kwargs: dict[str, Any]) -> None:
    base: dict[str, Any] = {
        "workflow_id": "w",
        "activity_id": "a",
        "activity_type": "t",
        "payload": b"",
    }
    with pytest.raises(ConfigError):
        ActivityTask(**{**base, **kwargs})


def test_task_is_a_frozen_hashable_picklable_value() -> None:
    headers = {"trace": "abc"}
    task = ActivityTask("w", "a", "t", bytearray(b"p"), headers=headers)  # type: ignore[arg-type]
    headers["trace"] = "changed"
    assert task.headers == {"trace": "abc"}  # copied on construction
    assert task.payload == b"p" and isinstance(task.payload, bytes)
    with pytest.raises(AttributeError):
        task.workflow_id = "x"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(task)) == task
    assert hash(task) == hash(ActivityTask("w", "a", "t", b"p", headers={"trace": "abc"}))
    assert task.idempotency_key == "w/a"
    assert ActivityTask("w", "a", "t", b"").headers == {}


# --- ids on plain records ---------------------------------------------------------------------


def test_ids_from_headers() -> None:
    assert ids_from_headers(()) is None
    assert ids_from_headers((("other", b"x"),)) is None
    assert ids_from_headers(ids_to_headers("wf", "act")) == ("wf", "act")
    repeated = (
        (WORKFLOW_ID_HEADER, b"old"),
        (ACTIVITY_ID_HEADER, b"a"),
        (WORKFLOW_ID_HEADER, "wf-ü".encode()),
    )
    assert ids_from_headers(repeated) == ("wf-ü", "a")  # the last value wins


@pytest.mark.parametrize(
    "headers",
    [
        ((WORKFLOW_ID_HEADER, b"wf"),),
        ((ACTIVITY_ID_HEADER, b"a"),),
        ((WORKFLOW_ID_HEADER, b""), (ACTIVITY_ID_HEADER, b"a")),
        ((WORKFLOW_ID_HEADER, b"w/x"), (ACTIVITY_ID_HEADER, b"a")),
        ((WORKFLOW_ID_HEADER, b"\xff"), (ACTIVITY_ID_HEADER, b"a")),
        ((WORKFLOW_ID_HEADER, None), (ACTIVITY_ID_HEADER, b"a")),
    ],
)
def test_bad_id_headers_are_decode_errors(headers: Any) -> None:
    with pytest.raises(DecodeError):
        ids_from_headers(headers)


def test_ids_to_headers_validates() -> None:
    with pytest.raises(ConfigError):
        ids_to_headers("", "a")


def test_all_is_complete() -> None:
    import kworkers.envelope.envelope as impl
    import kworkers.kafka.envelope_codec as confluent

    assert sorted(envelope_pkg.__all__) == sorted([*impl.__all__, "ConfluentCodec"])
    for name in impl.__all__:
        assert getattr(envelope_pkg, name) is getattr(impl, name)
    assert envelope_pkg.ConfluentCodec is confluent.ConfluentCodec
    public = {
        n
        for n, v in vars(impl).items()
        if not n.startswith("_") and getattr(v, "__module__", None) == impl.__name__
    }
    assert public <= set(impl.__all__)
