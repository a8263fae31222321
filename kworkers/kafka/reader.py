"""Reading topics back without a consumer group: the DLQ, the redrive ledger, tier backlogs.

Why not a group: an operator tool must not move anybody's committed offsets, must see every
partition at once, and must stop at a known end. So a reader ``assign()``s the partitions it
wants, starting where it is told, and stops at the end it saw when it started (the high
watermark; for ``read_committed`` the last stable offset), never waiting for more.

``isolation.level`` is ``read_committed`` like kworkers' workers: a redrive replay whose
transaction aborted is invisible here exactly as it is to them.

This is an adapter module: it imports confluent-kafka. Broker trouble comes out as
``KafkaUnreachable`` or ``TopicNotFound`` (both ``ConfigError``: the operator named a broker or
a topic that is not there), with one line of text an operator can act on.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from kworkers.errors import ConfigError, KworkersError
from kworkers.kafka.clients import CONNECT_TIMEOUT, reader, require_topic, unreachable
from kworkers.kafka.settings import ClientSettings, ReadAhead, as_client
from kworkers.message import Headers, Message

#: records per chunk of a ``stream`` (and per ``consume`` of any read)
CHUNK = 500
#: what librdkafka may fetch ahead of a ``stream``: with one chunk in hand, the memory a read
#: of a topic of any size takes (a thousand records a partition, 8 MiB of values in all)
STREAM_READ_AHEAD = ReadAhead(records=1_000, kbytes=8_192)


class ReadTimeout(KworkersError):
    """A partition did not reach the end it was read to in time."""


def to_message(m: Any) -> Message:
    """A client record as kworkers' ``Message`` (a null header value becomes b"")."""
    raw = m.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    headers: Headers = tuple(
        (str(k), v if isinstance(v, bytes) else (b"" if v is None else str(v).encode()))
        for k, v in pairs
    )
    ts_type, ts = m.timestamp()
    return Message(m.topic() or "", m.partition() or 0, m.offset() or 0, m.key(), m.value(),
                   headers, ts if ts_type else None)


@dataclass
class Scan:
    """What a ``scan`` read: the records in partition/offset order, and where it stopped.

    ``ends`` is the end each partition was read to; ``truncated`` names the partitions where
    ``limit`` stopped the read before that end.
    """

    messages: list[Message] = field(default_factory=list)
    ends: dict[int, int] = field(default_factory=dict)
    truncated: set[int] = field(default_factory=set)


def scan(
    client: ClientSettings | str,
    topic: str,
    *,
    start: Mapping[int, int] | None = None,
    partitions: Collection[int] | None = None,
    limit: int | None = None,
    timeout: float = 60.0,
) -> Scan:
    """Every committed record of ``topic`` from ``start`` (default: the beginning) to the end.

    The end of each partition is fixed when the scan starts, so a busy topic still yields a
    finite read. ``limit`` caps the records read per partition (``truncated`` says where it
    did). Nothing is committed and no group is joined. Everything read is held at once: for
    a topic of any size, ``stream`` it instead.
    """
    settings = as_client(client)
    n = require_topic(settings, topic)
    wanted = sorted(range(n) if partitions is None else partitions)
    for p in wanted:
        if not 0 <= p < n:
            raise ConfigError(f"topic {topic!r} has partitions 0..{n - 1}, not {p}")
    c = reader(settings)
    out = Scan()
    try:
        assign: list[TopicPartition] = []
        for p in wanted:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=CONNECT_TIMEOUT)
            first = lo if start is None or p not in start else max(lo, start[p])
            out.ends[p] = hi
            if first < hi and (limit is None or limit > 0):
                assign.append(TopicPartition(topic, p, first if first > lo else OFFSET_BEGINNING))
        if not assign:
            return out
        for chunk in _read(c, topic, assign, out.ends, limit, out.truncated, timeout,
                           idle=False):
            out.messages.extend(chunk)
    except KafkaException as exc:
        raise unreachable(settings, exc) from None
    finally:
        c.close()
    out.messages.sort(key=lambda m: (m.partition, m.offset))
    return out


