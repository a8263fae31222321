"""The checker: what really happened, judged from data read back, never from the code's counters.

Jepsen's and Kafka's OffsetValidationTest's questions, answered from three independent sources:

- the **log**: what a fresh ``read_committed`` consumer reads from each partition's log start to
  its end, for *every* partition of the topic (``read_log``). Offsets that hold transaction
  control records (markers of the redrive's or the hand-off's transactions) never reach a
  consumer: they are gaps, not losses, so the checker only ever asks about offsets that exist;
- the **ledger** (``kworkers.testing.ledger``): one row per application of an effect, one row
  per delivery (pid and time included), append-only;
- the group's **committed positions**, read back by the test throughout the run
  (``CommitSampler``, ``kworkers.testing.commits``: each ``CommitSample`` timed), and
  **faults**: each kill, pause or partition the test caused, with the committed positions at
  that moment (read back right after it: those are timed samples too).

The API (stable; other suites reuse it)::

    from kworkers.testing.checker import (CommitSampler, Fault, FaultLog, check, committed,
                                          read_log)

    with CommitSampler(bs, group, topic) as commits:                  # reads every 0.25 s
        faults = FaultLog(commits.latest)    # or FaultLog(lambda: committed(bs, group, topic))
        ...; victim.kill(); faults.record("SIGKILL w1", victim_pid=pid)  # right after the kill
    report = check(ledger, log=read_log(bs, topic), commits=commits.samples,
                   faults=faults.faults)
    assert report.ok, report.summary()

``commits`` may still be plain ``{partition: position}`` mappings (the API before timed
samples): those are judged in the order given, for backwards commits and skips, never for
reruns (a mapping does not say when it was read).

``check`` reports, and ``ok`` fails on, each of:

- ``empty``: nothing to judge: the log (or ``expected``) holds no record, or no delivery of the
  log's topic was recorded (``allow_empty=True`` for a run that is empty on purpose);
- ``missing``: a key (every key in the log, or ``expected``) whose effect was never applied;
- ``duplicates``: ``{key: n}`` for every key applied ``n > 1`` times;
- ``unexpected``: effects whose key is not expected; ``not_in_log``: expected keys never produced;
- ``skipped``: ``(partition, offset)`` of a record in the log below the highest committed
  position read back that no handler was ever called for (a poll skip: committed past
  unhandled work);
- ``non_monotonic``: ``(partition, before, after)``: a commit sample lower than one read back
  before it (``after`` negative: the committed position disappeared);
- ``rerun_committed``: ``(partition, offset)`` of a delivery made after a reading showed the
  partition committed past the offset: committed work run again (or run only after it was
  committed past), whatever faults happened (the idempotent receiver may absorb its effect, the
  checker still sees it);
- ``unexplained``: a redelivery of a source record that no fault accounts for: none had
  happened yet, or one that happened between its two deliveries had the record committed
  already (its floor for that partition was past the offset);
- ``not_redelivered``: a record a killed process had been given, at or beyond the commit floor
  at the moment of the kill, that no other process was given afterwards (a kill mid-flight must
  cause a redelivery: otherwise that work went nowhere). The floor is the fault's own reading
  and every timed reading returned within the fault's ``settle_s``: a commit the victim sent
  just before it died may land after the reading right after the death (a loaded broker),
  and only the victim can commit its partitions until its session expires.

``redeliveries`` (allowed, counted) and ``applications`` are reported for the figures.

Keys: by default a record's key is its activity's idempotency key (``kw-workflow-id`` /
``kw-activity-id`` headers) or, without those, its value as text (``record_key``); pass
``key_of`` for anything else. Deliveries in the ledger must use the same key.
"""

from __future__ import annotations

import bisect
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, NamedTuple

from kworkers.envelope.envelope import ids_from_headers
from kworkers.message import Headers
from kworkers.testing.commits import CommitSample, CommitSampler, committed, sample_commits
from kworkers.testing.ledger import Delivery, Ledger

__all__ = [
    "CommitSample",
    "CommitSampler",
    "Fault",
    "FaultLog",
    "Log",
    "LogRecord",
    "Report",
    "check",
    "committed",
    "read_log",
    "record_key",
    "sample_commits",
]


class LogRecord(NamedTuple):
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    #: the broker record's timestamp (the producer's CreateTime, epoch ms); None if it has none
    timestamp_ms: int | None = None


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


