"""The task envelope in Confluent's framing, through a real schema registry.

confluent-kafka's ``AvroSerializer`` / ``AvroDeserializer`` over a ``SchemaRegistryClient`` do
the framing (magic byte ``00``, the 4-byte big-endian schema id, the Avro body; fastavro
underneath) and cache what the registry answers, so a schema id costs one request per process.
What kworkers adds: the subject the task schema is registered under, the bundled schema as the
*reader* schema (an older or newer compatible writer resolves to the fields this code knows:
added fields take their defaults), and the rule every decoder here keeps: bad bytes and an
unknown schema id are a ``DecodeError`` (non-retryable, to the DLQ); a registry that could not
answer is not, its error propagates as transient (``kworkers.payloads.failures``).

Needs the ``registry`` extra (``pip install 'kworkers[registry]'``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kworkers.envelope.envelope import SCHEMA_JSON, ActivityTask, task_of, value_bytes
from kworkers.errors import ConfigError, DecodeError
from kworkers.payloads.failures import CONFLUENT_MAGIC, kind_of, schema_id_of

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

__all__ = ["DEFAULT_SUBJECT", "ConfluentCodec"]

DEFAULT_SUBJECT = "kworkers.ActivityTask"


class ConfluentCodec:
    """``ActivityTask`` <-> Confluent-framed Avro, the schema registered under ``subject``.

    ``auto_register=False`` for producers that must not register schemas (the subject's
    schema then has to be there: a missing one is a registry error on encode).
    """

    def __init__(self, client: SchemaRegistryClient, subject: str = DEFAULT_SUBJECT,
                 auto_register: bool = True) -> None:
        if not subject:
            raise ConfigError("a schema registry subject must not be empty")
        self.subject = subject

        def strategy(_ctx: Any, _record_name: Any) -> str:
            return subject

        self._serialize = AvroSerializer(
            client, SCHEMA_JSON, to_dict=lambda task, _ctx: task._record(),
            conf={"auto.register.schemas": auto_register, "subject.name.strategy": strategy})
        self._deserialize = AvroDeserializer(client, SCHEMA_JSON)
        self._ctx = SerializationContext(subject, MessageField.VALUE)

    def encode(self, task: ActivityTask) -> bytes:
        if not isinstance(task, ActivityTask):
            raise ConfigError(f"can only encode an ActivityTask, got {type(task).__name__}")
        data: bytes | None = self._serialize(task, self._ctx)
        assert data is not None  # a task is never None
        return data

    def decode(self, data: bytes | None) -> ActivityTask:
        raw = value_bytes(data, "Confluent-framed Avro task")
        if raw[0] != CONFLUENT_MAGIC:
            raise DecodeError(f"wrong magic byte {raw[:1].hex()!r}: not Confluent framing (00)")
        if len(raw) < 5:
            raise DecodeError(f"{len(raw)} bytes: too short for a Confluent header (5)")
        where = f"task with schema id {schema_id_of(raw)}"
        try:
            # no context: the reader schema is fixed, so no subject lookup is needed
            rec = self._deserialize(raw, None)
        except Exception as exc:
            if kind_of(exc) == "transient":
                raise  # the registry did not answer: retried, never dead-lettered
            if getattr(exc, "error_code", None) == 40403:
                raise DecodeError(f"unknown schema id {schema_id_of(raw)}: the registry has no "
                                  "such schema") from exc
            raise DecodeError(f"{where}: {type(exc).__name__}: {exc}") from exc
        return task_of(rec, where)