def watermarks(client: ClientSettings | str, topic: str) -> dict[int, tuple[int, int]]:
    """``(low, high)`` of each partition of ``topic`` now: the span a read started now covers
    (for ``read_committed`` the high end is the last stable offset). ``TopicNotFound`` when
    there is no such topic."""
    settings = as_client(client)
    n = require_topic(settings, topic)
    c = reader(settings)
    out: dict[int, tuple[int, int]] = {}
    try:
        for p in range(n):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=CONNECT_TIMEOUT)
            out[p] = (lo, hi)
        return out
    except KafkaException as exc:
        raise unreachable(settings, exc) from None
    finally:
        c.close()


def stream(client: ClientSettings | str, topic: str, spans: Mapping[int, tuple[int, int]], *,
           idle_timeout: float = 60.0) -> Iterator[list[Message]]:
    """The committed records of ``topic`` in ``spans`` (``partition: (start, end)``, the end
    pinned by the caller, e.g. from ``watermarks``), in chunks as they are read: each
    partition in offset order, the partitions interleaved.

    Why chunks and not ``scan``: a DLQ or a ledger can hold millions of records, and a tool
    that reads one to act on each record needs none of them after it acted. Held at once:
    the chunk in hand (at most ``CHUNK`` records) and what librdkafka fetched ahead
    (``STREAM_READ_AHEAD``: records a partition, and one fetch), whatever the topic's size.
    ``ReadTimeout`` when no record arrives for ``idle_timeout`` seconds before every partition
    reached its end (a read of any length still ends, but is never cut short for being long).
    """
    settings = as_client(client)
    ends = {p: hi for p, (_lo, hi) in spans.items()}
    assign = [TopicPartition(topic, p, lo) for p, (lo, hi) in sorted(spans.items()) if lo < hi]
    if not assign:
        return
    c = reader(settings, read_ahead=STREAM_READ_AHEAD)
    try:
        yield from _read(c, topic, assign, ends, None, set(), idle_timeout, idle=True)
    except KafkaException as exc:
        raise unreachable(settings, exc) from None
    finally:
        c.close()


def _read(c: Consumer, topic: str, assign: list[TopicPartition], ends: Mapping[int, int],
          limit: int | None, truncated: set[int], timeout: float, *,
          idle: bool) -> Iterator[list[Message]]:
    """The records of ``assign`` up to ``ends``, a chunk per ``consume``. ``timeout`` bounds
    the whole read, or (``idle``) the wait for the next record."""
    c.assign(assign)
    pending = {tp.partition for tp in assign}
    counts = dict.fromkeys(pending, 0)
    deadline = time.monotonic() + timeout
    while pending:
        if time.monotonic() > deadline:
            raise ReadTimeout(f"reading {topic} partitions {sorted(pending)} did not reach the "
                              f"end within {timeout:.0f}s"
                              + (" of the last record read" if idle else ""))
        chunk: list[Message] = []
        for m in c.consume(CHUNK, 0.5):
            p = m.partition() or 0
            if p not in pending:
                continue
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    # for read_committed the end is the last stable offset: an open
                    # transaction's records are not part of what we read
                    pending.discard(p)
                elif err.fatal():
                    raise KafkaException(err)
                continue
            offset = m.offset() or 0
            if offset >= ends[p]:
                pending.discard(p)
                continue
            chunk.append(to_message(m))
            counts[p] += 1
            if offset >= ends[p] - 1:
                pending.discard(p)
            elif limit is not None and counts[p] >= limit:
                truncated.add(p)
                pending.discard(p)
        done = [TopicPartition(topic, p) for p in counts if p not in pending]
        if done:
            c.pause(done)
        if chunk:
            yield chunk
            if idle:  # from now: the time the caller spent on the chunk is not idle
                deadline = time.monotonic() + timeout


def read_record(client: ClientSettings | str, topic: str, partition: int,
                offset: int) -> Message:
    """The one record at ``topic``/``partition``@``offset``; ``ConfigError`` when none is."""
    if offset < 0:
        raise ConfigError(f"offset must be >= 0, got {offset}")
    got = scan(client, topic, start={partition: offset}, partitions=[partition], limit=1)
    end = got.ends.get(partition, 0)
    if got.messages and got.messages[0].offset == offset:
        return got.messages[0]
    if offset >= end:
        raise ConfigError(f"no record at {topic}/{partition}@{offset}: the partition ends at "
                          f"{end}")
    raise ConfigError(f"no record at {topic}/{partition}@{offset} (the partition ends at {end}"
                      "; compacted, deleted, or a transaction marker)")
