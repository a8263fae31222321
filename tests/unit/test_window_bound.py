"""What a partition's share counts (issue #50): records not yet done, not the finished ones
behind an unfinished record; and the bound that window keeps all the same.

With thousands of keys, one key's record at the head of a partition runs while records of other
keys after it finish; counting those finished ones stopped the partition with most of its share
done, and 5,000 handlers waiting on I/O kept ~11,000 records/s busy where plain asyncio kept
~37,000 (BENCHMARKS.md, iobound). The window (everything from the oldest unfinished record on,
done or not) is what a crash makes the next owner run again, so it stops at
``backpressure.WINDOW_FACTOR`` shares.

Judged from the consumer's side (how far it handed the partition out) and the handler's (which
records ran), in the state the loop must settle in while one record never finishes: the
partition paused, every other record handed out done. Canaries: the window bounded at one share
(the rule before) stops at a share and a poll; the window unbounded hands out the whole log.

A failure that cannot be placed (its dead letter never acknowledged: the DLQ down) still stops
its partition at a share of its window, as before: there is no I/O to overlap past it. Canary:
counting records not yet done alone runs the partition to the window's bound.
"""

from __future__ import annotations

import threading
from typing import cast

import pytest

from kworkers import NonRetryableError, Worker
from kworkers.consumer import backpressure, processor
from kworkers.consumer.ports import ConsumerPort, Delivered
from kworkers.message import Headers, Message
from tests.unit.test_liveness import TP, StickyConsumer, _run, _wait
from tests.unit.test_loop_with_fake_consumer import _idle

SHARE = 100
TOTAL = 3_000
TPART: TP = ("t", 0)


def _stuck_head(monkeypatch: pytest.MonkeyPatch, factor: int | None) -> tuple[int, int]:
    """One partition whose first record (key ``slow``) never finishes while it is judged,
    the rest of 200 keys that finish at once: (records handed out, records run) once the loop
    settled."""
    if factor is not None:
        monkeypatch.setattr(backpressure, "WINDOW_FACTOR", factor)
    records = [Message("t", 0, o, b"slow" if o == 0 else b"k%d" % (o % 200), b"v")
               for o in range(TOTAL)]
    consumer = StickyConsumer({TPART: records})
    release = threading.Event()
    ran: list[int] = []

    def handle(msg: Message) -> None:
        if msg.key == b"slow":
            release.wait(60)
        else:
            ran.append(msg.offset)

    w, t = _run(consumer, handle, ordering="key", concurrency=8, max_in_flight=SHARE,
                max_in_flight_per_partition=SHARE)
    try:
        # settled: every record handed out but the stuck one ran, and either the partition is
        # paused or the whole log is out (nothing more to hand)
        _wait(lambda: len(ran) == consumer.next[TPART] - 1 > 0
              and (TPART in consumer.paused or consumer.next[TPART] == TOTAL),
              "the loop settled", 60)
        handed, done = consumer.next[TPART], len(ran)
    finally:
        release.set()
        w.stop()
        t.join(30)
    return handed, done


def test_finished_records_behind_an_unfinished_one_leave_the_share_free_up_to_the_window(
        monkeypatch: pytest.MonkeyPatch) -> None:
    handed, done = _stuck_head(monkeypatch, None)
    window = backpressure.WINDOW_FACTOR * SHARE
    # far past one share (the stuck record is all that is not done) ...
    assert done > 2 * SHARE, (handed, done)
    # ... and stopped at the window's bound: within a share of it (a partition stopped for its
    # records not yet done resumes only once its window is a share below the bound; one poll
    # takes at most the room left under the share past it)
    assert window - SHARE <= handed <= window + SHARE, (handed, window)


def test_canary_the_window_bounded_at_one_share_stops_at_a_share(
        monkeypatch: pytest.MonkeyPatch) -> None:
    handed, done = _stuck_head(monkeypatch, 1)
    assert handed <= 2 * SHARE and done <= 2 * SHARE, (handed, done)


def test_canary_the_window_unbounded_hands_out_the_whole_log(
        monkeypatch: pytest.MonkeyPatch) -> None:
    handed, _ = _stuck_head(monkeypatch, 10**6)
    assert handed == TOTAL


# ------------------------------------------- a hand-off waiting for its acknowledgement


class _Unanswered:
    """A sender whose broker never acknowledges (a DLQ outage): every hand-off stays pending."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers,
             done: Delivered) -> None:
        self.sent.append(topic)


def _stuck_hand_off(monkeypatch: pytest.MonkeyPatch, window_counted: bool) -> int:
    """Record 0 fails for good and its dead letter is never acknowledged; the rest of 200 keys
    finish at once: how far the partition was handed out once the loop settled."""
    if not window_counted:  # the canary: records not yet done counted whatever waits
        monkeypatch.setattr(processor, "_counted", lambda ps: ps.tracker.in_flight)
    records = [Message("t", 0, o, b"k%d" % (o % 200), b"v") for o in range(TOTAL)]
    consumer = StickyConsumer({TPART: records})
    sender = _Unanswered()
    ran: list[int] = []

    def handle(msg: Message) -> None:
        if msg.offset == 0:
            raise NonRetryableError("Poison", "always bad")
        ran.append(msg.offset)

    port = cast(ConsumerPort, consumer)
    w = Worker(topics=["t"], group_id="g", sender=sender, ordering="key", concurrency=8,
               max_in_flight=SHARE, max_in_flight_per_partition=SHARE, drain_timeout=1.0,
               consumer=lambda g: port if g == "g" else _idle(g))
    w.handler(handle)
    t = threading.Thread(target=w.run, args=(False,), daemon=True)
    t.start()
    try:
        _wait(lambda: bool(sender.sent) and len(ran) == consumer.next[TPART] - 1 > 0
              and (TPART in consumer.paused or consumer.next[TPART] == TOTAL),
              "the loop settled", 60)
        return consumer.next[TPART]
    finally:
        w.stop()
        t.join(30)


def test_a_hand_off_waiting_for_its_acknowledgement_stops_the_partition_at_a_share(
        monkeypatch: pytest.MonkeyPatch) -> None:
    handed = _stuck_hand_off(monkeypatch, window_counted=True)
    assert handed <= 2 * SHARE, handed


def test_canary_records_not_yet_done_alone_run_far_past_an_unplaced_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    handed = _stuck_hand_off(monkeypatch, window_counted=False)
    assert handed >= (backpressure.WINDOW_FACTOR - 1) * SHARE, handed
