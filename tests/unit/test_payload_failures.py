"""What a payload that did not decode means, judged on the client's real exception types."""

from __future__ import annotations

import pytest
from confluent_kafka.schema_registry import SchemaRegistryError
from confluent_kafka.schema_registry.error import OAuthTokenError
from confluent_kafka.serialization import SerializationError

from kworkers.errors import DecodeError, RetryableError
from kworkers.payloads.failures import failure_of, kind_of, schema_id_of
from tests.payload_schemas import http


def _wrapped(inner: BaseException) -> BaseException:
    """``inner`` behind a deserializer's own error, as ``raise ... from`` leaves it."""
    try:
        try:
            raise inner
        except BaseException as exc:
            raise SerializationError("could not deserialize") from exc
    except SerializationError as outer:
        return outer


PERMANENT = {
    "unknown schema id": SchemaRegistryError(404, 40403, "Schema 7 not found."),
    "wrapped unknown id": _wrapped(SchemaRegistryError(404, 40403, "Schema 7 not found.")),
    "bad framing": SerializationError("Unknown magic byte"),
    "truncated body": EOFError(),
    "wrong magic as guid": ValueError("bytes is not a 16-char string"),
    "bad utf-8": UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
    "typed by the user": DecodeError("not an order"),
}
TRANSIENT = {
    "refused": http.ConnectError("[Errno 111] Connection refused"),
    "timed out": http.ReadTimeout("timed out"),
    "wrapped refused": _wrapped(http.ConnectError("refused")),
    "unauthorized": SchemaRegistryError(401, 40101, "Unauthorized"),
    "forbidden": SchemaRegistryError(403, 40301, "Forbidden"),
    "server error": SchemaRegistryError(500, 50001, "Error in the backend"),
    "unavailable": SchemaRegistryError(503, -1, "Unknown Schema Registry Error: b''"),
    "a 404 that is not schema-not-found": SchemaRegistryError(404, -1, "Not Found"),
    "token endpoint down": OAuthTokenError("Failed to retrieve token"),
    "socket": ConnectionResetError(104, "reset"),
    "typed by the user": RetryableError("RegistryBusy", "try later"),
}


@pytest.mark.parametrize("name", list(PERMANENT))
def test_permanent(name: str) -> None:
    assert kind_of(PERMANENT[name]) == "permanent"


@pytest.mark.parametrize("name", list(TRANSIENT))
def test_transient(name: str) -> None:
    assert kind_of(TRANSIENT[name]) == "transient"


def test_the_schema_id_of_confluent_framing() -> None:
    assert schema_id_of(b"\x00\x00\x00\x01\x02body") == 258
    assert schema_id_of(b"\x00\x00\x00\x01\x02") == 258
    for data in (None, b"", b"\x00\x00\x00\x01", b"\x01\x00\x00\x00\x01body", b"text"):
        assert schema_id_of(data) is None


def test_a_failure_names_its_type_reason_and_id() -> None:
    f = failure_of(PERMANENT["unknown schema id"], b"\x00\x00\x00\x00\x07xx")
    assert (f.kind, f.error_type, f.schema_id) == ("permanent", "SchemaRegistryError", 7)
    assert "Schema 7 not found" in f.reason and "40403" in f.reason
    eof = failure_of(EOFError(), b"\x00\x00\x00\x00\x07")
    assert eof.reason == "EOFError" and eof.schema_id == 7
    long = failure_of(ValueError("x" * 1000 + "\n"), None)
    assert len(long.reason) == 300 and "\n" not in long.reason
