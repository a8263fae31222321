"""The checker: what really happened, judged from data read back, never from the code's counters.

Jepsen's and Kafka's OffsetValidationTest's questions, answered from three independent sources:

- the **log**: what a fresh ``read_committed`` consumer reads from each partition's log start to
  its end, for *every* partition of the topic (``read_log``). Offsets that hold transaction
  control records (markers of the redrive's or the hand-off's transactions) never reach a
  consumer: they are gaps, not losses, so the checker only ever asks about offsets that exist;
- the **ledger** (``kworkers.testing.ledger``): one row per application of an effect, one row
  per delivery (pid and time included), append-only;
- the group's **committed positions**, sampled by the test (``committed``), and **faults**: each
  kill, pause or partition the test caused, with the committed positions at that moment.

The API (stable; other suites reuse it)::

    from kworkers.testing.checker import Fault, FaultLog, check, committed, read_log

    faults = FaultLog(lambda: committed(bs, group, topic))
    ...; victim.kill(); faults.record("SIGKILL w1", victim_pid=pid)   # right after the kill
    report = check(ledger, log=read_log(bs, topic), commits=[committed(bs, group, topic)],
                   faults=faults.faults)
    assert report.ok, report.summary()

``check`` reports, and ``ok`` fails on, each of:

- ``missing``: a key (every key in the log, or ``expected``) whose effect was never applied;
- ``duplicates``: ``{key: n}`` for every key applied ``n > 1`` times;
- ``unexpected``: effects whose key is not expected; ``not_in_log``: expected keys never produced;
- ``skipped``: ``(partition, offset)`` of a record in the log below the final committed position
  that no handler was ever called for (a poll skip: committed past unhandled work);
- ``non_monotonic``: a commit sample that went backwards;
- ``unexplained``: a redelivery of a source record that no fault accounts for: none had
  happened yet, or one that happened between its two deliveries had the record committed
  already (its floor for that partition was past the offset): committed work done again;
- ``not_redelivered``: a record a killed process had been given, at or beyond the commit floor
  at the moment of the kill, that no other process was given afterwards (a kill mid-flight must
  cause a redelivery: otherwise that work went nowhere).

``redeliveries`` (allowed, counted) and ``applications`` are reported for the figures.

Keys: by default a record's key is its activity's idempotency key (``kw-workflow-id`` /
``kw-activity-id`` headers) or, without those, its value as text (``record_key``); pass
``key_of`` for anything else. Deliveries in the ledger must use the same key.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, NamedTuple

from kworkers.envelope.envelope import ids_from_headers
from kworkers.message import Headers
from kworkers.testing.ledger import Delivery, Ledger

__all__ = [
    "Fault",
    "FaultLog",
    "Log",
    "LogRecord",
    "Report",
    "check",
    "committed",
    "read_log",
    "record_key",
]


class LogRecord(NamedTuple):
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass(frozen=True)
class Log:
    """A topic as a fresh read_committed consumer saw it, every partition from its start."""

    topic: str
    records: Mapping[int, Sequence[LogRecord]]
    #: per partition: (log start offset, high watermark) when it was read
    bounds: Mapping[int, tuple[int, int]]

    def __iter__(self) -> Any:
        for part in sorted(self.records):
            yield from self.records[part]

    def __len__(self) -> int:
        return sum(len(r) for r in self.records.values())


def record_key(headers: Headers, value: bytes | None) -> str:
    """An activity record's idempotency key, else the value as text."""
    ids = ids_from_headers(headers)
    if ids is not None:
        return f"{ids[0]}/{ids[1]}"
    return (value or b"").decode("utf-8", "replace")


def _key_of_record(r: LogRecord) -> str:
    return record_key(r.headers, r.value)


def _consumer(bootstrap: str, extra: Mapping[str, Any] | None = None, **conf: Any) -> Any:
    from confluent_kafka import Consumer  # adapter import, kept local

    return Consumer({"bootstrap.servers": bootstrap, "log_level": 3, **conf, **(extra or {})})


