"""The poll loop bounded in bytes (issue #45), without a broker: large records on a scripted
consumer whose pauses survive reassignment (``test_liveness.StickyConsumer``).

Judged from the consumer's side, not the loop's counters: the bytes the consumer handed out
less those of the records whose handler returned, read at every poll. That is at most what the
loop holds (a record is completed in the loop only after its handler returns), so it is a
floor of the loop's window: the canary, the same run with the bound lifted, shows the floor
itself past the bound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from kworkers.clock import FakeClock
from kworkers.consumer import observe
from kworkers.consumer.partition import PartitionState
from kworkers.consumer.stall import Hold, candidates, judge
from kworkers.memory import RECORD_COST, KiB, MiB
from kworkers.message import Message
from tests.unit.test_liveness import TP, StickyConsumer, _run, _wait


def _cost(m: Message) -> int:
    return len(m.value or b"") + len(m.key or b"") + RECORD_COST


class CountingConsumer(StickyConsumer):
    """Counts, at every poll, the bytes handed out and not yet handled; and what each poll
    handed out, in bytes and in order."""

    def __init__(self, records: dict[TP, list[Message]]) -> None:
        super().__init__(records)
        self.out_bytes = 0
        self.handled_bytes = 0
        self.peak = 0
        self.largest_poll = 0
        #: (poll number, the records it handed out)
        self.handed: list[tuple[int, list[Message]]] = []
        self.count_lock = threading.Lock()

    def poll_batch(self, n: int, timeout: float) -> list[Message]:
        out = super().poll_batch(n, timeout)
        got = sum(map(_cost, out))
        with self.count_lock:
            self.out_bytes += got
            self.peak = max(self.peak, self.out_bytes - self.handled_bytes)
            self.largest_poll = max(self.largest_poll, got)
            if out:
                self.handed.append((self.polls, out))
        return out

    def handled(self, m: Message) -> None:
        with self.count_lock:
            self.handled_bytes += _cost(m)


def _big_records(partitions: int, n: int, size: int) -> dict[TP, list[Message]]:
    return {("t", p): [Message("t", p, o, b"k%d" % o, bytes(size)) for o in range(n)]
            for p in range(partitions)}


def _drain_all(consumer: CountingConsumer, handler: Callable[[Message], None], total: int,
               **cfg: Any) -> None:  # Worker's own **settings: Any
    handled: list[Message] = []

    def handle(msg: Message) -> None:
        handler(msg)
        consumer.handled(msg)
        handled.append(msg)

    w, t = _run(consumer, handle, **cfg)
    try:
        _wait(lambda: all(consumer.commits.get(tp) == len(log)
                          for tp, log in consumer.logs.items()), "every partition at its end", 60)
    finally:
        w.stop()
        t.join(30)
    assert len({(m.partition, m.offset) for m in handled}) == total


def _slow(_m: Message) -> None:
    time.sleep(0.002)


def test_a_loop_of_large_records_holds_its_byte_bound_and_one_poll() -> None:
    """8 KiB records, 6 partitions, a 64 KiB bound (about one record a partition's share):
    every record runs, and what the consumer handed out and was not handled stays under the
    bound plus the largest poll; the bound binds (the canary below lifts it)."""
    consumer = CountingConsumer(_big_records(6, 40, 8 * KiB))
    _drain_all(consumer, _slow, 240, max_in_flight_bytes=64 * KiB, concurrency=4,
               consume_batch=8)
    print(f"peak {consumer.peak:,} B handed out and not handled, largest poll "
          f"{consumer.largest_poll:,} B")
    assert consumer.peak <= 64 * KiB + consumer.largest_poll
    # after the first (no record size known yet: a whole batch), polls sized to the room
    later = [sum(map(_cost, out)) for _n, out in consumer.handed[1:]]
    assert later and max(later) < 64 * KiB, later


def test_canary_with_the_byte_bound_lifted_the_same_loop_holds_far_more() -> None:
    consumer = CountingConsumer(_big_records(6, 40, 8 * KiB))
    _drain_all(consumer, _slow, 240, max_in_flight_bytes=1 << 40, concurrency=4,
               consume_batch=8)
    print(f"canary: peak {consumer.peak:,} B, largest poll {consumer.largest_poll:,} B")
    assert consumer.peak > 64 * KiB + consumer.largest_poll
    assert consumer.peak > 10 * 64 * KiB


@pytest.mark.parametrize("bound", [64 * KiB, 1 << 40], ids=["bound", "canary-lifted"])
def test_a_record_larger_than_the_whole_bound_runs_alone(bound: int) -> None:
    """Partition 0's first record is 1 MiB against a 64 KiB bound: it is taken (its partition
    held nothing), and while its handler runs (longer than a hold lasts, so the loop polls
    again, paused) no poll hands out anything; then the rest runs, every record once. The
    canary, the bound lifted: the other partitions' records go on being handed out."""
    records = _big_records(3, 30, 2 * KiB)
    records[("t", 0)][0] = Message("t", 0, 0, b"big", bytes(MiB))
    consumer = CountingConsumer(records)
    polls_at: dict[str, int] = {}

    def handle(msg: Message) -> None:
        if msg.partition == 0 and msg.offset == 0:
            polls_at["start"] = consumer.polls
            time.sleep(1.0)  # past HOLD_S (0.5 s): the hold becomes a pause, polls go on
            polls_at["end"] = consumer.polls
        else:
            time.sleep(0.001)

    _drain_all(consumer, handle, 90, max_in_flight_bytes=bound, concurrency=4,
               consume_batch=20)
    given = next(n for n, out in consumer.handed if any(m.value and len(m.value) == MiB
                                                        for m in out))
    during = [n for n, _out in consumer.handed if given < n <= polls_at["end"]]
    assert polls_at["end"] > polls_at["start"] + 2  # the loop polled while it ran
    if bound == 64 * KiB:
        assert during == [], during  # ... and took nothing
    else:
        assert during, "the canary's loop took nothing either: the check proves nothing"


