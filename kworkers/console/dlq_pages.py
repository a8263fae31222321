"""Paging through a DLQ without reading it whole: each request reads a bounded slice.

A DLQ can hold millions of records, and a page of fifty must not read them all. A page
request reads, from a cursor (the next offset per DLQ partition), at most ``bound // P``
records per partition (P partitions, so at most ``bound`` in all), filters them, shows the
first ``page_size`` matches in (partition, offset) order and hands back the cursor to go on
from. The page says what it read (the scan bound per request), so "no match" on a page never
passes for "no match in the DLQ": the operator sees how far the read got and follows "next".

The cursor never skips a record: per partition it moves to the first match that was not shown,
else past everything read (to the end the read saw, when it reached it). A record before the
cursor was therefore either shown or did not match (``cut`` is pure and property-tested).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kworkers.console.dlq_filter import ConsoleFilter
from kworkers.dlq.record import DeadLetter
from kworkers.errors import ConfigError
from kworkers.kafka.clients import require_topic
from kworkers.kafka.reader import scan
from kworkers.kafka.settings import ClientSettings
from kworkers.message import Message
from kworkers.retry_tiers.headers import HeaderError

_CURSOR = re.compile(r"^[0-9]{1,9}-[0-9]{1,19}(?:\.[0-9]{1,9}-[0-9]{1,19})*$")


@dataclass(frozen=True)
class Row:
    """A DLQ record as the table shows it: a dead letter, or a record that is not one."""

    message: Message
    dead: DeadLetter | None
    problem: str | None = None


def as_row(msg: Message) -> Row:
    try:
        return Row(msg, DeadLetter.from_message(msg))
    except HeaderError as exc:
        return Row(msg, None, str(exc))


def row_matches(row: Row, flt: ConsoleFilter) -> bool:
    return flt.matches(row.dead) if row.dead is not None else flt.matches_unreadable(
        row.message)


def cursor_text(positions: Mapping[int, int]) -> str:
    """``{0: 12, 1: 0}`` -> ``0-12.1-0`` (safe in a URL as it is)."""
    return ".".join(f"{p}-{o}" for p, o in sorted(positions.items()))


def parse_cursor(text: str, partitions: int) -> dict[int, int]:
    if not _CURSOR.match(text):
        raise ConfigError(f"page cursor: expected P-OFFSET.P-OFFSET..., got {text[:60]!r}")
    out = {int(p): int(o) for p, o in (part.split("-") for part in text.split("."))}
    bad = sorted(p for p in out if p >= partitions)
    if bad:
        raise ConfigError(f"page cursor: the DLQ has partitions 0..{partitions - 1}, not {bad}")
    return out


@dataclass(frozen=True)
class Page:
    """One page: its rows, what was read to find them, and where the next page starts.

    ``read``: records read by this request; ``bound``: the most it could read
    (``per_partition`` x partitions); ``ranges``: per partition, the offsets read
    ``[from, to)``; ``next`` None when the read reached the end of every partition with
    nothing left to show.
    """

    rows: list[Row]
    start: dict[int, int]
    next: dict[int, int] | None
    read: int
    per_partition: int
    ends: dict[int, int]
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def bound(self) -> int:
        return self.per_partition * len(self.start)


def cut(read: Sequence[Message], start: Mapping[int, int], ends: Mapping[int, int],
        truncated: Iterable[int], flt: ConsoleFilter, page_size: int
        ) -> tuple[list[Row], dict[int, int]]:
    """(the rows to show, the next cursor) from what one bounded read returned.

    ``read`` holds, per partition, the records from ``start`` on; a partition in ``truncated``
    stopped at the per-partition bound, the others reached ``ends``.
    """
    stopped = set(truncated)
    rows = [r for r in (as_row(m) for m in sorted(read, key=lambda m: (m.partition, m.offset)))
            if row_matches(r, flt)]
    nxt: dict[int, int] = {}
    last: dict[int, int] = {}
    for m in read:
        last[m.partition] = max(last.get(m.partition, -1), m.offset)
    for p, s in start.items():
        if p in stopped:
            nxt[p] = last.get(p, s - 1) + 1
        else:
            nxt[p] = max(s, ends.get(p, s))
    for r in rows[page_size:]:  # matches that did not fit: the next page starts at them
        p = r.message.partition
        nxt[p] = min(nxt[p], r.message.offset)
    return rows[:page_size], nxt


def read_page(client: ClientSettings, dlq: str, flt: ConsoleFilter, cursor: str | None,
              page_size: int, bound: int) -> Page:
    """One page of ``dlq`` from ``cursor`` (None: the beginning), reading at most ``bound``."""
    n = require_topic(client, dlq, hint="is the DLQ name <topic>.dlq?")
    start = parse_cursor(cursor, n) if cursor else dict.fromkeys(range(n), 0)
    per = max(1, bound // max(1, len(start)))
    got = scan(client, dlq, start=start, partitions=sorted(start), limit=per)
    rows, nxt = cut(got.messages, start, got.ends, got.truncated, flt, page_size)
    ranges: dict[int, tuple[int, int]] = {}
    for m in got.messages:
        lo, hi = ranges.get(m.partition, (m.offset, m.offset + 1))
        ranges[m.partition] = (min(lo, m.offset), max(hi, m.offset + 1))
    done = all(nxt[p] >= got.ends.get(p, 0) for p in nxt)
    return Page(rows, start, None if done else nxt, len(got.messages), per, dict(got.ends),
                ranges)
