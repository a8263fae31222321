"""The one runner skeleton, driven by hand (no threads, no event loop): what it asks the runtime
to do, and what it reports to the poll thread."""

from __future__ import annotations

from queue import SimpleQueue
from typing import cast

from kworkers.clock import FakeClock
from kworkers.consumer.breaker import Breaker, BreakerPolicy
from kworkers.consumer.partition import Item, Partition, PartitionState, Poisoned
from kworkers.consumer.ports import Completion
from kworkers.consumer.runner import Runner
from kworkers.consumer.steps import HandOffRequest, HandOffs, Runtime, Steps
from kworkers.message import Message


class _NoRuntime:
    is_async = False
    is_inline = False

    def run(self, *_a: object) -> None:
        raise AssertionError("the test drives the skeleton itself")

    def contended(self) -> bool:
        return False

    def shutdown(self) -> None:
        pass


class _HandOffs:
    def has_room(self) -> bool:
        return True

    def wait_room(self, ps: Partition) -> bool:
        return True

    def submit(self, ps: Partition, msg: Message, exc: BaseException) -> bool:
        return True

    def tick(self) -> None:
        pass

    def acknowledged(self) -> list[Completion]:
        return []


def _runner(timeout: float | None = None, breaker: Breaker | None = None) -> Runner:
    # partial fakes (no outputs to emit; the test drives the skeleton, no runtime runs it)
    return Runner(lambda m: None, lambda h, m: h(m), cast(HandOffs, _HandOffs()),
                  cast(Runtime, _NoRuntime()), FakeClock(), timeout, SimpleQueue(), breaker)


def _msgs(*offsets: int) -> list[Item]:
    return [Message("t", 0, o, None, b"") for o in offsets]


def _drive(steps: Steps, fail: set[int], hand_off: bool = True) -> list[str]:
    """Runs the skeleton: records in ``fail`` raise; returns what it was asked, in order."""
    asked: list[str] = []
    try:
        req = next(steps)
        while True:
            if isinstance(req, HandOffRequest):
                asked.append(f"hand-off {req.msg.offset} {type(req.exc).__name__}")
                req = steps.send(hand_off)
            else:
                assert isinstance(req, Message)
                asked.append(f"run {req.offset}")
                req = steps.send(ValueError("x") if req.offset in fail else None)
    except StopIteration:
        return asked


def test_runs_in_order_hands_off_failures_and_reports_each_outcome() -> None:
    r = _runner()
    ps = PartitionState("t", 0)
    start = ps.lane.offer(_msgs(0, 1, 2))
    assert start is not None
    asked = _drive(r.steps(ps.lane, *start, None), fail={1})
    assert asked == ["run 0", "run 1", "hand-off 1 ValueError", "run 2"]
    reported = r.done.get_nowait()
    # offset 1 is the hand-off step's to complete, once the broker acknowledged it
    assert reported[0] is ps and reported[1] == [0, 2]
    assert not ps.lane.running  # the lane went idle


def test_takes_what_was_queued_meanwhile() -> None:
    r = _runner()
    ps = PartitionState("t", 0)
    start = ps.lane.offer(_msgs(0))
    assert start is not None
    steps = r.steps(ps.lane, *start, None)
    assert next(steps) == _msgs(0)[0]
    assert ps.lane.offer(_msgs(1)) is None  # the poll thread enqueued while offset 0 ran
    assert _drive_rest(steps) == ["run 1"]


def _drive_rest(steps: Steps) -> list[str]:
    asked = []
    try:
        req = steps.send(None)
        while True:
            assert not isinstance(req, HandOffRequest)
            assert isinstance(req, Message)
            asked.append(f"run {req.offset}")
            req = steps.send(None)
    except StopIteration:
        return asked


def test_a_poisoned_record_is_handed_off_without_running() -> None:
    r = _runner()
    ps = PartitionState("t", 0)
    bad = Poisoned(Message("t", 0, 0, None, b""), ValueError("corrupt header"))
    asked = _drive(r.steps(ps.lane, [bad, *_msgs(1)], 0, None), fail=set())
    assert asked == ["hand-off 0 ValueError", "run 1"]


