"""confluent-kafka's serialization context, made where the client lives (an adapter module),
and the calls that hand it to a (de)serializer of the one shape ``kworkers.payloads.serde``
names: (de)serializers of the schema-registry client take one with every call.

The context names the topic the record belongs to (for a retry tier's record: its *source*
topic, whose subject the schema is registered under), the field (key or value) and the
headers. The worker gives ``context`` to its ``RecordDecoder``; the outbox and ``ctx.emit``
call ``serialize``.

confluent-kafka's ``serialization`` module is imported on first use only: the outbox and the
activity module import this one whether or not a serializer is set.
"""

from __future__ import annotations

import inspect
from typing import Any

from kworkers.errors import ConfigError
from kworkers.message import Headers
from kworkers.payloads.serde import Field, Serializer

__all__ = ["context", "serialization_context", "serialize"]


def serialization_context(topic: str, is_key: bool, headers: Headers = ()) -> Any:
    from confluent_kafka.serialization import MessageField, SerializationContext

    return SerializationContext(topic, MessageField.KEY if is_key else MessageField.VALUE,
                                list(headers))


def context(topic: str, field: Field, headers: Headers = ()) -> Any:
    """confluent-kafka's ``SerializationContext`` for ``field`` of a record of ``topic``."""
    return serialization_context(topic, field == "key", headers)


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
