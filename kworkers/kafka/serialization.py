"""confluent-kafka's serialization context, made where the client lives (an adapter module):
(de)serializers of the schema-registry client take one with every call."""

from __future__ import annotations

from typing import Any

from confluent_kafka.serialization import MessageField, SerializationContext

from kworkers.message import Headers


def serialization_context(topic: str, is_key: bool, headers: Headers = ()) -> Any:
    return SerializationContext(topic, MessageField.KEY if is_key else MessageField.VALUE,
                                list(headers))