def test_a_revoke_stops_the_runner_and_drops_the_queue() -> None:
    r = _runner()
    ps = PartitionState("t", 0)
    start = ps.lane.offer(_msgs(0, 1))
    assert start is not None
    steps = r.steps(ps.lane, *start, None)
    next(steps)
    assert ps.lane.offer(_msgs(2)) is None
    ps.stop_dispatch()
    try:
        steps.send(None)
        raise AssertionError("the runner should have stopped")
    except StopIteration:
        pass
    assert r.done.get_nowait()[1] == [0]  # offset 0 finished and is reported; 1 never ran
    assert ps.lane.idle()


def test_an_abandoned_hand_off_completes_nothing_after_it() -> None:
    r = _runner()
    ps = PartitionState("t", 0)
    asked = _drive(r.steps(ps.lane, _msgs(0, 1, 2), 0, None), fail={1}, hand_off=False)
    assert asked == ["run 0", "run 1", "hand-off 1 ValueError"]
    assert r.done.get_nowait()[1] == [0]


def test_a_lane_taken_by_the_deadline_fences_the_late_result() -> None:
    r = _runner(timeout=1.0)
    ps = PartitionState("t", 0)
    start = ps.lane.offer(_msgs(0, 1))
    assert start is not None
    steps = r.steps(ps.lane, *start, None)
    assert next(steps) == _msgs(0)[0]
    assert ps.lane.current == _msgs(0)[0]  # watched
    cur = ps.lane.current
    assert cur is not None
    taken = ps.lane.take_over(cur)  # the watchdog took the lane while offset 0 was stuck
    assert taken is not None and taken[1] == 1
    try:
        steps.send(None)  # offset 0's late result
        raise AssertionError("the stale runner should have stopped")
    except StopIteration:
        pass
    assert r.done.empty()  # nothing completed by the stale runner


def test_a_fresh_runner_hands_off_the_timed_out_record_first() -> None:
    r = _runner(timeout=1.0)
    ps = PartitionState("t", 0)
    stuck = Message("t", 0, 0, None, b"")
    start = ps.lane.offer([stuck, *_msgs(1)])
    assert start is not None and ps.lane.begin(start[1], stuck, 0.0, start[0], 0)
    taken = ps.lane.take_over(stuck)  # the watchdog that starts this runner
    assert taken is not None
    rest, inc, timed_out = taken
    asked = _drive(r.steps(ps.lane, rest, inc, timed_out), fail=set())
    assert asked == ["hand-off 0 TimeoutError", "run 1"]


def test_an_open_breaker_holds_the_lane_in_order_and_lets_one_probe_through() -> None:
    clock = FakeClock()
    b = Breaker(BreakerPolicy(min_attempts=2, window_s=10, cooldown_s=5), clock)
    r = _runner(breaker=b)
    ps = PartitionState("t", 0)
    start = ps.lane.offer(_msgs(0, 1, 2, 3))
    assert start is not None
    assert ps.lane.offer(_msgs(9)) is None  # enqueued behind the batch meanwhile
    asked = _drive(r.steps(ps.lane, *start, None), fail={0, 1})
    # two retryable failures of two attempts: open; offsets 2, 3 are held, not run
    assert asked == ["run 0", "hand-off 0 ValueError", "run 1", "hand-off 1 ValueError"]
    assert [m.offset for m in ps.lane.queued()] == [2, 3, 9]  # type: ignore[union-attr]
    assert not ps.lane.running and ps.lane.held()
    clock.advance(7)  # past the cool-down (at most 5 s + a fifth of jitter)
    again = ps.lane.offer([])  # the poll loop restarts the lane it held
    assert again is not None
    asked = _drive(r.steps(ps.lane, *again, None), fail=set())
    assert asked == ["run 2", "run 3", "run 9"]  # the probe succeeded: closed again
