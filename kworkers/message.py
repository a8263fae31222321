"""The record a handler sees: kworkers' own immutable value, so client types never leak.

A ``NamedTuple`` rather than a frozen dataclass on purpose: one is built per fetched record on
the hot path, and a tuple is several times cheaper to build than a frozen dataclass.
"""

from __future__ import annotations

from typing import NamedTuple

Headers = tuple[tuple[str, bytes], ...]


class Message(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    timestamp_ms: int | None = None
    #: 1 on first delivery, +1 per retry tier hop; 1 again after a redrive.
    attempt: int = 1

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
