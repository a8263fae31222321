"""The task envelope: ``ActivityTask`` and its Avro wire formats (see ``envelope.py`` for why).

``ConfluentCodec`` (Confluent framing through a schema registry) is imported on first use: it
needs the ``registry`` extra, and importing the envelope must not load the registry client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kworkers.envelope.envelope import (
    ACTIVITY_ID_HEADER,
    SCHEMA,
    SCHEMA_JSON,
    SCHEMA_VERSION,
    WORKFLOW_ID_HEADER,
    ActivityTask,
    EnvelopeCodec,
    SingleObjectCodec,
    ids_from_headers,
    ids_to_headers,
    task_of,
    value_bytes,
)

if TYPE_CHECKING:
    from kworkers.kafka.envelope_codec import ConfluentCodec

__all__ = [
    "ACTIVITY_ID_HEADER",
    "SCHEMA",
    "SCHEMA_JSON",
    "SCHEMA_VERSION",
    "WORKFLOW_ID_HEADER",
    "ActivityTask",
    "ConfluentCodec",
    "EnvelopeCodec",
    "SingleObjectCodec",
    "ids_from_headers",
    "ids_to_headers",
    "task_of",
    "value_bytes",
]


def __getattr__(name: str) -> Any:
    if name == "ConfluentCodec":
        from kworkers.kafka.envelope_codec import ConfluentCodec

        return ConfluentCodec
    raise AttributeError(f"module 'kworkers.envelope' has no attribute {name!r}")
