"""The dead-letter filter the console's table and redrive share, read from a query string.

``ConsoleFilter`` *is* a ``RedriveFilter`` (error type, exact key, time window, DLQ offsets)
with what only the console asks for: the origin partition, a text search, an explicit
selection of records, and the end of the DLQ a plan saw. Being one, it goes straight into
``kworkers.dlq.redrive.redrive``: the console selects, the redrive (with its ledger and its
target rules) replays. Nothing is selected one way in the table and another way in the replay.

Why ``upto``: between the dry-run plan an operator reads and the confirmation, more records may
be dead-lettered. A plan carries, per DLQ partition, the end it read, and the redrive it
confirms replays nothing past it: what was shown is what is replayed.

Pure: no broker, no web stack.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kworkers.dlq.record import DeadLetter
from kworkers.dlq.redrive_plan import RedriveFilter
from kworkers.errors import ConfigError
from kworkers.message import Message

#: At most this many records in one selection (a form is not a bulk tool: use a filter).
MAX_SELECTION = 1_000
_COORD = re.compile(r"^([0-9]{1,9}):([0-9]{1,19})$")

Query = Mapping[str, Sequence[str]]


@dataclass(frozen=True)
class ConsoleFilter(RedriveFilter):
    """``RedriveFilter`` plus: ``origin_partition`` (the source partition it died on),
    ``text`` (case-insensitive, in the key, the value or the error message), ``records``
    (a selection of ``(dlq partition, offset)``) and ``upto`` (``(dlq partition, end)``:
    only offsets below the end; a partition not named has nothing selected)."""

    origin_partition: int | None = None
    text: str | None = None
    records: frozenset[tuple[int, int]] | None = None
    upto: tuple[tuple[int, int], ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.origin_partition is not None and self.origin_partition < 0:
            raise ConfigError(f"origin partition must be >= 0, got {self.origin_partition}")
        if self.records is not None and len(self.records) > MAX_SELECTION:
            raise ConfigError(f"at most {MAX_SELECTION} records can be selected; use a filter")

    def matches(self, d: DeadLetter) -> bool:
        return (
            super().matches(d)
            and (self.origin_partition is None or d.original_partition == self.origin_partition)
            and self._coordinates(d.dlq_partition, d.dlq_offset)
            and (self.text is None or self.text.lower() in _searchable(
                d.key, d.value, d.error_message))
        )

    def matches_unreadable(self, msg: Message) -> bool:
        """Whether a record that is not a kworkers dead letter shows in the table: only when
        nothing asks about the failure (it has none), and the text matches. Never replayed."""
        about_failure = (self.error_type, self.since, self.until, self.origin_partition)
        return (
            all(c is None for c in about_failure)
            and (self.key is None or msg.key == self.key)
            and (self.min_offset is None or msg.offset >= self.min_offset)
            and (self.max_offset is None or msg.offset <= self.max_offset)
            and self._coordinates(msg.partition, msg.offset)
            and (self.text is None or self.text.lower() in _searchable(msg.key, msg.value, ""))
        )

    def _coordinates(self, partition: int, offset: int) -> bool:
        if self.records is not None and (partition, offset) not in self.records:
            return False
        if self.upto is not None:
            end = dict(self.upto).get(partition)
            return end is not None and offset < end
        return True

    def query(self) -> list[tuple[str, str]]:
        """This filter as query parameters (``parse_filter`` reads them back)."""
        out: list[tuple[str, str]] = []
        if self.error_type is not None:
            out.append(("error_type", self.error_type))
        if self.key is not None:
            out.append(("key", self.key.decode("utf-8", "replace")))
        if self.origin_partition is not None:
            out.append(("origin_partition", str(self.origin_partition)))
        if self.since is not None:
            out.append(("since", _iso(self.since)))
        if self.until is not None:
            out.append(("until", _iso(self.until)))
        if self.text is not None:
            out.append(("q", self.text))
        for p, o in sorted(self.records or ()):
            out.append(("sel", f"{p}:{o}"))
        if self.upto is not None:
            out.append(("upto", ",".join(f"{p}:{e}" for p, e in self.upto)))
        return out

    @property
    def narrows(self) -> bool:
        """Whether anything is filtered at all (an empty filter redrives the whole DLQ)."""
        return any(v is not None for v in (
            self.error_type, self.key, self.since, self.until, self.min_offset,
            self.max_offset, self.origin_partition, self.text, self.records))


def _searchable(key: bytes | None, value: bytes | None, message: str) -> str:
    parts = [b.decode("utf-8", "replace") for b in (key, value) if b is not None]
    return "\n".join([*parts, message]).lower()


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="seconds").replace(
        "+00:00", "Z")


def parse_time(text: str, name: str) -> float:
    """ISO-8601 (a browser's ``datetime-local`` too); a time without a zone is UTC."""
    try:
        t = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"{name}: expected a time such as 2025-01-31T14:00 (UTC), got "
                          f"{text[:40]!r}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.timestamp()


def parse_coordinate(text: str, what: str) -> tuple[int, int]:
    m = _COORD.match(text.strip())
    if m is None:
        raise ConfigError(f"{what}: expected PARTITION:OFFSET such as 0:42, got {text[:40]!r}")
    return int(m[1]), int(m[2])


def _one(query: Query, name: str) -> str | None:
    values = [v for v in query.get(name, ()) if v.strip()]
    if len(values) > 1:
        raise ConfigError(f"{name}: given {len(values)} times")
    return values[0].strip() if values else None


def _int(text: str | None, name: str) -> int | None:
    if text is None:
        return None
    if not text.isdigit() or len(text) > 19:
        raise ConfigError(f"{name}: expected a whole number >= 0, got {text[:40]!r}")
    return int(text)


def parse_filter(query: Query) -> ConsoleFilter:
    """A filter from a query string or form; blank fields are unset. ``ConfigError`` (one
    line, for an error page) on anything malformed."""
    since, until = _one(query, "since"), _one(query, "until")
    key = _one(query, "key")
    sel = [v for v in query.get("sel", ()) if v.strip()]
    upto = _one(query, "upto")
    return ConsoleFilter(
        error_type=_one(query, "error_type"),
        key=None if key is None else key.encode("utf-8"),
        since=None if since is None else parse_time(since, "since"),
        until=None if until is None else parse_time(until, "until"),
        min_offset=_int(_one(query, "min_offset"), "min_offset"),
        max_offset=_int(_one(query, "max_offset"), "max_offset"),
        origin_partition=_int(_one(query, "origin_partition"), "origin_partition"),
        text=_one(query, "q"),
        records=frozenset(parse_coordinate(v, "sel") for v in sel) if sel else None,
        upto=None if upto is None else tuple(sorted(
            parse_coordinate(v, "upto") for v in upto.split(",") if v.strip())),
    )