def _settling_codes() -> frozenset[int]:
    from confluent_kafka import KafkaError

    return frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                      KafkaError._TIMED_OUT, KafkaError.LEADER_NOT_AVAILABLE,
                      KafkaError.NOT_LEADER_FOR_PARTITION})


def _bounds(c: Any, topic: str, deadline: float
            ) -> tuple[list[int], dict[int, tuple[int, int]]]:
    """Each partition's (low, high) watermarks, asked again while the cluster is still settling.

    Right after a broker restart or pause a fresh client may know the topic but not yet its
    partitions' leaders (``_UNKNOWN_PARTITION``, timeouts): a reason to ask again, not a verdict.
    A topic that does not exist is refused at once; anything else still failing at the
    deadline is raised as it came.
    """
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    while True:
        try:
            meta = c.list_topics(topic, timeout=10).topics.get(topic)
            if meta is None or (meta.error is not None and (
                    meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART)):
                raise ValueError(f"topic {topic} cannot be read: {getattr(meta, 'error', None)}")
            if meta.error is not None:
                raise KafkaException(meta.error)  # e.g. no leader yet: asked again
            parts = sorted(meta.partitions)
            bounds = {}
            for p in parts:
                low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10,
                                                    cached=False)
                bounds[p] = (int(low), int(high))
            return parts, bounds
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


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
        deadline = time.monotonic() + timeout
        settling = _settling_codes()
        parts, bounds = _bounds(c, topic, deadline)
        records: dict[int, list[LogRecord]] = {p: [] for p in parts}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        left = {p for p in parts if bounds[p][1] > bounds[p][0]}
        while left:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {sorted(left)} not read to their end "
                                   f"in {timeout:.0f}s (an open transaction?)")
            for m in c.consume(1000, 0.5):
                err = m.error()
                if err is not None:
                    if err.code() in settling:
                        continue  # the client reconnects by itself; the deadline still holds
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
                kind, ts = m.timestamp()
                records[p].append(LogRecord(p, m.offset(), m.key(), m.value(), hs,
                                            ts if kind and ts >= 0 else None))
            for p in list(left):
                pos = c.position([TopicPartition(topic, p)])[0].offset
                if pos >= bounds[p][1]:
                    left.discard(p)
        return Log(topic, records, {p: (b[0], b[1]) for p, b in bounds.items()})
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
    #: how long after ``at`` a commit the victim sent before it died may still land; readings
    #: returned by then bind as its floors too (``not_redelivered``). Keep it under the
    #: victim's session timeout: until that expires the group gives its partitions to nobody
    #: else, so a position read back meanwhile is the victim's own commit
    settle_s: float = 0.0

    @property
    def floors_known_at(self) -> float:
        return self.at if self.sampled_at is None else self.sampled_at


class FaultLog:
    """Faults as a test causes them; ``record`` right after each (it samples the floors)."""

    def __init__(self, floors: Callable[[], Mapping[int, int]], settle_s: float = 0.0) -> None:
        self._floors = floors
        #: ``Fault.settle_s`` of the kills recorded (a victim's session timeout bounds it)
        self.settle_s = settle_s
        self.faults: list[Fault] = []

    def record(self, what: str, victim_pid: int | None = None) -> Fault:
        at = time.time()
        floors = dict(self._floors())
        fault = Fault(at, floors, what, victim_pid, sampled_at=time.time(),
                      settle_s=self.settle_s if victim_pid is not None else 0.0)
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
    rerun_committed: list[tuple[int, int]] = field(default_factory=list)
    unexplained: list[tuple[int, int]] = field(default_factory=list)
    not_redelivered: list[tuple[int, int, str]] = field(default_factory=list)
    #: why the run proves nothing ("" when there was something to judge)
    empty: str = ""
    redeliveries: int = 0
    faults: int = 0
    #: commit samples judged (timed ones: those that can show a rerun)
    samples: int = 0
    timed_samples: int = 0

    @property
    def dup(self) -> int:
        """Applications beyond the first, over all keys."""
        return sum(n - 1 for n in self.duplicates.values())

    @property
    def ok(self) -> bool:
        return not self.failures()

    def failures(self) -> list[str]:
        out = [f"empty: {self.empty}"] if self.empty else []
        for name in FINDINGS:
            found = getattr(self, name)
            if found:
                sample = list(found.items() if isinstance(found, dict) else found)[:5]
                out.append(f"{name}={len(found)} e.g. {sample}")
        return out

    def summary(self) -> str:
        figures = (f"expected={self.expected} applications={self.applications} "
                   f"missing={len(self.missing)} dup={self.dup} "
                   f"redeliveries={self.redeliveries} faults={self.faults} "
                   f"commit_samples={self.samples}")
        bad = self.failures()
        return figures + ("; FAILED: " + "; ".join(bad) if bad else "; ok")


