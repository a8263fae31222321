"""The task envelope: ``ActivityTask`` and its Avro wire formats (see ``envelope.py`` for why)."""

from kworkers.envelope.envelope import (
    ACTIVITY_ID_HEADER,
    SCHEMA,
    SCHEMA_JSON,
    SCHEMA_VERSION,
    WORKFLOW_ID_HEADER,
    ActivityTask,
    ConfluentWireCodec,
    EnvelopeCodec,
    InMemoryRegistry,
    SchemaRegistry,
    SingleObjectCodec,
    ids_from_headers,
    ids_to_headers,
)

__all__ = [
    "ACTIVITY_ID_HEADER",
    "SCHEMA",
    "SCHEMA_JSON",
    "SCHEMA_VERSION",
    "WORKFLOW_ID_HEADER",
    "ActivityTask",
    "ConfluentWireCodec",
    "EnvelopeCodec",
    "InMemoryRegistry",
    "SchemaRegistry",
    "SingleObjectCodec",
    "ids_from_headers",
    "ids_to_headers",
]
