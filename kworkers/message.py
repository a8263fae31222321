"""The record a handler sees: kworkers' own immutable value, so client types never leak.

A ``NamedTuple`` rather than a frozen dataclass on purpose: one is built per fetched record on
the hot path, and a tuple is several times cheaper to build than a frozen dataclass.

With a worker's ``value_deserializer`` / ``key_deserializer`` (``kworkers.payloads.decode``) the
handler gets a copy whose ``value`` / ``key`` are decoded objects, the bytes as read kept in
``raw_value`` / ``raw_key`` and ``decoded`` True; kworkers itself only ever hands off, routes
and keys lanes by the bytes. A message hashes by its coordinates (topic, partition, offset,
attempt), so a decoded one (its value a dict) can still key a ``BatchError``.
"""

from __future__ import annotations

from typing import NamedTuple

Headers = tuple[tuple[str, bytes], ...]


class Message(NamedTuple):
    # kworkers/kafka/consumer.py and share_consumer.py build it with tuple.__new__ on the hot
    # path: a new field must be given there too (a short tuple breaks _replace and the field)
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    timestamp_ms: int | None = None
    #: 1 on first delivery, +1 per retry tier hop; 1 again after a redrive.
    attempt: int = 1
    #: the key and value bytes as read, when a deserializer decoded ``key`` / ``value``
    raw_key: bytes | None = None
    raw_value: bytes | None = None
    #: True when ``key`` / ``value`` were decoded by the worker's deserializers
    decoded: bool = False

    def __hash__(self) -> int:
        return hash((self.topic, self.partition, self.offset, self.attempt))

    @property
    def value_bytes(self) -> bytes | None:
        """The value as read from Kafka, decoded or not."""
        return self.raw_value if self.decoded else self.value

    @property
    def key_bytes(self) -> bytes | None:
        """The key as read from Kafka, decoded or not."""
        return self.raw_key if self.decoded else self.key

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name`` (Kafka allows repeats; the last one wins)."""
        found = None
        for k, v in self.headers:
            if k == name:
                found = v
        return found

    def header_str(self, name: str) -> str | None:
        raw = self.header(name)
        return None if raw is None else raw.decode("utf-8", "replace")


_ATTEMPT = Message._fields.index("attempt")


def with_attempt(msg: Message, attempt: int) -> Message:
    """``msg`` as attempt ``attempt``: what the retry loop makes of every tier record it reads
    (``_replace`` is Python code: 1.3 us a record, this 0.5)."""
    return tuple.__new__(Message, (*msg[:_ATTEMPT], attempt, *msg[_ATTEMPT + 1:]))
