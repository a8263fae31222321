"""The record a handler sees: kworkers' own frozen value, so client types never leak."""

from __future__ import annotations

from dataclasses import dataclass, field

Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class Message:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    timestamp_ms: int | None = None
    #: 1 on first delivery, +1 per retry tier hop; 1 again after a redrive.
    attempt: int = 1
    _index: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name`` (Kafka allows repeats; the last one wins)."""
        if not self._index and self.headers:
            for k, v in self.headers:
                self._index[k] = v
        return self._index.get(name)

    def header_str(self, name: str) -> str | None:
        raw = self.header(name)
        return None if raw is None else raw.decode("utf-8", "replace")
