"""The task envelope: an activity's identity and input, as Avro bytes on a Kafka record.

Why an envelope at all: the idempotency key ``"<workflow_id>/<activity_id>"`` must survive every
hop (retry tiers, DLQ, redrive) unchanged, so it travels *inside* the value, fixed by a schema,
rather than being rebuilt from offsets or attempt numbers (which would make each attempt a
different effect). Records that are not envelopes carry the two ids as headers instead
(``ids_from_headers``).

Two wire formats, one ``EnvelopeCodec`` interface:

* ``SingleObjectCodec`` (here): Avro single-object encoding (``C3 01``, the 8-byte
  little-endian CRC-64-AVRO fingerprint of the schema's canonical form, the body).
  Self-describing without a registry service; the default.
* ``ConfluentCodec`` (``confluent.py``, the ``registry`` extra): Confluent's framing through a
  real schema registry, with confluent-kafka's Avro serializer and deserializer.

Decoding never raises anything but ``DecodeError`` for bad input: a record that cannot be
decoded is non-retryable by nature and goes to the DLQ, and a stray ``EOFError`` or
``UnicodeDecodeError`` must not be mistaken for a transient failure and retried forever. The one
exception is a registry that is *unavailable* (not one that answers "unknown id"): that is
transient, so it propagates as whatever the registry client raised
(``kworkers.payloads.failures`` tells the two apart).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Protocol

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

from kworkers.errors import ConfigError, DecodeError
from kworkers.message import Headers

__all__ = [
    "ACTIVITY_ID_HEADER",
    "SCHEMA",
    "SCHEMA_JSON",
    "SCHEMA_VERSION",
    "WORKFLOW_ID_HEADER",
    "ActivityTask",
    "EnvelopeCodec",
    "SingleObjectCodec",
    "ids_from_headers",
    "ids_to_headers",
    "task_of",
    "value_bytes",
]

#: Header names that carry the ids on plain (non-envelope) records.
WORKFLOW_ID_HEADER = "kw-workflow-id"
ACTIVITY_ID_HEADER = "kw-activity-id"

#: What this code writes in ``schema_version``; readers ignore the field today (see decode).
SCHEMA_VERSION = 1

SCHEMA_JSON: str = resources.files("kworkers.envelope").joinpath("task.avsc").read_text("utf-8")
SCHEMA: dict[str, Any] = json.loads(SCHEMA_JSON)

_INT64 = (-(2**63), 2**63 - 1)


def _check_id(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be a str, got {type(value).__name__}")
    if not value:
        raise ConfigError(f"{what} must not be empty (it is half of the idempotency key)")
    if "/" in value:
        raise ConfigError(f"{what} {value!r} must not contain '/' (the idempotency key separator)")
    return value


@dataclass(frozen=True, slots=True)
class ActivityTask:
    """One activity's input. Equal on every attempt, so its ``idempotency_key`` is too.

    ``headers`` is copied on construction (a plain dict, so tasks pickle); treat it as read-only.
    """

    workflow_id: str
    activity_id: str
    activity_type: str
    payload: bytes
    created_at_ms: int = 0
    headers: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        _check_id(self.workflow_id, "workflow_id")
        _check_id(self.activity_id, "activity_id")
        activity_type: object = self.activity_type
        if not isinstance(activity_type, str):
            raise ConfigError(f"activity_type must be a str, got {activity_type!r}")
        payload: object = self.payload
        if isinstance(payload, bytearray | memoryview):
            object.__setattr__(self, "payload", bytes(payload))
        elif not isinstance(payload, bytes):
            raise ConfigError(f"payload must be bytes, got {type(payload).__name__}")
        ms: object = self.created_at_ms
        if not isinstance(ms, int) or isinstance(ms, bool) or not _INT64[0] <= ms <= _INT64[1]:
            raise ConfigError(f"created_at_ms must be an int64, got {ms!r}")
        headers: object = self.headers
        if not isinstance(headers, Mapping):
            raise ConfigError(f"headers must be a mapping, got {type(headers).__name__}")
        copy: dict[str, str] = {}
        for k, v in headers.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ConfigError(f"headers must map str to str, got {k!r}: {v!r}")
            copy[k] = v
        object.__setattr__(self, "headers", copy)

    @property
    def idempotency_key(self) -> str:
        """``"<workflow_id>/<activity_id>"``: the same on every attempt, unique per effect."""
        return f"{self.workflow_id}/{self.activity_id}"

    def _record(self) -> dict[str, Any]:
        return {
            "workflow_id": self.workflow_id,
            "activity_id": self.activity_id,
            "activity_type": self.activity_type,
            "payload": self.payload,
            "created_at_ms": self.created_at_ms,
            "headers": dict(self.headers),
            "schema_version": SCHEMA_VERSION,
        }


class EnvelopeCodec(Protocol):
    """Bytes <-> ActivityTask. ``decode`` raises only ``DecodeError`` on bad input."""

    def encode(self, task: ActivityTask) -> bytes: ...

    def decode(self, data: bytes | None) -> ActivityTask: ...


# ---------------------------------------------------------------------------------------------


def _parse(schema: Mapping[str, Any] | str, what: str) -> Any:
    try:
        raw = json.loads(schema) if isinstance(schema, str) else dict(schema)
        return parse_schema(raw)
    except Exception as exc:
        raise DecodeError(f"{what} is not a valid Avro schema: {exc}") from exc


def _fingerprint(parsed: Any) -> bytes:
    # fastavro renders CRC-64-AVRO as the hex of the little-endian bytes, which is exactly the
    # byte order the single-object header uses (verified against the spec's algorithm in tests).
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))


def value_bytes(data: object, what: str) -> bytes:
    """``data`` as non-empty bytes; DecodeError naming ``what`` otherwise."""
    if data is None:
        raise DecodeError(f"no value: a null record cannot be an {what}")
    if isinstance(data, bytearray | memoryview):
        data = bytes(data)
    if not isinstance(data, bytes):
        raise DecodeError(f"an {what} must be bytes, got {type(data).__name__}")
    if not data:
        raise DecodeError(f"empty value: an {what} is never zero bytes")
    return data


def _read_task(body: bytes, writer: Any, reader: Any | None, where: str) -> ActivityTask:
    fo = io.BytesIO(body)
    try:
        rec = schemaless_reader(fo, writer, reader)
    except Exception as exc:  # EOFError, UnicodeDecodeError, SchemaResolutionError, ...
        raise DecodeError(
            f"{where}: the Avro body is truncated or malformed ({type(exc).__name__}: {exc})"
        ) from exc
    if fo.tell() != len(body):
        raise DecodeError(f"{where}: {len(body) - fo.tell()} unexpected bytes after the record")
    return task_of(rec, where)


def task_of(rec: object, where: str) -> ActivityTask:
    """The task in a decoded Avro record; DecodeError when it is not one."""
    if not isinstance(rec, dict):
        raise DecodeError(f"{where}: the schema does not describe a record")
    try:
        # schema_version is not checked: a version this code does not know still has these
        # fields (the schema guarantees it), and rejecting it would dead-letter every task
        # during a rolling upgrade where producers are ahead of workers.
        return ActivityTask(
            workflow_id=rec["workflow_id"],
            activity_id=rec["activity_id"],
            activity_type=rec["activity_type"],
            payload=rec["payload"],
            created_at_ms=rec.get("created_at_ms", 0),
            headers=rec.get("headers") or {},
        )
    except ConfigError as exc:
        raise DecodeError(f"{where}: {exc}") from exc
    except (KeyError, TypeError) as exc:
        raise DecodeError(f"{where}: the record lacks a task field ({exc})") from exc


def _write(parsed: Any, task: ActivityTask) -> bytes:
    if not isinstance(task, ActivityTask):
        raise ConfigError(f"can only encode an ActivityTask, got {type(task).__name__}")
    buf = io.BytesIO()
    schemaless_writer(buf, parsed, task._record())
    return buf.getvalue()


class SingleObjectCodec:
    """Avro single-object encoding of ``ActivityTask`` (no registry needed).

    ``older_schemas``: previous versions of the task schema this reader still accepts; their
    records are resolved to the current schema (added fields take their defaults). A
    fingerprint it does not know is a DecodeError.
    """

    MAGIC = b"\xc3\x01"

    def __init__(self, older_schemas: Iterable[Mapping[str, Any]] = ()) -> None:
        self._schema = _parse(SCHEMA, "the bundled task schema")
        self.fingerprint = _fingerprint(self._schema)
        self._readers: dict[bytes, Any] = {}
        for old in older_schemas:
            parsed = _parse(old, "an older task schema")
            self._readers[_fingerprint(parsed)] = parsed
        self._readers[self.fingerprint] = self._schema

    def encode(self, task: ActivityTask) -> bytes:
        return self.MAGIC + self.fingerprint + _write(self._schema, task)

    def decode(self, data: bytes | None) -> ActivityTask:
        raw = value_bytes(data, "Avro single-object encoded task")
        if raw[:2] != self.MAGIC:
            raise DecodeError(
                f"wrong magic {raw[:2].hex()!r}: not Avro single-object encoding (c301)"
            )
        if len(raw) < 10:
            raise DecodeError(f"{len(raw)} bytes: too short for a single-object header (10)")
        fp = raw[2:10]
        writer = self._readers.get(fp)
        if writer is None:
            raise DecodeError(
                f"unknown schema fingerprint {fp.hex()}: not an ActivityTask schema this reader "
                f"knows (current {self.fingerprint.hex()})"
            )
        reader = None if writer is self._schema else self._schema
        return _read_task(raw[10:], writer, reader, f"single-object task {fp.hex()}")


# ---------------------------------------------------------------------------------------------


def ids_from_headers(headers: Headers) -> tuple[str, str] | None:
    """``(workflow_id, activity_id)`` from a plain record's headers, ``None`` when it has
    neither header (not a workflow record). One without the other, an empty or non-UTF-8 value,
    or a ``/`` in an id is a DecodeError. The last value of a repeated header wins."""
    found: dict[str, object] = {}
    entries: Iterable[tuple[object, object]] = headers
    for name, value in entries:
        if name in (WORKFLOW_ID_HEADER, ACTIVITY_ID_HEADER):
            found[name] = value
    if not found:
        return None
    ids: list[str] = []
    for name in (WORKFLOW_ID_HEADER, ACTIVITY_ID_HEADER):
        if name not in found:
            other = ACTIVITY_ID_HEADER if name == WORKFLOW_ID_HEADER else WORKFLOW_ID_HEADER
            raise DecodeError(f"the record has a {other} header but no {name} header")
        raw = found[name]
        if isinstance(raw, bytearray | memoryview):
            raw = bytes(raw)
        if not isinstance(raw, bytes):
            raise DecodeError(f"header {name} must be bytes, got {type(raw).__name__}")
        try:
            ids.append(_check_id(raw.decode("utf-8"), f"header {name}"))
        except UnicodeDecodeError as exc:
            raise DecodeError(f"header {name} is not UTF-8: {raw!r}") from exc
        except ConfigError as exc:
            raise DecodeError(str(exc)) from exc
    return ids[0], ids[1]


def ids_to_headers(workflow_id: str, activity_id: str) -> Headers:
    """The headers ``ids_from_headers`` reads, for producers of plain records."""
    return (
        (WORKFLOW_ID_HEADER, _check_id(workflow_id, "workflow_id").encode("utf-8")),
        (ACTIVITY_ID_HEADER, _check_id(activity_id, "activity_id").encode("utf-8")),
    )
