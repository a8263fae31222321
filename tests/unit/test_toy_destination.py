"""A destination a user adds is one class and one registration (issue #48, item 1): here a
parking topic for one error type, defined in this file alone, taken through the real router and
hand-off step with a sender whose acknowledgements the test controls. Nothing in kworkers names
it: the step asks its ``Destination`` what it counts as and where a refusal falls back to."""

from __future__ import annotations

import threading
import time
from queue import SimpleQueue

from kworkers import Worker
from kworkers.clock import FakeClock
from kworkers.consumer.buffered import BufferedHandOffs
from kworkers.consumer.handoff import HandOffStep
from kworkers.consumer.outputs import OutputBuffer
from kworkers.consumer.partition import PartitionState
from kworkers.consumer.ports import Completion
from kworkers.message import Message
from kworkers.metrics import Metrics
from kworkers.retry_tiers import DLQ, RETRY, Destination
from kworkers.retry_tiers.headers import dlq_reason_of, failure_of
from kworkers.retry_tiers.policy import RetryPolicy, no_jitter
from kworkers.retry_tiers.router import FailureRouter
from kworkers.retry_tiers.tiers import TierLadder
from kworkers.supervision import Supervisor
from tests.unit.test_handoff_step import HeldSender, Refused
from tests.unit.test_loop_with_fake_consumer import RecordingSender, ScriptedConsumer, _idle


class QuotaExceeded(Exception):
    """The failure the toy destination parks: retrying soon would not help."""


# --- the toy destination: one class -------------------------------------------------------

class Parking:
    """Parks quota failures on ``<source>.parking``, for a person to look at."""

    destination = Destination("parking", retried=False, falls_back=True)

    def topic_for(self, msg: Message, exc: BaseException, source: str) -> str | None:
        return f"{source}.parking" if isinstance(exc, QuotaExceeded) else None


# --- and one registration: ``routes=[Parking()]`` -----------------------------------------

def _router(clock: FakeClock) -> FailureRouter:
    return FailureRouter(RetryPolicy(initial=1, max_attempts=3), TierLadder((1.0, 5.0)), "g",
                         no_jitter, clock, routes=[Parking()])


def _step() -> tuple[HandOffStep, HeldSender, SimpleQueue[Completion], Supervisor, FakeClock,
                     Metrics]:
    clock = FakeClock(1000.0)
    sender, done, sup, metrics = HeldSender(), SimpleQueue[Completion](), Supervisor(), Metrics()
    step = HandOffStep(_router(clock), sender, metrics, "g", done, clock, threading.Event(), sup,
                       lambda e: e.kind if isinstance(e, Refused) else "transient")
    return step, sender, done, sup, clock, metrics


def _msg(offset: int, attempt: int = 1) -> Message:
    return Message("orders", 0, offset, b"k", b"v", (), None, attempt)


def test_the_route_takes_its_failure_and_leaves_the_others_to_the_policy() -> None:
    router = _router(FakeClock(1000.0))
    parked = router.plan(_msg(0), QuotaExceeded("over quota"))
    assert (parked.destination, parked.topic) == (Parking.destination, "orders.parking")
    assert dlq_reason_of(parked.headers) == "parking"
    info = failure_of(parked.headers)
    assert info is not None and (info.error_type, info.original_offset) == ("QuotaExceeded", 0)
    assert router.plan(_msg(1), ValueError("down")).destination is RETRY
    assert router.plan(_msg(2, attempt=3), ValueError("down")).destination is DLQ


def test_a_parked_record_goes_through_the_hand_off_step_and_counts_as_a_dead_letter() -> None:
    step, sender, done, sup, _clock, metrics = _step()
    ps = PartitionState("orders", 0)
    assert step.submit(ps, _msg(0), QuotaExceeded("over quota"))
    assert step.submit(ps, _msg(1), ValueError("down"))
    assert [t for t, _f in sender.sent] == ["orders.parking", "orders.retry.1s"]
    for _t, fut in sender.sent:
        fut.set_result(None)
    assert not done.empty()
    while not done.empty():
        done.get_nowait()  # the wake-up
    assert [(c[1], c[2], c[3]) for c in step.acknowledged()] == [([0, 1], 1, 1)]
    assert metrics.dead_letters.labels("g", "QuotaExceeded")._value.get() == 1
    assert metrics.retries.labels("g", "1s")._value.get() == 1
    # its own label for refused sends, shown at 0 from the start
    assert metrics.handoff_failures.labels("g", "parking")._value.get() == 0
    assert sup.fault is None


def test_a_parking_topic_refusing_for_good_falls_back_to_the_dlq() -> None:
    step, sender, _done, sup, _clock, metrics = _step()
    ps = PartitionState("orders", 0)
    step.submit(ps, _msg(0), QuotaExceeded("over quota"))
    sender.sent[0][1].set_exception(Refused("permanent"))
    assert metrics.handoff_failures.labels("g", "parking")._value.get() == 1
    step.tick()
    assert [t for t, _f in sender.sent] == ["orders.parking", "orders.dlq"]
    assert sup.fault is None  # only the DLQ itself refusing fails the worker


def test_exactly_once_the_parked_record_waits_for_the_transaction_like_any_hand_off() -> None:
    clock = FakeClock(1000.0)
    buf, done = OutputBuffer(), SimpleQueue[Completion]()
    step = BufferedHandOffs(_router(clock), buf, Metrics(), "g", done, threading.Event(),
                            Supervisor(), 100, clock)
    ps = PartitionState("orders", 0)
    assert step.submit(ps, _msg(0), QuotaExceeded("over quota"))
    (entry,) = buf.take(ps, 1)
    assert [o.topic for o in entry.outputs] == ["orders.parking"]
    assert (entry.retried, entry.dead, entry.falls_back) == (0, 1, True)
    assert done.get_nowait()[1:4] == ([0], 0, 1)
    refused = step.dead_letter(entry, Refused("permanent"))  # the transaction's refusal
    assert [o.topic for o in refused.outputs] == ["orders.dlq"] and not refused.falls_back


def test_a_worker_registers_it_with_one_argument() -> None:
    """The same class from the user's seat: ``Worker(..., routes=[Parking()])``, a scripted
    consumer and a recording sender (no broker)."""
    consumer = ScriptedConsumer([Message("t", 0, o, b"k", b"%d" % o) for o in range(2)], [])
    sender = RecordingSender()
    worker = Worker(topics=["t"], group_id="g", sender=sender, routes=[Parking()],
                    consumer=lambda group: consumer if group == "g" else _idle(group))

    @worker.handler
    def handle(msg: Message) -> None:
        raise QuotaExceeded("over quota") if msg.offset == 0 else ValueError("down")

    t = threading.Thread(target=worker.run, args=(False,), daemon=True)
    t.start()
    consumer.go.set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(
            pos.get(("t", 0)) == 2 for pos, _ in consumer.commits):
        time.sleep(0.01)
    worker.stop()
    t.join(30)
    assert any(pos.get(("t", 0)) == 2 for pos, _ in consumer.commits)  # both handed off
    assert ("t.parking", b"0") in sender.sent
    assert [v for topic, v in sender.sent if topic.startswith("t.retry.")] == [b"1"]
    assert worker.metrics.dead_letters.labels("g", "QuotaExceeded")._value.get() == 1
