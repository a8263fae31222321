"""Supervision: a crashed runner, a dead loop thread or a hung handler call makes the worker
unhealthy, stops it and makes ``run`` raise (so ``kworkers run`` exits non-zero); the timer
heap never overflows however much a tier holds."""

from __future__ import annotations

import asyncio
import threading
import time
from queue import SimpleQueue
from typing import Any, cast

import pytest

from kworkers import RetryPolicy, TierLadder, Worker
from kworkers.clock import FakeClock
from kworkers.consumer.partition import Item, Partition, PartitionState
from kworkers.consumer.ports import Completion
from kworkers.consumer.runner import Runner
from kworkers.consumer.runtime import AsyncRuntime, ThreadRuntime
from kworkers.consumer.steps import HandOffs
from kworkers.consumer.tier_gate import TierGate
from kworkers.errors import WorkerFailed
from kworkers.message import Message
from kworkers.supervision import Supervisor
from tests.integration.conftest import run_to_end, start
from tests.tier_records import retry_record_headers
from tests.unit.test_loop_with_fake_consumer import RecordingSender, ScriptedConsumer, _msgs

TP = tuple[str, int]


class Boom(BaseException):
    """Not an Exception: escapes a handler's ``except Exception`` and the runner's."""


def _worker(main: ScriptedConsumer, tier: ScriptedConsumer | None = None,
            **cfg: Any) -> Worker:  # Worker's own **settings: Any
    tier = tier or ScriptedConsumer([], [], "g.retry")
    for c in (main, tier):
        c.go.set()
    return Worker(topics=["t"], group_id="g", concurrency=2, sender=RecordingSender(),
                  consumer=lambda group: main if group == "g" else tier, **cfg)


def _run(w: Worker) -> BaseException | None:
    return run_to_end(w)


def test_a_crashed_runner_stops_the_worker_with_the_reason() -> None:
    w = _worker(ScriptedConsumer(_msgs(5), []))

    @w.handler
    def handle(msg: Message) -> None:
        if msg.offset == 2:
            raise Boom("a bug that escapes everything")

    err = _run(w)
    assert isinstance(err, WorkerFailed) and "a runner raised Boom" in str(err)
    assert w.fault is not None and w.fault.component.startswith("kworkers-handler")
    assert w.metrics.worker_healthy._value.get() == 0


def test_a_crashed_async_runner_stops_the_worker_with_the_reason() -> None:
    # lanes start on the event loop as tasks (``AsyncRuntime._start_lanes``): a runner's crash
    # reaches the supervisor through the task's done callback
    w = _worker(ScriptedConsumer(_msgs(5), []))

    @w.handler
    async def handle(msg: Message) -> None:
        if msg.offset == 2:
            raise Boom("a bug that escapes everything")

    err = _run(w)
    assert isinstance(err, WorkerFailed) and "a runner raised Boom" in str(err)
    assert w.fault is not None and w.fault.component == "kworkers-asyncio"


def test_a_dead_retry_loop_stops_the_worker_with_the_reason() -> None:
    class Dying(ScriptedConsumer):
        def poll_batch(self, n: int, timeout: float) -> list[Message]:
            raise RuntimeError("the retry loop's consumer broke")

    w = _worker(ScriptedConsumer(_msgs(3), []), Dying([], [], "g.retry"))
    w.handler(lambda msg: None)
    err = _run(w)
    assert isinstance(err, WorkerFailed) and "kworkers-retry-loop" in str(err)


@pytest.mark.parametrize("runtime", ["threads", "asyncio"])
def test_a_handler_call_past_the_stall_bound_is_reported(runtime: str) -> None:
    clock = FakeClock()
    sup = Supervisor()
    release = threading.Event()
    rt: ThreadRuntime | AsyncRuntime
    handler: Any
    if runtime == "threads":
        rt = ThreadRuntime(1, sup, clock)
        handler = lambda m: release.wait(10)  # noqa: E731
    else:  # the async runtime keeps its calls under way in maps of its own (issue #50)
        rt = AsyncRuntime(1, sup, clock)

        async def handler(m: Message) -> None:
            while not release.is_set():
                await asyncio.sleep(0.01)
    # a partial fake (no ``emit``): the handler never produces outputs here
    runner = Runner(handler, lambda h, m: h(m), cast(HandOffs, _NoHandOffs()),
                    rt, clock, None, SimpleQueue())
    ps = PartitionState("t", 0, clock)
    items: list[Item] = list(_msgs(1))
    start = ps.lane.offer(items)
    assert start is not None
    runner.start(ps.lane, *start)
    deadline = time.monotonic() + 10
    while rt.stalled(60.0) is None and time.monotonic() < deadline:
        clock.advance(1)
        time.sleep(0.01)
    stuck = rt.stalled(60.0)
    release.set()
    rt.shutdown()
    assert stuck is not None and "t/0@0" in stuck


