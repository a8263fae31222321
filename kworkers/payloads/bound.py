"""A registry client that may never answer, bounded by kworkers itself.

confluent-kafka's ``SchemaRegistryClient`` builds its HTTP client with no timeout unless told
one: a registry that accepts a connection and never answers (a stopped process, a proxy that
holds the request) keeps a decode waiting for ever, and with it the partition. The client is the
user's, and telling every user to set ``timeout`` is not a fix, so a deserializer kworkers
recognises (confluent-kafka's Avro/JSON/Protobuf deserializers, sync or async: a ``_registry``
whose REST client has an httpx ``session``) gets the decode bound as its HTTP timeout when it
has none of its own. A timeout the user set is left alone. Everything else is bounded by the
decoder's watch of the call (``RecordDecoder.waiting``): a call unanswered past the bound holds
its partition as a registry that does not answer does.

The same HTTP client logs every request at INFO (``HTTP Request: GET ...``): one line per
schema lookup, and a line per try during an outage. ``quiet_request_log`` moves those lines to
DEBUG (shown only when the root logger is at DEBUG); the decoder says an outage and a recovery
once each instead.

Duck-typed: no client library is imported.
"""

from __future__ import annotations

import logging
from typing import Any

#: the HTTP clients confluent-kafka's registry client uses (``httpx2`` when installed, else
#: ``httpx``), and their per-request line
_HTTP_LOGGERS = ("httpx2", "httpx")
_REQUEST_LINE = "HTTP Request:"
_TIMEOUT_PARTS = ("connect", "read", "write", "pool")


def _session(deserializer: object) -> tuple[Any, Any]:
    registry = getattr(deserializer, "_registry", None)
    rest = getattr(registry, "_rest_client", None)
    return rest, getattr(rest, "session", None)


def bound_client(deserializer: object, seconds: float) -> bool:
    """Give the registry client inside ``deserializer`` a timeout of ``seconds`` per request
    when it has none; True when it did. Anything not recognised is left as it is."""
    rest, session = _session(deserializer)
    timeout = getattr(session, "timeout", None)
    if timeout is None or any(getattr(timeout, p, None) is not None for p in _TIMEOUT_PARTS):
        return False  # not a client we know, or one with a timeout the user chose
    try:
        session.timeout = seconds  # httpx makes it a Timeout for every part of a request
    except (AttributeError, TypeError, ValueError):
        return False
    if getattr(rest, "timeout", 0) is None:
        rest.timeout = seconds  # what the client says it was given, for whoever reads it
    return True


class _DebugRequests(logging.Filter):
    """The HTTP client's per-request lines as DEBUG: passed on only when the root logger
    would show DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not str(record.msg).startswith(_REQUEST_LINE):
            return True
        if not logging.getLogger().isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def quiet_request_log() -> None:
    """Install ``_DebugRequests`` on the HTTP clients' loggers (once)."""
    for name in _HTTP_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DebugRequests) for f in logger.filters):
            logger.addFilter(_DebugRequests())