def read_log(bootstrap: str, topic: str, *, timeout: float = 60.0,
             config: Mapping[str, Any] | None = None) -> Log:
    """Everything committed in ``topic``, each partition read from its log start to its end.

    Raises TimeoutError when a partition cannot be read to its high watermark in time (an open
    transaction holds the last stable offset back): a partial read would hide losses.
    """
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

    c = _consumer(bootstrap, config, **{
        "group.id": f"kworkers-checker-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "isolation.level": "read_committed", "enable.partition.eof": True,
        "auto.offset.reset": "earliest"})
    try:
        meta = c.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            raise ValueError(f"topic {topic} cannot be read: {getattr(meta, 'error', None)}")
        parts = sorted(meta.partitions)
        bounds = {p: tuple(int(x) for x in c.get_watermark_offsets(
            TopicPartition(topic, p), timeout=10, cached=False)) for p in parts}
        records: dict[int, list[LogRecord]] = {p: [] for p in parts}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        left = {p for p in parts if bounds[p][1] > bounds[p][0]}
        deadline = time.monotonic() + timeout
        while left:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {sorted(left)} not read to their end "
                                   f"in {timeout:.0f}s (an open transaction?)")
            for m in c.consume(1000, 0.5):
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(err)
                    if m.offset() >= bounds[m.partition()][1]:
                        left.discard(m.partition())
                    continue
                p = m.partition()
                h = m.headers() or []
                hs: Headers = tuple(
                    (str(k), v if isinstance(v, bytes) else b"") for k, v in
                    (h.items() if isinstance(h, dict) else h))
                records[p].append(LogRecord(p, m.offset(), m.key(), m.value(), hs))
            for p in list(left):
                pos = c.position([TopicPartition(topic, p)])[0].offset
                if pos >= bounds[p][1]:
                    left.discard(p)
        return Log(topic, records, {p: (b[0], b[1]) for p, b in bounds.items()})
    finally:
        c.close()


