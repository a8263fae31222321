"""Self-fencing without a broker: the pure membership rule, and a worker whose coordinator goes
silent: no record starts, nothing is committed, readiness says why; contact again and it goes
on. The real-broker proofs (a network partition, a frozen broker) are in tests/faults."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import cast

import pytest

from kworkers import Worker
from kworkers.clock import FakeClock
from kworkers.consumer.fencing import Membership, check_margin, default_margin
from kworkers.consumer.ports import ConsumerPort
from kworkers.consumer.processor import Processor
from kworkers.errors import ConfigError
from kworkers.message import Message
from tests.unit.test_liveness import StickyConsumer, _records, _wait
from tests.unit.test_loop_with_fake_consumer import RecordingSender, _idle


def test_a_member_fences_itself_after_the_session_less_the_margin_of_silence() -> None:
    m = Membership(session_s=10.0, margin_s=2.0, since=0.0)
    assert not m.update(7.9) and not m.fenced  # never heard from: counts from the start
    # cast: m.fenced re-read (mypy keeps it narrowed across the calls that move it)
    assert m.update(8.0) and cast(bool, m.fenced)
    assert not m.update(9.0)  # one transition, logged once
    assert not m.may_probe(9.0)
    m.observe(8.5)  # the coordinator answers again at 8.5: it may be saying "expelled"
    assert cast(bool, m.fenced) and m.may_probe(9.0)  # so only a confirmation ends the fence
    assert m.confirm(9.2) and not cast(bool, m.fenced) and not m.may_probe(9.3)
    m.observe(3.0)  # an older contact never moves it back
    assert m.contact_at == 9.2
    assert m.update(17.2)


def test_a_hold_may_not_outlast_the_time_left_before_fencing() -> None:
    """A backpressure hold polls nothing, so the statistics that tell the coordinator's
    silence arrive only after it: the processor holds only while the threshold (8 s here)
    cannot pass meanwhile (``Processor._may_hold`` asks with ``HOLD_S``)."""
    m = Membership(session_s=10.0, margin_s=2.0, since=0.0)
    assert m.may_wait(0.0, 0.5) and m.may_wait(7.4, 0.5)
    assert not m.may_wait(7.5, 0.5)  # 7.5 + 0.5 reaches the threshold
    m.observe(7.0)
    assert m.may_wait(7.5, 0.5)  # heard at 7.0: silent 0.5 s
    assert m.update(15.0) and not m.may_wait(15.0, 0.0)  # fenced: nothing to wait for


def test_the_margin_leaves_time_to_work_and_to_stop() -> None:
    assert default_margin(45.0) == 9.0
    assert default_margin(3.0) == 1.0
    assert default_margin(1.0) == 0.5
    for bad in (0.0, -1.0, 10.0, 12.0):
        with pytest.raises(ConfigError, match="fence_margin"):
            check_margin(bad, 10.0)
    with pytest.raises(ConfigError, match="fence_margin"):
        Worker(topics=["t"], group_id="g", fence_margin=0)


class SilentCoordinator(StickyConsumer):
    """The sticky fake with a session and a coordinator the test silences and restores."""

    def __init__(self, *a: object, **kw: object) -> None:
        super().__init__(*a, **kw)  # type: ignore[arg-type]
        self.silent = threading.Event()
        self.sends = 0

    def session_timeout(self) -> float | None:
        return 2.0

    def coordinator_contact(self) -> float | None:
        return None if self.silent.is_set() else time.monotonic()

    def commit_async(self, positions: dict[tuple[str, int], int]) -> None:
        self.sends += 1
        super().commit_async(positions)


def test_a_silent_coordinator_fences_the_worker_until_it_answers_again() -> None:
    consumer = SilentCoordinator(_records(1, 400))
    started: Counter[int] = Counter()
    go = threading.Event()

    def handle(msg: Message) -> None:
        started[msg.offset] += 1
        if msg.offset == 20:
            go.wait(10)  # the partition has more fetched behind this one
        time.sleep(0.002)

    # the sticky fake has no ``group_metadata`` (exactly-once only, never asked here)
    w = Worker(topics=["t"], group_id="g", sender=RecordingSender(), fence_margin=1.0,
               consumer=lambda g: cast(ConsumerPort, consumer) if g == "g" else _idle(g))
    w.handler(handle)
    t = threading.Thread(target=w.run, args=(False,), daemon=True)
    t.start()
    try:
        _wait(lambda: started[20] == 1, "offset 20 running")
        consumer.silent.set()
        _wait(lambda: (m := cast(Processor, w.loops[0]).membership) is not None and m.fenced,
              "fenced after 1 s of silence")
        # the poll thread sets the membership's flag, then degrades readiness: wait for both
        _wait(lambda: "fenced" in (w.unready_reason or ""), "readiness says fenced")
        go.set()  # offset 20 finishes; nothing after it may start now
        time.sleep(0.5)
        frozen, sends = sum(started.values()), consumer.sends
        time.sleep(0.5)
        assert sum(started.values()) == frozen and frozen <= 22, frozen
        assert consumer.sends == sends  # and nothing is committed while fenced
        consumer.silent.clear()
        _wait(lambda: consumer.commits.get(("t", 0)) == 400, "every record after contact")
        assert w.ready
    finally:
        w.stop()
        t.join(30)
    assert max(started.values()) == 1 and len(started) == 400  # held records ran once


def test_with_self_fencing_off_a_silent_coordinator_changes_nothing() -> None:
    """The canary of the test above: the same silence, fencing off: records keep starting."""
    consumer = SilentCoordinator(_records(1, 300))
    consumer.silent.set()
    w = Worker(topics=["t"], group_id="g", sender=RecordingSender(), self_fencing=False,
               consumer=lambda g: cast(ConsumerPort, consumer) if g == "g" else _idle(g))
    w.handler(lambda msg: time.sleep(0.002))
    t = threading.Thread(target=w.run, args=(False,), daemon=True)
    t.start()
    try:
        _wait(lambda: consumer.commits.get(("t", 0)) == 300, "every record despite the silence")
        assert cast(Processor, w.loops[0]).membership is None
    finally:
        w.stop()
        t.join(30)


def test_a_fake_clock_drives_the_rule_alone() -> None:
    clock = FakeClock(100.0)
    m = Membership(3.0, 1.0, since=clock.monotonic())
    clock.advance(1.9)
    assert not m.update(clock.monotonic())
    clock.advance(0.2)
    assert m.update(clock.monotonic())


def test_what_the_statistics_say_of_the_coordinator() -> None:
    from kworkers.kafka.consumer import coordinator_silence

    steady = ('{"brokers": {"b/1": {"rxidle": 5}, "GroupCoordinator": {"nodeid": -1, '
              '"rxidle": 2500000}}, "cgrp": {"state": "up", "join_state": "steady"}}')
    assert coordinator_silence(steady) == 2.5
    # a member in a rebalance waits on the coordinator on purpose: not silence
    joining = steady.replace('"steady"', '"wait-join"')
    assert coordinator_silence(joining) == 0.0
    assert coordinator_silence('{"brokers": {}}') is None
    never = steady.replace("2500000", "-1")  # nothing received yet
    assert coordinator_silence(never) is None
