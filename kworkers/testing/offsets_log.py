"""A group's offset commits as the broker keeps them: its ``__consumer_offsets`` records, decoded.

Why: a committed position read back (``CommitSampler``) says what the coordinator answered at
one moment; the records in ``__consumer_offsets`` say every commit it wrote, in order, with the
time it wrote each, and whether a commit the sampler saw is still in the log after a broker's
hard restart (a commit acknowledged and never made durable would be missing there). A fault
test that sees committed work run again prints this history beside the workers' commit log::

    from kworkers.testing.offsets_log import offsets_history, render_history

    history = offsets_history(bs, group, topic)         # every commit of the group's topic
    print(render_history(history, partitions={3}))

Read with a client of its own (never a member of the group, nothing committed), from the
beginning of the one ``__consumer_offsets`` partition that holds the group, to its end. Only
the offset-commit records (key versions 0 and 1) are decoded; a commit deleted is a tombstone
(``position`` None). Values of versions 0-4 (Kafka 4.3 writes 3 or 4).
"""

from __future__ import annotations

import struct
import time
import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["OffsetCommitRecord", "coordinator_partition", "decode_commit", "offsets_history",
           "render_history"]

OFFSETS_TOPIC = "__consumer_offsets"


@dataclass(frozen=True)
class OffsetCommitRecord:
    """One offset commit the coordinator wrote for a group's partition."""

    group: str
    topic: str
    partition: int
    #: the committed position; None: a tombstone (the group's offset deleted)
    position: int | None
    #: the record's timestamp (s): when the coordinator appended it
    at: float
    #: where it sits in ``__consumer_offsets``
    log_partition: int
    log_offset: int
    leader_epoch: int | None = None
    #: the commit's own timestamp (ms) as the value says it (None for a tombstone)
    commit_ms: int | None = None


def _java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, 32-bit overflow)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def coordinator_partition(group: str, partitions: int) -> int:
    """The ``__consumer_offsets`` partition holding ``group``: Kafka's
    ``Utils.abs(groupId.hashCode()) % n``, where ``Utils.abs`` is ``Math.abs`` except that
    ``Integer.MIN_VALUE`` gives 0 (not a mask of the sign bit)."""
    h = _java_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.data, self.at)[0]
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take(">h")
        return self.raw(max(n, 0))

    def compact_string(self) -> str:
        n = self.uvarint() - 1
        return self.raw(max(n, 0))

    def raw(self, n: int) -> str:
        out = self.data[self.at:self.at + n].decode("utf-8", "replace")
        self.at += n
        return out

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            b = self.data[self.at]
            self.at += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7


def decode_commit(key: bytes | None, value: bytes | None
                  ) -> tuple[str, str, int, int | None, int | None, int | None] | None:
    """``(group, topic, partition, position, leader_epoch, commit_ms)`` of an offset commit
    record (position None: a tombstone); None for any other record of the topic."""
    if not key or len(key) < 2:
        return None
    k = _Reader(key)
    if k.take(">h") not in (0, 1):
        return None  # group metadata, consumer group records, ...
    group, topic, partition = k.string(), k.string(), k.take(">i")
    if value is None:
        return group, topic, partition, None, None, None
    v = _Reader(value)
    version = v.take(">h")
    position = v.take(">q")
    epoch = v.take(">i") if version >= 3 else None
    if version >= 4:
        v.compact_string()
    else:
        v.string()
    commit_ms = v.take(">q")
    return group, topic, partition, position, epoch, commit_ms


def offsets_history(bootstrap: str, group: str, topic: str | None = None,
                    timeout: float = 60.0) -> list[OffsetCommitRecord]:
    """Every offset commit of ``group`` (on ``topic``, if given) in ``__consumer_offsets``, in
    log order. Raises TimeoutError when the partition cannot be read to its end in time."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"kworkers-offsets-"
                  f"{uuid.uuid4().hex[:8]}", "enable.auto.commit": False, "log_level": 3,
                  "enable.partition.eof": True, "isolation.level": "read_uncommitted"})
    try:
        deadline = time.monotonic() + timeout
        while True:
            meta = c.list_topics(OFFSETS_TOPIC, timeout=10).topics.get(OFFSETS_TOPIC)
            if meta is not None and meta.error is None and meta.partitions:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{OFFSETS_TOPIC} has no metadata: {meta and meta.error}")
            time.sleep(0.5)
        part = coordinator_partition(group, len(meta.partitions))
        tp = TopicPartition(OFFSETS_TOPIC, part)
        _low, high = c.get_watermark_offsets(tp, timeout=10, cached=False)
        out: list[OffsetCommitRecord] = []
        if high <= 0:
            return out
        c.assign([TopicPartition(OFFSETS_TOPIC, part, OFFSET_BEGINNING)])
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{OFFSETS_TOPIC}[{part}] not read to {high} in {timeout}s")
            m = c.poll(0.5)
            if m is None:
                continue
            err = m.error()
            at = m.offset()
            if err is not None or at is None:
                if err is not None and err.code() == KafkaError._PARTITION_EOF and \
                        at is not None and at >= high:
                    return out
                continue
            got = decode_commit(m.key(), m.value())
            if got is not None and got[0] == group and (topic is None or got[1] == topic):
                _kind, ts = m.timestamp()
                out.append(OffsetCommitRecord(got[0], got[1], got[2], got[3], ts / 1000.0,
                                              part, int(at), got[4], got[5]))
            if at + 1 >= high:
                return out
    finally:
        c.close()


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}"


def render_history(records: Iterable[OffsetCommitRecord],
                   partitions: Collection[int] | None = None) -> str:
    """One line per change of a partition's committed position (repeats of one position
    counted, not listed), in log order: the time (UTC), the partition and the position."""
    lines: list[str] = []
    last: dict[int, tuple[int | None, int]] = {}
    for r in records:
        if partitions is not None and r.partition not in partitions:
            continue
        prev = last.get(r.partition)
        if prev is not None and prev[0] == r.position:
            last[r.partition] = (r.position, prev[1] + 1)
            continue
        if prev is not None and prev[1]:
            lines.append(f"  (partition {r.partition}: {prev[1]} more commits of {prev[0]})")
        last[r.partition] = (r.position, 0)
        what = "tombstone" if r.position is None else str(r.position)
        down = (" BACKWARDS" if prev is not None and prev[0] is not None and
                (r.position is None or r.position < prev[0]) else "")
        lines.append(f"{_clock(r.at)} {r.topic}[{r.partition}] -> {what}{down} "
                     f"(@{r.log_partition}:{r.log_offset}, epoch {r.leader_epoch})")
    for part, (pos, n) in sorted(last.items()):
        if n:
            lines.append(f"  (partition {part}: {n} more commits of {pos} at the end)")
    return "\n".join(lines)