def committed(bootstrap: str, group: str, topic: str,
              config: Mapping[str, Any] | None = None, timeout: float = 60.0) -> dict[int, int]:
    """The group's committed position for every partition of ``topic`` (negative: none).

    Asks again (for up to ``timeout`` seconds) while the coordinator is moving or loading, as it
    does for a while after a broker restart."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    transient = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                 KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError._TIMED_OUT,
                 KafkaError._TRANSPORT, KafkaError._WAIT_COORD}
    c = _consumer(bootstrap, config, **{"group.id": group, "enable.auto.commit": False})
    deadline = time.monotonic() + timeout
    try:
        meta = c.list_topics(topic, timeout=10).topics[topic]
        tps = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
        while True:
            try:
                return {tp.partition: int(tp.offset) for tp in c.committed(tps, timeout=10)}
            except KafkaException as exc:
                err = exc.args[0]
                if time.monotonic() > deadline or not (
                        err.retriable() or err.code() in transient):
                    raise
                time.sleep(0.5)
    finally:
        c.close()


@dataclass(frozen=True)
class Fault:
    """Something the test did to the system, and the commit floor at that moment.

    ``floors``: the group's committed position per partition right then (negative: nothing
    committed, so every offset may be delivered again). ``victim_pid``: the process a kill
    ended, whose uncommitted work must be seen delivered again. ``sampled_at``: when the floors
    had been read back (None: at ``at``). Reading them takes time (seconds after a broker
    restart, while the coordinator loads), and a commit seen by the read may have been made by
    a redelivery inside that window, so the floors bind only deliveries after it.
    """

    at: float
    floors: Mapping[int, int]
    what: str
    victim_pid: int | None = None
    sampled_at: float | None = None

    @property
    def floors_known_at(self) -> float:
        return self.at if self.sampled_at is None else self.sampled_at


class FaultLog:
    """Faults as a test causes them; ``record`` right after each (it samples the floors)."""

    def __init__(self, floors: Callable[[], Mapping[int, int]]) -> None:
        self._floors = floors
        self.faults: list[Fault] = []

    def record(self, what: str, victim_pid: int | None = None) -> Fault:
        at = time.time()
        floors = dict(self._floors())
        fault = Fault(at, floors, what, victim_pid, sampled_at=time.time())
        self.faults.append(fault)
        return fault


@dataclass
class Report:
    expected: int
    applications: int
    missing: list[str] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)
    not_in_log: list[str] = field(default_factory=list)
    skipped: list[tuple[int, int]] = field(default_factory=list)
    non_monotonic: list[tuple[int, int, int]] = field(default_factory=list)
    unexplained: list[tuple[int, int]] = field(default_factory=list)
    not_redelivered: list[tuple[int, int, str]] = field(default_factory=list)
    redeliveries: int = 0
    faults: int = 0

    @property
    def dup(self) -> int:
        """Applications beyond the first, over all keys."""
        return sum(n - 1 for n in self.duplicates.values())

    @property
    def ok(self) -> bool:
        return not self.failures()

    def failures(self) -> list[str]:
        out = []
        for name in ("missing", "duplicates", "unexpected", "not_in_log", "skipped",
                     "non_monotonic", "unexplained", "not_redelivered"):
            found = getattr(self, name)
            if found:
                sample = list(found.items() if isinstance(found, dict) else found)[:5]
                out.append(f"{name}={len(found)} e.g. {sample}")
        return out

    def summary(self) -> str:
        figures = (f"expected={self.expected} applications={self.applications} "
                   f"missing={len(self.missing)} dup={self.dup} "
                   f"redeliveries={self.redeliveries} faults={self.faults}")
        bad = self.failures()
        return figures + ("; FAILED: " + "; ".join(bad) if bad else "; ok")


def check(
    ledger: Ledger,
    *,
    log: Log | None = None,
    expected: Iterable[str] | None = None,
    commits: Sequence[Mapping[int, int]] = (),
    faults: Sequence[Fault] = (),
    key_of: Callable[[LogRecord], str] = _key_of_record,
) -> Report:
    """Judges a run; see the module docstring for what each finding means.

    ``log``: the source topic as ``read_log`` returned it (needed for ``skipped``, ``not_in_log``
    and the redelivery checks; without it only the effect counts are judged). ``expected``:
    the keys that must be applied once each (default: every key in the log). ``commits``: the
    group's committed positions on the source topic in the order sampled, the final one last.
    """
    if log is None and expected is None:
        raise ValueError("check needs the log or the expected keys (or both)")
    applied = ledger.applications()
    log_keys = {key_of(r) for r in log} if log is not None else set()
    want = set(expected) if expected is not None else log_keys
    report = Report(expected=len(want), applications=sum(applied.values()),
                    faults=len(faults))
    report.missing = sorted(k for k in want if applied.get(k, 0) == 0)
    report.duplicates = {k: n for k, n in sorted(applied.items()) if n > 1}
    report.unexpected = sorted(set(applied) - want)
    if log is not None:
        report.not_in_log = sorted(want - log_keys)
    report.non_monotonic = _non_monotonic(commits)
    if log is None:
        return report
    by_offset: dict[tuple[int, int], list[Delivery]] = defaultdict(list)
    for d in ledger.deliveries():
        if d.topic == log.topic:
            by_offset[(d.partition, d.offset)].append(d)
    if commits:
        final = commits[-1]
        for part, records in sorted(log.records.items()):
            pos = final.get(part, -1)
            report.skipped += [(part, r.offset) for r in records
                               if r.offset < pos and (part, r.offset) not in by_offset]
    for (part, off), ds in sorted(by_offset.items()):
        report.redeliveries += len(ds) - 1
        for prev, nxt in pairwise(ds):
            if not _explained(part, off, prev.at, nxt.at, faults):
                report.unexplained.append((part, off))
    for f in faults:
        if f.victim_pid is None:
            continue
        for (part, off), ds in sorted(by_offset.items()):
            mine = [d for d in ds if d.pid == f.victim_pid and d.at <= f.at]
            if not mine or not _at_or_beyond(off, f.floors.get(part)):
                continue
            last = mine[-1].at
            if not any(d.pid != f.victim_pid and d.at > last for d in ds):
                report.not_redelivered.append((part, off, f.what))
    return report


def _explained(part: int, off: int, first: float, again: float,
               faults: Sequence[Fault]) -> bool:
    """A redelivery at ``again`` of a record first delivered at ``first`` is explained when a
    fault happened before it, and no fault in between had its commit floor past the record.

    Why not "a fault between the two deliveries": a fault's consequences outlast its moment (a
    restarted worker rejoins seconds later and its join revokes partitions from the others;
    after a broker restart members are expelled once the coordinator has loaded), so the first
    delivery may come after the fault that causes the second. The floors still bind: a record
    committed at any fault between its deliveries must never be delivered again."""
    if not any(f.at <= again for f in faults):
        return False
    return all(_at_or_beyond(off, f.floors.get(part)) for f in faults
               if first <= f.at and f.floors_known_at <= again)


def _at_or_beyond(offset: int, floor: int | None) -> bool:
    """Whether ``offset`` was uncommitted under ``floor`` (none committed: everything was)."""
    return floor is None or floor < 0 or offset >= floor


def _non_monotonic(commits: Sequence[Mapping[int, int]]) -> list[tuple[int, int, int]]:
    out = []
    last: dict[int, int] = {}
    for sample in commits:
        for part, pos in sample.items():
            if pos < 0:
                continue
            if part in last and pos < last[part]:
                out.append((part, last[part], pos))
            last[part] = max(pos, last.get(part, pos))
    return out
