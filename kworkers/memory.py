"""What a worker may hold in memory, in bytes: the one bound, the client sizes chosen with it,
and the worst case of a worker process as one formula (issue #45).

Why bytes: every other bound counts records (``max_in_flight``, the timer heap, the hand-off
limit), and a record of 500 KB costs what 1,000 small ones do. A worker of 500 KB documents
with the record bounds alone held a 1.5 GB topic (the issue's run), where a pod has 1-2 GiB.
So each poll loop holds at most ``max_in_flight_bytes`` of records fetched and not completed
(``consumer.backpressure``: shares per partition, the loop-wide stop), the tier heap's records
among them (they are fetched and not completed), a batch handler's batches too (cut from the
same lanes), and its hand-offs and outputs wait for room once ``hand_off_bytes`` of them are
unacknowledged (``consumer.handoff``).

What a record costs, counted where it is fetched (``record_sizes``): its key and value, each
header's name and value plus ``HEADER_COST``, and ``RECORD_COST`` for what every record costs
beyond them (the ``Message`` tuple, its offset, timestamp and topic, its lane and tracker
entries: measured 390 B for a record without headers, 2026-12-04). Summed with ``len`` in C,
not walked in Python: the hot path pays about one ``len`` per key and value.

librdkafka keeps its own read-ahead, beyond the worker's count: per consumer up to
``queued.max.messages.kbytes`` queued, overshot by one fetch (``fetch.max.bytes``) per broker
it fetches from. kworkers sets the three fetch sizes from the bound (``FetchSizes``: a
sixteenth of it queued, fetches of a thirty-second, at most librdkafka's 1 MiB a partition),
unless ``consumer_config`` sets them, so the worst case is one formula (``MemoryBound``):

    idle + busy + loops x (max_in_flight_bytes + 2 x (queue + brokers x fetch) + hand-offs)

per loop: its records in flight; librdkafka's read-ahead, twice (what one poll moves out of
it, past the bound, is read ahead again); its unacknowledged hand-offs' copies in the
producer. ``deploy render`` sets the container's memory from it; a worker logs at start when
its container's limit is lower (``cgroup_limit``).

Pure: no client library; ``kafka.settings`` applies ``FetchSizes``, ``WorkerConfig``
feeds ``MemoryBound`` its numbers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import add, itemgetter, length_hint
from pathlib import Path
from typing import Annotated

from kworkers.errors import ConfigError
from kworkers.message import Headers, Message

Bytes = Annotated[int, "bytes"]
"""A size in bytes: settings read it from ``64MiB``, ``256MB``, ``1GiB``, ``512KiB`` or a
number."""

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

#: what one poll loop may hold by default: with librdkafka sized from it and three brokers, a
#: worker's two loops stay under ~300 MiB in all (``MemoryBound``), a 384 MiB pod
DEFAULT_IN_FLIGHT_BYTES = 64 * MiB
#: what a record costs beyond its key, value and headers (measured 390 B without headers)
RECORD_COST = 512
#: what a header costs beyond its name and value (its tuple, str and bytes objects)
HEADER_COST = 160
#: a worker process at rest beyond its application's own imports: the interpreter, kworkers,
#: confluent-kafka, the clients' threads (measured 57-59 MB with a store, 2026-12-03)
IDLE = 96 * MiB
#: a busy worker's working memory whatever it holds (the clients' buffers, the store's and
#: the runners'; about 6 MB measured, docs/RELIABILITY.md)
BUSY = 8 * MiB
#: brokers a consumer fetches from, where the number is not given (a small cluster's)
DEFAULT_BROKERS = 3
#: librdkafka's ``message.max.bytes`` default; ``fetch.max.bytes`` may not be below it
MESSAGE_MAX_BYTES = 1_000_000
#: librdkafka's ``max.partition.fetch.bytes`` default (1 MiB)
PARTITION_FETCH_BYTES = 1_048_576
#: the largest values librdkafka takes for the queue (KiB) and a fetch
_MAX_QUEUE_KBYTES = 2_097_151
_MAX_FETCH = 2_147_483_135

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(B|KB|MB|GB|KiB|MiB|GiB|K|M|G)?\s*$", re.I)
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "k": KiB, "kib": KiB,
          "m": MiB, "mib": MiB, "g": GiB, "gib": GiB}


def parse_bytes(value: object, what: str = "size") -> int:
    """Bytes from ``1048576``, ``"512KiB"``, ``"64MiB"``, ``"256MB"``, ``"1GiB"`` (``K``, ``M``,
    ``G`` are binary, as Kubernetes' ``Ki``, ``Mi``, ``Gi``); a whole number >= 1."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a size such as 64MiB, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = _SIZE.match(value)
        if m is None:
            raise ConfigError(f"{what}: expected a size such as 64MiB, 256MB or 1GiB, got "
                              f"{value!r}")
        n = int(float(m[1]) * _UNITS[(m[2] or "").lower()])
    else:
        raise ConfigError(f"{what}: expected a size such as 64MiB, got {value!r}")
    if n < 1:
        raise ConfigError(f"{what}: must be at least 1 byte, got {value!r}")
    return n


def show_bytes(n: int) -> str:
    """``67108864`` -> ``"64MiB"``: the largest binary unit that divides it, as a person (and
    ``parse_bytes``) reads it."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def hand_off_bytes(in_flight_bytes: int) -> int:
    """What a loop's hand-offs and outputs may hold unacknowledged in the producer: an eighth
    of its bound (their records are among its bound already; this is the producer's copy).
    At least one waits whatever its size, so a record larger than this is still handed off."""
    return max(1, in_flight_bytes // 8)


# ------------------------------------------------------------------ what a record costs

_KEY, _VALUE, _HEADERS = itemgetter(3), itemgetter(4), itemgetter(5)


def header_bytes(headers: Headers) -> int:
    """Headers' names and values, and ``HEADER_COST`` each."""
    if not headers:
        return 0
    return sum(map(len, chain.from_iterable(headers))) + HEADER_COST * len(headers)


def message_bytes(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    """One record's key, value and headers, as ``record_sizes`` counts them."""
    return (len(key) if key else 0) + (len(value) if value else 0) + header_bytes(headers)


def record_sizes(records: Sequence[Message]) -> Iterable[int]:
    """Each record's key and value bytes, and its headers' (``HEADER_COST`` each beyond name
    and value), in order; ``RECORD_COST`` is added per record where the window is read
    (``PartitionState.held_bytes``), not here. In C but for records with headers."""
    sizes: Iterable[int] = map(add, map(length_hint, map(_VALUE, records)),
                               map(length_hint, map(_KEY, records)))
    if any(map(_HEADERS, records)):
        sizes = map(add, sizes, map(header_bytes, map(_HEADERS, records)))
    return sizes


# ------------------------------------------------------------------ librdkafka's share


@dataclass(frozen=True, slots=True)
class FetchSizes:
    """The consumer's read-ahead, chosen with the bound: ``queued.max.messages.kbytes`` (the
    whole consumer queue), ``fetch.max.bytes`` (one fetch, per broker), and
    ``max.partition.fetch.bytes`` (one partition in a fetch). A record larger than either
    fetch size still comes (alone: Kafka returns the first batch of a fetch whole), and
    ``receive.message.max.bytes`` is left at librdkafka's 100 MB so it can."""

    queue_kbytes: int
    fetch_bytes: int
    partition_bytes: int

    @classmethod
    def of(cls, in_flight_bytes: int, message_max_bytes: int = MESSAGE_MAX_BYTES
           ) -> FetchSizes:
        """A sixteenth of the bound queued, fetches of a thirty-second (librdkafka refuses a
        ``fetch.max.bytes`` below ``message.max.bytes``), partitions of at most 1 MiB."""
        fetch = min(max(in_flight_bytes // 32, message_max_bytes), _MAX_FETCH)
        return cls(min(max(1, in_flight_bytes // 16 // KiB), _MAX_QUEUE_KBYTES), fetch,
                   min(PARTITION_FETCH_BYTES, fetch))

    def properties(self) -> dict[str, int]:
        return {"queued.max.messages.kbytes": self.queue_kbytes,
                "fetch.max.bytes": self.fetch_bytes,
                "max.partition.fetch.bytes": self.partition_bytes}

    def read_ahead(self, brokers: int) -> int:
        """What librdkafka may hold for one consumer: its queue, overshot by one fetch from
        each broker (each broker's fetch is decided on the queue before any arrives)."""
        return self.queue_kbytes * KiB + brokers * self.fetch_bytes


# ------------------------------------------------------------------ the formula


@dataclass(frozen=True, slots=True)
class MemoryBound:
    """A worker process's worst case, term by term (bytes): see the module doc."""

    in_flight_bytes: int
    hand_off_bytes: int
    fetch: FetchSizes
    brokers: int = DEFAULT_BROKERS
    #: poll loops: a worker runs two (its group's, and the retry tiers')
    loops: int = 2
    idle: int = IDLE
    busy: int = BUSY

    @property
    def read_ahead(self) -> int:
        return self.fetch.read_ahead(self.brokers)

    @property
    def per_loop(self) -> int:
        """One loop: its records (the bound and one poll past it, a poll being at most the
        read-ahead), librdkafka's read-ahead refilled meanwhile, its hand-offs' copies."""
        return self.in_flight_bytes + 2 * self.read_ahead + self.hand_off_bytes

    @property
    def total(self) -> int:
        return self.idle + self.busy + self.loops * self.per_loop

    def describe(self) -> str:
        """The formula with this worker's numbers, for a log line or a manifest's comment."""
        return (f"{show_mib(self.total)} = idle {show_mib(self.idle)} + busy "
                f"{show_mib(self.busy)} + {self.loops} loops x ({show_mib(self.in_flight_bytes)}"
                f" in flight + 2 x read-ahead {show_mib(self.read_ahead)} (queue "
                f"{self.fetch.queue_kbytes} KiB + {self.brokers} brokers x fetch "
                f"{show_mib(self.fetch.fetch_bytes)}) + hand-offs "
                f"{show_mib(self.hand_off_bytes)})")


def show_mib(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n >= 10 * MiB else f"{n / MiB:.1f} MiB"


def kubernetes_quantity(n: int) -> str:
    """A memory quantity in whole MiB, rounded up (``300Mi``)."""
    return f"{-(-n // MiB)}Mi"


def over_limit(bound: MemoryBound, limit: int | None) -> str | None:
    """Why a worker with ``bound`` may be killed by its container's memory ``limit`` (None:
    no limit, or the bound fits): one line for the log at start, naming what to change."""
    if limit is None or bound.total <= limit:
        return None
    return (f"this worker may use up to {show_mib(bound.total)} of memory at worst "
            f"({bound.describe()}), more than its container's limit of {show_mib(limit)}: "
            f"under a backlog of large records it may be OOM-killed; lower "
            f"max_in_flight_bytes (now {show_bytes(bound.in_flight_bytes)}) or raise the limit "
            "(docs/CONFIG.md, the worker's memory)")


#: cgroup v2's limit of this process's container, then cgroup v1's
CGROUP_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
#: cgroup v1 writes "no limit" as a number near 2**63
_NO_LIMIT = 1 << 60


def cgroup_limit(files: Iterable[str | Path] = CGROUP_FILES) -> int | None:
    """The memory limit of the container this process runs in, or None (none set, or not
    readable). Read, never acted on silently: a pool's processes (``--processes``) share one
    limit, which one process cannot divide by a count it does not know, so a worker says when
    its bound exceeds the limit (``Worker``'s start) rather than shrinking it."""
    for f in files:
        try:
            text = Path(f).read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            n = int(text)
        except ValueError:
            continue
        return n if 0 < n < _NO_LIMIT else None
    return None
