"""The one shape of a (de)serializer kworkers takes, and the context it is called with.

A serializer is ``(obj, SerializationContext) -> bytes | None`` and a deserializer
``(bytes | None, SerializationContext) -> object``: exactly confluent-kafka's
``AvroSerializer``/``AvroDeserializer``, ``JSONSerializer``/``JSONDeserializer`` and
``ProtobufSerializer``/``ProtobufDeserializer`` (over a ``SchemaRegistryClient``, which caches
what the registry answers), and any function of that shape. The context names the topic the
record belongs to (for a retry tier's record: its *source* topic, whose subject the schema is
registered under), the field (key or value) and the headers.

confluent-kafka's ``serialization`` module is imported on first use only: the outbox and the
worker import this module whether or not a serializer is set.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal

from kworkers.errors import ConfigError
from kworkers.message import Headers

Serializer = Callable[[Any, Any], "bytes | None"]
Deserializer = Callable[[Any, Any], Any]
Field = Literal["key", "value"]


def context(topic: str, field: Field, headers: Headers = ()) -> Any:
    """confluent-kafka's ``SerializationContext`` for ``field`` of a record of ``topic``
    (made by the client package: ``kworkers.kafka.serialization``)."""
    from kworkers.kafka.serialization import serialization_context

    return serialization_context(topic, field == "key", headers)


def check_callable(fn: object, what: str) -> None:
    if fn is not None and not callable(fn):
        raise ConfigError(f"{what}: must be callable as (data, SerializationContext), got "
                          f"{type(fn).__name__}")


def serialize(serializer: Serializer, obj: Any, topic: str, field: Field,
              headers: Headers = ()) -> bytes | None:
    """``obj`` as bytes; a serializer that answers with anything else is a ConfigError (an
    async serializer belongs where the caller awaits it)."""
    out: object = serializer(obj, context(topic, field, headers))
    if inspect.isawaitable(out):
        close = getattr(out, "close", None)
        if close is not None:
            close()  # never awaited: do not leave a warning behind
        raise ConfigError(f"the {field} serializer returned an awaitable: use the synchronous "
                          "one here (AvroSerializer, not AsyncAvroSerializer)")
    if out is not None and not isinstance(out, bytes):
        raise ConfigError(f"the {field} serializer returned {type(out).__name__}, not bytes")
    return out
