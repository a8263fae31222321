"""kworkers' own errors for client trouble, so that no module above the adapters catches (or
imports) the client library's exceptions.

- ``TopicsRefused``: the cluster refused to create topics (``kafka.admin.try_create_topics``).
- ``ClientError``: a client error no adapter turned into a more precise one, raised from it
  by ``client_errors()`` (the CLI's last line of defence), named and worded as the client's.

``KafkaUnreachable`` and ``TopicNotFound`` (``kafka.clients``) are the other two.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import KafkaException

from kworkers.errors import KworkersError

__all__ = ["ClientError", "TopicsRefused", "client_errors"]


class ClientError(KworkersError):
    """A client error as kworkers' own: ``str()`` is the client exception's type name and its
    text (``KafkaException: KafkaError{...}``); ``__cause__`` is the client's exception."""


class TopicsRefused(KworkersError):
    """The cluster refused to create topics (ACLs, a create policy); ``reason``: the client's
    own text for it (it names the failure, never the credentials)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"creating topics was refused: {reason}")
        self.reason = reason


@contextmanager
def client_errors() -> Iterator[None]:
    """Any client exception raised inside as ``ClientError`` (from it)."""
    try:
        yield
    except KafkaException as exc:
        raise ClientError(f"{type(exc).__name__}: {exc}") from exc