#: the findings ``ok`` fails on (besides ``empty``), in the order ``failures`` lists them
FINDINGS = ("missing", "duplicates", "unexpected", "not_in_log", "skipped", "non_monotonic",
            "rerun_committed", "unexplained", "not_redelivered")

Commits = Sequence["Mapping[int, int] | CommitSample"]


def check(
    ledger: Ledger,
    *,
    log: Log | None = None,
    expected: Iterable[str] | None = None,
    commits: Commits = (),
    faults: Sequence[Fault] = (),
    key_of: Callable[[LogRecord], str] = _key_of_record,
    allow_empty: bool = False,
) -> Report:
    """Judges a run; see the module docstring for what each finding means.

    ``log``: the source topic as ``read_log`` returned it (needed for ``skipped``, ``not_in_log``
    and the redelivery checks; without it only the effect counts are judged). ``expected``:
    the keys that must be applied once each (default: every key in the log). ``commits``: the
    group's committed positions on the source topic: ``CommitSample`` readings (a
    ``CommitSampler``'s ``samples``), or plain mappings in the order sampled, the final one
    last. The faults' floors are readings too. ``allow_empty``: an empty run is not a failure
    (the checker's own tests build them on purpose).
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
    timeline, readings = _timeline(commits, faults)
    report.samples, report.timed_samples = len(timeline), len(readings)
    report.non_monotonic = _non_monotonic(timeline)
    deliveries = [d for d in ledger.deliveries() if log is None or d.topic == log.topic]
    if not allow_empty:
        if not want:
            report.empty = "no record to judge (the log is empty, or nothing was expected)"
        elif not deliveries:
            report.empty = ("no delivery was recorded" +
                            (f" for {log.topic}" if log is not None else ""))
    if log is None:
        return report
    by_offset: dict[tuple[int, int], list[Delivery]] = defaultdict(list)
    for d in deliveries:
        by_offset[(d.partition, d.offset)].append(d)
    highest = _highest(timeline)
    for part, records in sorted(log.records.items()):
        pos = highest.get(part, -1)
        report.skipped += [(part, r.offset) for r in records
                           if r.offset < pos and (part, r.offset) not in by_offset]
    report.rerun_committed = _reruns(deliveries, readings)
    for (part, off), ds in sorted(by_offset.items()):
        report.redeliveries += len(ds) - 1
        for prev, nxt in pairwise(ds):
            if not _explained(part, off, prev.at, nxt.at, faults):
                report.unexplained.append((part, off))
    for f in faults:
        if f.victim_pid is None:
            continue
        floors = _settled_floors(f, readings)
        for (part, off), ds in sorted(by_offset.items()):
            mine = [d for d in ds if d.pid == f.victim_pid and d.at <= f.at]
            if not mine or not _at_or_beyond(off, floors.get(part)):
                continue
            last = mine[-1].at
            if not any(d.pid != f.victim_pid and d.at > last for d in ds):
                report.not_redelivered.append((part, off, f.what))
    return report


def _timeline(commits: Commits, faults: Sequence[Fault]) -> tuple[
        list[CommitSample | Mapping[int, int]], list[CommitSample]]:
    """(every sample in the order to judge backwards commits by, the timed readings).

    All timed (the faults' floors included): ordered by when each reading returned. Any plain
    mapping among them: the order given (the API before timed samples), faults left out."""
    readings = [c for c in commits if isinstance(c, CommitSample)]
    readings += [CommitSample(f.floors_known_at, f.floors, f.at) for f in faults if f.floors]
    readings.sort(key=lambda s: s.at)
    if all(isinstance(c, CommitSample) for c in commits):
        return list(readings), readings
    return list(commits), readings


def _settled_floors(fault: Fault, readings: Sequence[CommitSample]) -> dict[int, int]:
    """A kill's floors once the victim's last commits landed: per partition, the highest of
    its own reading and of every timed reading returned within ``settle_s`` of it.

    Why: the reading taken right after the death can miss a commit the victim sent just
    before it (still on its way, or queued behind a loaded coordinator's log append); its
    records were committed, nobody is given them again, and ``not_redelivered`` would report
    work that went nowhere where none did (2026-12-02: a victim ran partition 0's 52 records,
    died 1.4 s later; its floor read 0, the partition's next owner found it committed to the
    end). Readings up to ``settle_s`` later can only show the victim's own commits for its
    partitions: the group gives them to nobody else before its session expires."""
    out = dict(fault.floors)
    if fault.settle_s <= 0:
        return out
    until = fault.at + fault.settle_s
    for r in readings:
        if r.at <= until:
            for part, pos in r.positions.items():
                out[part] = max(pos, out.get(part, pos))
    return out


def _positions(sample: CommitSample | Mapping[int, int]) -> Mapping[int, int]:
    return sample.positions if isinstance(sample, CommitSample) else sample


def _highest(timeline: Sequence[CommitSample | Mapping[int, int]]) -> dict[int, int]:
    """The highest position read back per partition: everything below it was committed."""
    out: dict[int, int] = {}
    for sample in timeline:
        for part, pos in _positions(sample).items():
            out[part] = max(pos, out.get(part, pos))
    return out


def _reruns(deliveries: Sequence[Delivery],
            readings: Sequence[CommitSample]) -> list[tuple[int, int]]:
    """Deliveries of an offset below a position read back before the delivery was made."""
    floor: dict[int, tuple[list[float], list[int]]] = {}  # part -> (times, running max)
    for s in readings:  # sorted by ``at``
        for part, pos in s.positions.items():
            times, highs = floor.setdefault(part, ([], []))
            times.append(s.at)
            highs.append(max(pos, highs[-1]) if highs else pos)
    found: set[tuple[int, int]] = set()
    for d in deliveries:
        got = floor.get(d.partition)
        if got is None:
            continue
        i = bisect.bisect_left(got[0], d.at)  # readings that returned before the delivery
        if i and got[1][i - 1] > d.offset:
            found.add((d.partition, d.offset))
    return sorted(found)


def _explained(part: int, off: int, first: float, again: float,
               faults: Sequence[Fault]) -> bool:
    """A redelivery at ``again`` of a record first delivered at ``first`` is explained when a
    fault happened before it, and no fault in between had its commit floor past the record.

    Why not "a fault between the two deliveries": a fault's consequences outlast its moment (a
    restarted worker rejoins seconds later and its join revokes partitions from the others;
    after a broker restart members are expelled once the coordinator has loaded), so the first
    delivery may come after the fault that causes the second. The floors still bind: a record
    committed at any fault between its deliveries must never be delivered again. That leaves a
    redelivery after a fault with none in between unjudged here (``all`` of nothing is true):
    ``rerun_committed`` judges it against every reading of the committed positions."""
    if not any(f.at <= again for f in faults):
        return False
    return all(_at_or_beyond(off, f.floors.get(part)) for f in faults
               if first <= f.at and f.floors_known_at <= again)


def _at_or_beyond(offset: int, floor: int | None) -> bool:
    """Whether ``offset`` was uncommitted under ``floor`` (none committed: everything was)."""
    return floor is None or floor < 0 or offset >= floor


def _non_monotonic(timeline: Sequence[CommitSample | Mapping[int, int]]
                   ) -> list[tuple[int, int, int]]:
    """Readings lower than one certainly read before them; a position that disappeared (a
    negative reading after a committed one) is a commit lost, the worst way to go backwards.

    Timed readings that overlap (a sampler thread and a fault's floors read at once) may
    answer in either order, so a timed reading is compared only with those that returned
    before it was asked for (``timeline`` is sorted by return time: a prefix of it)."""
    out = []
    if not all(isinstance(s, CommitSample) for s in timeline):  # plain mappings: given order
        last: dict[int, int] = {}
        for sample in timeline:
            for part, pos in _positions(sample).items():
                if part in last and pos < last[part]:
                    out.append((part, last[part], pos))
                if pos >= 0:
                    last[part] = max(pos, last.get(part, pos))
        return list(dict.fromkeys(out))
    readings = [s for s in timeline if isinstance(s, CommitSample)]
    highs: dict[int, tuple[list[float], list[int]]] = {}  # part -> (times, running max)
    for s in readings:
        for part, pos in s.positions.items():
            times, top = highs.setdefault(part, ([], []))
            times.append(s.at)
            top.append(max(pos, top[-1]) if top else pos)
    for s in readings:
        asked = s.started if s.started is not None else s.at
        for part, pos in s.positions.items():
            times, top = highs[part]
            i = bisect.bisect_right(times, asked)
            if i and top[i - 1] >= 0 and pos < top[i - 1]:
                out.append((part, top[i - 1], pos))
    return list(dict.fromkeys(out))  # a dip read back many times is one finding