class _NoHandOffs:
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


@pytest.mark.parametrize("capacity,batch", [(100, 50), (10, 500)])
def test_the_timer_heap_stays_within_its_bound_and_the_rest_waits_in_kafka(
        capacity: int, batch: int) -> None:
    """Every tier partition is paused at its share of the heap (backpressure) and one poll
    never takes more than the room left: the heap holds about its capacity, never more than
    capacity + max(capacity, partitions) (see ``consumer/backpressure.py``)."""
    tier_topic = "t.retry.1s"
    far = retry_record_headers(tier_topic, "g", time.time() + 3600)
    records = [Message(tier_topic, p, o, b"k", b"v", far) for o in range(400) for p in range(3)]
    tier = ScriptedConsumer(records, [], "g.retry")
    w = _worker(ScriptedConsumer([], []), tier, delay_buffer=capacity, consume_batch=batch,
                tiers=TierLadder((1.0,)), retry=RetryPolicy(max_interval=7200))
    w.handler(lambda msg: None)
    seen: list[int] = []
    t, box = start(w)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (len(w.loops) == 2 and tier.paused):
        if len(w.loops) == 2 and w.loops[1].gate is not None:
            seen.append(len(cast(TierGate, w.loops[1].gate)))  # the tier loop's gate
        time.sleep(0.001)
    time.sleep(0.3)  # a few more steps with every tier partition paused
    heap = len(cast(TierGate, w.loops[1].gate)) if w.loops[1].gate is not None else -1
    w.stop()
    t.join(30)
    assert not box, box
    assert tier.paused == {(tier_topic, p) for p in range(3)}
    bound = capacity + max(capacity, 3)
    assert capacity // 2 <= heap <= bound and max(seen, default=0) <= bound, (heap, seen[-5:])
    assert tier.records  # the rest stayed in Kafka


def test_a_record_the_router_cannot_place_goes_to_its_own_dlq_and_the_rest_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Any exception while routing one failed record (a bug, a check nobody foresaw) is that
    record's failure: it is dead-lettered to the DLQ of the topic it was read from with the
    reason; the partition goes on, the worker stays healthy (issue 15: a ConfigError here
    once stopped a lane for good while /healthz said 200)."""
    from kworkers.retry_tiers.router import FailureRouter

    real = FailureRouter.plan

    def plan(self: FailureRouter, msg: Message, exc: BaseException) -> object:
        if msg.offset == 2:
            raise LookupError("a check nobody foresaw")
        return real(self, msg, exc)

    monkeypatch.setattr(FailureRouter, "plan", plan)
    main, tier = ScriptedConsumer(_msgs(6), []), ScriptedConsumer([], [], "g.retry")
    sender = RecordingSender()
    for c in (main, tier):
        c.go.set()
    w = Worker(topics=["t"], group_id="g", concurrency=2, sender=sender,
               consumer=lambda group: main if group == "g" else tier)
    done: list[int] = []

    @w.handler
    def handle(msg: Message) -> None:
        if msg.offset in (1, 2):
            raise RuntimeError("handler failed")
        done.append(msg.offset)

    t, errors = start(w)
    deadline = time.monotonic() + 30  # bounds a hang only
    while (len(done) < 4 or len(sender.sent) < 2) and time.monotonic() < deadline:
        time.sleep(0.01)
    healthy = w.fault is None
    w.stop()
    t.join(30)
    assert not errors, errors
    assert sorted(done) == [0, 3, 4, 5]
    assert sorted(topic for topic, _v in sender.sent) == ["t.dlq", "t.retry.1s"]
    assert [v for topic, v in sender.sent if topic == "t.dlq"] == [b"2"]
    assert healthy and w.fault is None
