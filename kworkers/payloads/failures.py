"""What a payload that did not decode means: a bad record, or a registry that could not answer.

The difference decides where the record goes, so it is decided here once. Bytes that cannot be
decoded (a wrong magic byte, a truncated or garbled body, a body that does not match its
schema) and a schema id the registry does not know (HTTP 404, error code 40403) are
*permanent*: no retry can help, the record goes to the DLQ after one attempt. A registry that
cannot be reached, times out, or answers anything else (401/403 while credentials rotate,
429, 5xx, a 404 that is not "schema not found") is *transient*: the record is fine and waits
in place until the registry answers; dead-lettering it would empty a topic into the DLQ every
time the registry has a bad minute.

Judged by duck type and class name, never by importing the client: confluent-kafka's
``SchemaRegistryError`` carries ``http_status_code`` and ``error_code``; its HTTP transport is
httpx or httpx2, whose connection and timeout errors derive from ``TransportError``; an
``OAuthTokenError`` means the token endpoint did not answer. A deserializer of the user's own
may say what it means with ``kworkers.RetryableError`` (transient) or ``NonRetryableError``.

Pure: no client library is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kworkers.errors import ActivityFailure, causes

Kind = Literal["permanent", "transient"]

#: Confluent's "schema not found": the one registry answer that condemns a record.
SCHEMA_NOT_FOUND = (404, 40403)
#: Confluent framing: magic byte 0, then the schema id as a 4-byte big-endian integer.
CONFLUENT_MAGIC = 0
_TRANSPORT = ("TransportError", "OAuthTokenError")
_REASON_LIMIT = 300


@dataclass(frozen=True)
class PayloadFailure:
    """Why a payload did not decode, as the failure headers and the metrics say it."""

    kind: Kind
    #: the deserializer's exception type (``SerializationError``, ``SchemaRegistryError``, ...)
    error_type: str
    reason: str
    #: the schema id of the Confluent framing, when the bytes have one
    schema_id: int | None


def registry_status(exc: BaseException) -> tuple[int, int] | None:
    """``(http_status_code, error_code)`` when ``exc`` is a schema registry's answer."""
    status = getattr(exc, "http_status_code", None)
    code = getattr(exc, "error_code", None)
    if isinstance(status, int) and isinstance(code, int):
        return status, code
    return None


def _is_transport(exc: BaseException) -> bool:
    if isinstance(exc, OSError | TimeoutError):  # ConnectionError, socket.timeout, ...
        return True
    return any(k.__name__ in _TRANSPORT for k in type(exc).__mro__)


def kind_of(exc: BaseException) -> Kind:
    """``transient`` when anything in ``exc``'s chain says the registry could not answer (or a
    typed failure says retry); ``permanent`` otherwise. The outermost verdict wins: a
    deserializer that wraps a 40403 in its own error is still permanent."""
    for cur in causes(exc):
        if isinstance(cur, ActivityFailure):
            return "permanent" if cur.non_retryable else "transient"
        status = registry_status(cur)
        if status is not None:
            return "permanent" if status == SCHEMA_NOT_FOUND else "transient"
        if _is_transport(cur):
            return "transient"
    return "permanent"


def schema_id_of(data: bytes | None) -> int | None:
    """The schema id of Confluent-framed bytes (magic byte 0 and a 4-byte id), else None."""
    if data is None or len(data) < 5 or data[0] != CONFLUENT_MAGIC:
        return None
    return int.from_bytes(data[1:5], "big")


def failure_of(exc: BaseException, data: bytes | None) -> PayloadFailure:
    """The verdict on ``exc`` raised while decoding ``data``, with a one-line reason."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if len(text) > _REASON_LIMIT:
        text = text[:_REASON_LIMIT - 1] + "…"
    return PayloadFailure(kind_of(exc), type(exc).__name__, text, schema_id_of(data))