# ------------------------------------------------------------------ the stall detector

def test_a_partition_holding_nothing_at_the_loops_byte_bound_is_held_not_stalled() -> None:
    """At its byte bound the loop takes nothing, so a partition holding nothing makes no
    progress: ``Hold.MEMORY`` says why. The hold ends with the loop's next completion, so it
    is over by the loop's last progress: a loop that completes nothing for a stall bound holds
    nobody on purpose, and the partition is judged."""
    clock = FakeClock(1000.0)
    busy, idle = PartitionState("t", 0, clock), PartitionState("t", 1, clock)
    busy.tracker.track_many([0], [10 * MiB])
    busy.progress_at, idle.progress_at = 990.0, 900.0
    calling = frozenset({("t", 0)})  # its record's handler runs
    views = observe.stall_views([busy, idle], calling, None, False, False, clock=clock,
                                memory=True)
    assert [v.hold for v in views] == [None, Hold.MEMORY]
    assert views[1].hold_ends == 990.0
    assert candidates(views, 1000.0, 60.0) == []  # the busy one completed 10 s ago
    late = candidates(views, 1060.0, 60.0)
    assert [v.tp for v in late] == [("t", 1)]  # nothing completed for a stall bound
    (stall,) = judge(late, {("t", 1): 5})
    assert stall.overdue is Hold.MEMORY and "byte bound" in stall.describe(1060.0)
    plain = observe.stall_views([busy, idle], calling, None, False, False, clock=clock)
    assert [v.hold for v in plain] == [None, None]  # not at the bound: no hold


@pytest.mark.parametrize("memory", [True, False])
def test_a_loop_at_its_byte_bound_says_so_to_the_stall_watch(memory: bool) -> None:
    """The loop passes its state: a 1 MiB record stuck in its handler keeps a 64 KiB loop
    at its bound, and the other partition, holding nothing, is shown held for memory (with
    the bound lifted, the canary, it is open and takes its records: no hold)."""
    records = _big_records(2, 5, KiB)
    records[("t", 0)][0] = Message("t", 0, 0, b"big", bytes(MiB))
    records[("t", 1)] = []
    consumer = CountingConsumer(records)
    gate = threading.Event()

    def handle(msg: Message) -> None:
        if msg.offset == 0 and msg.partition == 0:
            gate.wait(30)

    w, t = _run(consumer, handle, max_in_flight_bytes=64 * KiB if memory else 1 << 40)
    try:
        def shown() -> bool:
            views = getattr(w.loops[0], "stall_views", ()) if w.loops else ()
            return any(v.tp == ("t", 1) and v.hold is Hold.MEMORY for v in views) == memory \
                and len(views) == 2
        _wait(shown, "the stall views say it", 20)
    finally:
        gate.set()
        w.stop()
        t.join(30)
