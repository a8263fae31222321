"""The one shape of a (de)serializer kworkers takes.

A serializer is ``(obj, SerializationContext) -> bytes | None`` and a deserializer
``(bytes | None, SerializationContext) -> object``: exactly confluent-kafka's
``AvroSerializer``/``AvroDeserializer``, ``JSONSerializer``/``JSONDeserializer`` and
``ProtobufSerializer``/``ProtobufDeserializer`` (over a ``SchemaRegistryClient``, which caches
what the registry answers), and any function of that shape. The context is the client
library's: ``kworkers.kafka.serialization`` makes it (and ``serialize`` calls a serializer
with it); this module imports no client package, so the client's adapters may import it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from kworkers.errors import ConfigError
from kworkers.message import Headers

Serializer = Callable[[Any, Any], "bytes | None"]
Deserializer = Callable[[Any, Any], Any]
Field = Literal["key", "value"]
#: ``(topic, field, headers) -> SerializationContext``: ``kworkers.kafka.serialization.context``
ContextOf = Callable[[str, Field, Headers], Any]


def check_callable(fn: object, what: str) -> None:
    if fn is not None and not callable(fn):
        raise ConfigError(f"{what}: must be callable as (data, SerializationContext), got "
                          f"{type(fn).__name__}")
