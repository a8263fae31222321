"""The adapter between the loop and confluent-kafka: the only consumer module importing it.

The loop speaks in ``Message`` values and ``(topic, partition)`` pairs; this module turns those
into client calls and client errors into the loop's vocabulary (retryable or not).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kworkers.clock import Clock, SystemClock
from kworkers.consumer.ports import CommitReport
from kworkers.message import Headers, Message

log = logging.getLogger("kworkers.consumer")

TP = tuple[str, int]
RebalanceCallback = Callable[[list[TP]], None]

#: records below the committed position read at an assignment are dropped (``_floors``);
#: False only in the canary of its unit test (the rule before: they were run again)
STALE_GUARD = True
#: how long an assignment waits for the committed positions (a timeout leaves no floor)
FLOOR_TIMEOUT_S = 5.0

#: the group is rebalancing: a commit now is refused, not failed (see ``consumer.commit``)
_REBALANCING_CODES = frozenset({
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError.STALE_MEMBER_EPOCH,
    KafkaError.FENCED_MEMBER_EPOCH,
})
_RETRYABLE_COMMIT_CODES = frozenset({
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError.NETWORK_EXCEPTION,
    KafkaError._WAIT_COORD,
})


def is_rebalancing(exc: BaseException) -> bool:
    return (isinstance(exc, KafkaException) and bool(exc.args)
            and isinstance(exc.args[0], KafkaError) and exc.args[0].code() in _REBALANCING_CODES)


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        err: KafkaError = exc.args[0]
        return bool(err.retriable()) or err.code() in _RETRYABLE_COMMIT_CODES
    return False


_value = itemgetter(1)
_BYTES_ONLY = {bytes}


def headers_of(h: Any) -> Headers:
    """Client headers as kworkers' tuple; a null header value becomes b"" (documented).

    The client's list taken whole when every value is bytes (the usual case, checked in C):
    a retry tier record carries a dozen headers, and the per-header loop below cost 1.5 us
    of each one read back (0.5 us this way)."""
    if type(h) is list:
        t = tuple(h)
        if set(map(type, map(_value, t))) == _BYTES_ONLY:
            return t
    items = h.items() if isinstance(h, dict) else h
    return tuple(
        (k, v if isinstance(v, bytes) else (b"" if v is None else str(v).encode()))
        for k, v in items
    )


def incremental(conf: Mapping[str, Any]) -> bool:
    """Whether the group hands out partitions incrementally (cooperative-sticky, KIP-848) or
    replaces the whole assignment at every rebalance (the eager strategies)."""
    if str(conf.get("group.protocol", "classic")) == "consumer":
        return True
    return "cooperative" in str(conf.get("partition.assignment.strategy", "range,roundrobin"))


def coordinator_silence(stats: str) -> float | None:
    """How long (s) the group coordinator has been silent in a way that says something, from
    a statistics JSON: its logical ``GroupCoordinator`` broker's ``rxidle`` while the member is
    steady; 0 while the member is joining a rebalance (the coordinator holds a joining
    member's request until the group is complete, and the member is not expelled meanwhile).
    None when absent. A substring search, not a parse: the statistics of a large assignment
    run to hundreds of kilobytes, and this runs on the poll thread every interval."""
    join = _JOIN_STATE.search(stats)
    if join is not None and join.group(1) != "steady":
        return 0.0
    at = stats.find('"GroupCoordinator"')
    if at < 0:
        return None
    m = _RXIDLE.search(stats, at)
    return int(m.group(1)) / 1e6 if m is not None and int(m.group(1)) >= 0 else None


_RXIDLE = re.compile(r'"rxidle":\s*(-?\d+)')
_JOIN_STATE = re.compile(r'"join_state":\s*"([a-z-]+)"')


class KafkaConsumerAdapter:
    """Wraps (never subclasses) a confluent-kafka ``Consumer``.

    Commits are asynchronous: ``commit_async`` sends, and the outcomes the client reports
    through its commit callback (served by the poll) are collected for the poll thread
    (``commit_results``). The statistics callback, served the same way, says when the group
    coordinator was last heard from (``coordinator_contact``), which self-fencing needs.
    """

    def __init__(self, conf: Mapping[str, Any], clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._results: list[CommitReport] = []
        self._contact: float | None = None
        #: where the client last reached the end of a partition (``enable.partition.eof``)
        self._ends: dict[TP, int] = {}
        #: per newly assigned partition, its committed position at the assignment, until a
        #: record at or past it arrives (``_drop_stale``)
        self._floors: dict[TP, int] = {}
        self._dropping: set[TP] = set()
        #: records dropped that way (tests read it)
        self.dropped_stale = 0
        full = dict(conf)
        full["on_commit"] = self._on_commit
        full["stats_cb"] = self._on_stats
        self._c = Consumer(full)
        self.group = str(conf["group.id"])
        self._incremental = incremental(conf)
        self._session_s = (float(conf.get("session.timeout.ms", 45_000)) / 1000.0
                           if str(conf.get("group.protocol", "classic")) == "classic" else None)

    def _on_commit(self, err: KafkaError | None, parts: list[TopicPartition]) -> None:
        offsets = {(p.topic, p.partition): int(p.offset) for p in parts}
        error: BaseException | None = None
        if err is not None and err.code() != KafkaError._NO_OFFSET:
            error = KafkaException(err)
        else:
            bad = next((p.error for p in parts if p.error is not None), None)
            if bad is not None:
                error = KafkaException(bad)
        if error is None:
            self._contact = self._clock.monotonic()
        self._results.append((offsets, error))

    def _on_stats(self, stats: str) -> None:
        silent = coordinator_silence(stats)
        if silent is not None:
            self._contact = self._clock.monotonic() - silent

    def subscribe(self, topics: Iterable[str], on_assign: RebalanceCallback,
                  on_revoke: RebalanceCallback, on_lost: RebalanceCallback) -> None:
        def pairs(parts: list[TopicPartition]) -> list[TP]:
            return [(p.topic, p.partition) for p in parts]

        def assigned(c: Consumer, parts: list[TopicPartition]) -> None:
            # confluent-kafka applies the assignment only after this callback returns, unless
            # the callback does it: do it first, so the processor's explicit pause or resume
            # acts on partitions the client holds (librdkafka keeps an application pause
            # across a reassignment; a state assumed instead of set stalls a partition)
            if self._incremental:
                c.incremental_assign(parts)
            else:
                c.assign(parts)
            tps = pairs(parts)
            for tp in tps:  # an end seen under an earlier assignment says nothing now
                self._ends.pop(tp, None)
            if STALE_GUARD:
                self._read_floors(c, parts)
            on_assign(tps)

        def revoked(parts: list[TopicPartition], then: RebalanceCallback) -> None:
            for p in parts:
                self._floors.pop((p.topic, p.partition), None)
                self._dropping.discard((p.topic, p.partition))
            then(pairs(parts))

        self._c.subscribe(
            list(topics),
            on_assign=assigned,
            on_revoke=lambda _c, parts: revoked(parts, on_revoke),
            on_lost=lambda _c, parts: revoked(parts, on_lost),
        )

    def _read_floors(self, c: Consumer, parts: list[TopicPartition]) -> None:
        """The committed positions of newly assigned partitions, so that records below them
        are dropped. Why: librdkafka 2.16 can hand out records it fetched for a partition
        under an earlier assignment of this member (a revoke landing while its start offset
        was being looked up restarts the lookup on the stopped partition, and the records it
        then fetches stay queued): found by the kill loop's evidence (issue #44), offsets 0-43
        run again after another member had run and committed them. A record below the group's
        committed position is done by definition. A lookup that fails leaves no floor (the
        rule before: at least once)."""
        if not parts:
            return
        try:
            got = c.committed([TopicPartition(p.topic, p.partition) for p in parts],
                              timeout=FLOOR_TIMEOUT_S)
        except KafkaException as exc:
            log.warning("%s: the committed positions of %d newly assigned partitions could not "
                        "be read (%s): records fetched under an earlier assignment are not "
                        "filtered this time", self.group, len(parts), exc)
            return
        for p in got:
            if p.error is None and p.offset >= 0:
                self._floors[(p.topic, p.partition)] = int(p.offset)

    def poll_batch(self, n: int, timeout: float) -> list[Message]:
        """Up to ``n`` records: what the client holds now, else the first that arrives within
        ``timeout`` and whatever came with it. Never ``consume(n, timeout)`` alone: it waits
        out the whole timeout unless ``n`` records arrive, so a lone record waited for the
        timeout, and a loop whose only fetchable partitions were idle slept through it while
        its backlogged partitions, paused, drained dry."""
        c = self._c
        raw = c.consume(n, 0)
        if not raw and timeout > 0:
            raw = c.consume(1, timeout)
            if raw and n > 1:
                raw += c.consume(n - 1, 0)
        out: list[Message] = []
        append = out.append
        new = tuple.__new__  # NamedTuple's own __new__ is Python code: 0.4 us per record more
        cls = Message
        for m in raw:
            err = m.error()
            if err is not None:
                if err.fatal():
                    raise KafkaException(err)
                if err.code() == KafkaError._PARTITION_EOF:
                    topic, part, end = m.topic(), m.partition(), m.offset()
                    if topic is not None and part is not None and end is not None:
                        self._ends[(topic, part)] = end
                else:
                    log.warning("consumer error (the client retries it): %s", err)
                continue
            if self._floors and self._drop_stale(m):
                continue
            h = m.headers()
            ts = m.timestamp()
            append(new(cls, (m.topic(), m.partition(), m.offset(), m.key(), m.value(),
                             headers_of(h) if h else (), ts[1] if ts[0] else None, 1,
                             None, None, False)))
        return out

    def _drop_stale(self, m: Any) -> bool:
        """True for a record below its partition's floor; the first at or past it ends the
        floor (what the client fetched for this assignment comes in order after it)."""
        tp = (m.topic(), m.partition())
        floor = self._floors.get(tp)
        if floor is None:
            return False
        if m.offset() >= floor:
            del self._floors[tp]
            self._dropping.discard(tp)
            return False
        if tp not in self._dropping:  # one line per partition and assignment
            self._dropping.add(tp)
            log.info("%s: dropping records of %s/%d below %d, its committed position at the "
                     "assignment (fetched by the client under an earlier assignment; first: "
                     "offset %d)", self.group, tp[0], tp[1], floor, m.offset())
        self.dropped_stale += 1
        return True

    def commit_async(self, positions: Mapping[TP, int]) -> None:
        tps = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
        try:
            self._c.commit(offsets=tps, asynchronous=True)
        except KafkaException as exc:  # refused before it was sent (not assigned, closed)
            self._results.append((dict(positions), exc))

    def commit_results(self) -> list[CommitReport]:
        out, self._results = self._results, []
        return out

    def coordinator_contact(self) -> float | None:
        return self._contact

    def session_timeout(self) -> float | None:
        return self._session_s

    def pause(self, tps: Sequence[TP]) -> None:
        if tps:
            self._c.pause([TopicPartition(t, p) for t, p in tps])

    def resume(self, tps: Sequence[TP]) -> None:
        if tps:
            self._c.resume([TopicPartition(t, p) for t, p in tps])

    def watermarks(self, tp: TP, timeout: float = 1.0) -> tuple[int, int]:
        lo, hi = self._c.get_watermark_offsets(TopicPartition(*tp), timeout=timeout, cached=True)
        return int(lo), int(hi)

    def caught_up(self, tp: TP) -> bool:
        end = self._ends.get(tp)
        if end is None:
            return False
        try:
            _lo, hi = self.watermarks(tp, 0.0)
        except KafkaException:  # nothing cached yet
            return False
        return 0 <= hi <= end

    def position(self, tps: list[TP]) -> dict[TP, int | None]:
        got = self._c.position([TopicPartition(t, p) for t, p in tps])
        return {(x.topic, x.partition): (x.offset if x.offset >= 0 else None) for x in got}

    def group_metadata(self) -> object:
        return self._c.consumer_group_metadata()

    def close(self) -> None:
        self._c.close()

    is_retryable = staticmethod(is_retryable)
    is_rebalancing = staticmethod(is_rebalancing)
