"""The share loop against a model of a share partition: what is acknowledged, when, and how.

``ModelShare`` is not a mock of the client but a small model of the broker's rules measured on
Kafka 4.3.1 with confluent-kafka 2.16.1 (docs/SHARE_GROUPS.md): a record is acquired with a
delivery count one higher each time, a release makes it available again, the broker archives it
once the count reaches the group's limit, and ``poll`` refuses while a record of the previous
poll is unacknowledged (the real client raises ``IllegalStateException``, a ``RuntimeError``).
The worker is built through its front door, ``Worker(mode="share", consumer=..., sender=...)``;
the same scenarios run on the real broker in tests/integration and tests/faults.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any, cast

import pytest

from kworkers import NonRetryableError, RetryableError, RetryPolicy, TierLadder, Worker
from kworkers.consumer.ports import ConsumerPort, Delivered
from kworkers.errors import WorkerFailed
from kworkers.message import Headers, Message
from kworkers.share import delivery_count
from kworkers.share.ports import AckFailure, AckType, Acquired, GroupSettings, RecordKey

TOPIC = "t"


class ModelShare:
    """One share group on one topic, as the broker keeps it."""

    def __init__(self, n: int, *, partitions: int = 2, limit: int = 5, lock_s: float = 30.0,
                 batch: int = 50, first_deliveries: dict[int, int] | None = None) -> None:
        self.group = "g"
        self.limit = limit
        self.lock_s = lock_s
        self.batch = batch
        self.records = {(TOPIC, o % partitions, o): Message(TOPIC, o % partitions, o, b"k",
                                                             str(o).encode())
                        for o in range(n)}
        self.available = list(self.records)
        self.deliveries: Counter[RecordKey] = Counter(
            {self._key(o): d - 1 for o, d in (first_deliveries or {}).items()})
        self.outstanding: set[RecordKey] = set()  # acquired by the last poll, not acknowledged
        self.acks: list[tuple[RecordKey, AckType]] = []
        self.archived: set[RecordKey] = set()
        self.done: set[RecordKey] = set()
        self.refuse: list[AckFailure] = []
        self.reset: str | None = None
        self.closed = False
        self.flushes = 0
        self.lock = threading.Lock()
        self.events: list[str] = []

    def _key(self, offset: int) -> RecordKey:
        return next(k for k in self.records if k[2] == offset)

    def subscribe(self, topics: Iterable[str]) -> None:
        assert list(topics) == [TOPIC]

    def poll(self, timeout: float) -> list[Acquired]:
        with self.lock:
            if self.outstanding:
                raise RuntimeError(f"{len(self.outstanding)} records from previous poll have "
                                   "not been acknowledged")
            out: list[Acquired] = []
            while self.available and len(out) < self.batch:
                key = self.available.pop(0)
                self.deliveries[key] += 1
                self.outstanding.add(key)
                out.append(Acquired(self.records[key], self.deliveries[key]))
        if not out:
            time.sleep(min(timeout, 0.005))
        return out

    def acknowledge(self, key: RecordKey, kind: AckType) -> None:
        with self.lock:
            assert key in self.outstanding, f"{key} acknowledged but not held"
            self.outstanding.discard(key)
            self.acks.append((key, kind))
            self.events.append(f"{kind} {key[2]}")
            if kind == "accept":
                self.done.add(key)
            elif kind == "reject" or self.deliveries[key] >= self.limit:
                self.archived.add(key)  # the broker's silent archive at the limit
            else:
                self.available.append(key)

    def flush(self, wait: float | None = None) -> None:
        self.flushes += 1

    def ack_failures(self) -> list[AckFailure]:
        out, self.refuse = self.refuse, []
        return out

    def close(self) -> None:
        with self.lock:  # the broker releases what a leaving member held
            for key in list(self.outstanding):
                self.outstanding.discard(key)
                self.available.append(key)
            self.closed = True

    def group_settings(self) -> GroupSettings:
        return GroupSettings(self.lock_s, self.limit, "latest", True)

    def ensure_offset_reset(self, reset: str) -> None:
        self.reset = reset

    def high_watermarks(self, tps: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return {tp: max(o for t, p, o in self.records if (t, p) == tp) + 1 for tp in tps}

    def settled(self) -> bool:
        with self.lock:
            return not self.available and not self.outstanding


class TierStub:
    """An empty consumer for the retry group (``ConsumerPort``)."""

    def __init__(self, group: str) -> None:
        self.group = group

    def subscribe(self, topics: Any, on_assign: Any, on_revoke: Any, on_lost: Any) -> None:
        return None

    def poll_batch(self, n: int, timeout: float) -> list[Message]:
        time.sleep(min(timeout, 0.01))
        return []

    def commit_async(self, positions: Any) -> None:
        return None

    def commit_results(self) -> list[Any]:
        return []

    def coordinator_contact(self) -> float | None:
        return None

    def session_timeout(self) -> float | None:
        return None

    def pause(self, tps: Any) -> None:
        return None

    resume = pause

    def watermarks(self, tp: Any, timeout: float) -> tuple[int, int]:
        raise LookupError

    def caught_up(self, tp: Any) -> bool:
        return False  # unsure: backpressure pauses, never holds

    def position(self, tps: Any) -> dict[Any, int | None]:
        return dict.fromkeys(tps)

    def close(self) -> None:
        return None

    def is_retryable(self, exc: BaseException) -> bool:
        return False


class Sender:
    """Hand-offs whose acknowledgement the test controls (``hold``) and logs."""

    def __init__(self, model: ModelShare, hold: bool = False) -> None:
        self.model = model
        self.hold = hold
        self.sent: list[tuple[str, bytes | None, Headers]] = []
        self.pending: list[tuple[Future[None], bytes | None]] = []

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             headers: Headers, done: Delivered) -> None:
        f: Future[None] = Future()
        f.add_done_callback(lambda x: done(x.exception()))
        self.sent.append((topic, value, headers))
        self.model.events.append(f"sent {topic} {value!r}")
        if self.hold:
            self.pending.append((f, value))
        else:
            self.model.events.append(f"acked {value!r}")
            f.set_result(None)

    def release(self) -> None:
        for f, value in self.pending:
            self.model.events.append(f"acked {value!r}")
            f.set_result(None)
        self.pending = []


def _tier(group: str) -> ConsumerPort:
    """The retry group's stub: a partial ``ConsumerPort`` (no ``group_metadata`` or
    ``is_rebalancing``: its commits never fail, and there is no transaction)."""
    return cast(ConsumerPort, TierStub(group))


def _worker(model: ModelShare, handler: Callable[[Message], Any], sender: Sender | None = None,
            **cfg: Any) -> tuple[Worker, Sender, threading.Thread]:
    sender = sender or Sender(model)
    w = Worker(TOPIC, "g", mode="share", sender=sender,
               consumer=lambda g: model if g == "g" else _tier(g), **cfg)
    w.handler(handler)

    def run() -> None:
        with contextlib.suppress(WorkerFailed):  # the test reads w.fault
            w.run(install_signals=False)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return w, sender, t


def _until(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.005)


def _stop(w: Worker, t: threading.Thread) -> None:
    w.stop()
    t.join(30)
    assert not t.is_alive()
    assert w.fault is None, w.fault


def test_every_record_is_accepted_once_and_poll_waits_for_all_acknowledgements() -> None:
    model = ModelShare(400, batch=60)
    calls: Counter[int] = Counter()
    lock = threading.Lock()

    def handle(msg: Message) -> None:
        with lock:
            calls[msg.offset] += 1
        time.sleep(0.0005 if msg.offset % 7 else 0.01)

    w, _s, t = _worker(model, handle, concurrency=4)
    _until(model.settled)
    _stop(w, t)
    # the model raises (and the loop dies) if poll is called with a record unacknowledged
    assert len(model.done) == 400 and not model.archived
    assert Counter(kind for _k, kind in model.acks) == {"accept": 400}
    assert set(calls) == set(range(400)) and max(calls.values()) == 1
    assert model.reset == "earliest"  # a new group starts at the log start, as partitioned does


def test_a_failure_is_accepted_only_after_its_hand_off_is_acknowledged() -> None:
    model = ModelShare(6, batch=6)
    sender = Sender(model, hold=True)

    def handle(msg: Message) -> None:
        if msg.offset == 2:
            raise RetryableError("Flaky", "try later")
        if msg.offset == 4:
            raise NonRetryableError("Bad", "never")

    w, _s, t = _worker(model, handle, sender, retry=RetryPolicy(max_attempts=3),
                       tiers=TierLadder((1.0,)))
    _until(lambda: len(sender.pending) == 2 and len(model.done) == 4)
    time.sleep(0.1)
    assert {k[2] for k in model.done} == {0, 1, 3, 5}  # 2 and 4 wait for their hand-off
    sender.release()
    _until(model.settled)
    _stop(w, t)
    assert [(topic, v) for topic, v, _h in sender.sent] == [("t.retry.1s", b"2"), ("t.dlq", b"4")]
    for value in (b"2", b"4"):
        assert model.events.index(f"acked {value!r}") < model.events.index(
            f"accept {int(value)}")


@pytest.mark.parametrize("broken", [False, True], ids=["rule", "canary-no-rule"])
def test_a_record_on_its_last_delivery_goes_to_the_dlq_without_running(
        broken: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offset 1 arrives on delivery 3 of 3 (two crashes before). Canary: without the rule the
    handler runs once more, crashes again (here: a release, as a dead holder's records are),
    and the broker archives the record: it is in neither the DLQ nor done."""
    if broken:
        from kworkers.share.rules import ShareRules

        monkeypatch.setattr(ShareRules, "is_last_delivery", lambda self, n: False)
    model = ModelShare(3, limit=3, first_deliveries={1: 3})
    ran: list[int] = []

    def handle(msg: Message) -> None:
        ran.append(msg.offset)
        if msg.offset == 1:
            raise SystemExit("the process dies on this record")  # a runner crash, as a kill

    w, sender, t = _worker(model, handle)
    _until(lambda: len(model.done) + len(model.archived) >= (2 if broken else 3))
    w.stop()
    t.join(30)
    dead = [v for topic, v, _h in sender.sent if topic == "t.dlq"]
    if broken:
        assert 1 in ran and dead == [] and model.archived == {(TOPIC, 1, 1)}  # lost
        return
    assert 1 not in ran and dead == [b"1"] and (TOPIC, 1, 1) in model.done
    headers = dict(sender.sent[0][2])
    assert headers["kw-error-type"] == b"DeliveryLimitReached"


def test_a_graceful_stop_releases_unstarted_records_at_once() -> None:
    model = ModelShare(50, batch=50, partitions=1)
    started, release = threading.Event(), threading.Event()
    ran: list[int] = []

    def handle(msg: Message) -> None:
        ran.append(msg.offset)
        if msg.offset == 0:
            started.set()
            release.wait(10)

    w, _s, t = _worker(model, handle, concurrency=1)
    assert started.wait(10)
    stopper = threading.Thread(target=w.stop)
    stopper.start()
    _until(lambda: sum(1 for _k, kind in model.acks if kind == "release") == 49)
    assert ran == [0]  # the other 49 were released while offset 0 still ran
    release.set()
    t.join(30)
    assert model.acks[-1] == ((TOPIC, 0, 0), "accept")  # the started record finished
    assert model.closed


def test_a_record_that_can_no_longer_start_under_its_lock_is_released() -> None:
    """Lock 3 s, deadline 0.95 s, margin 1 s: a record may start within 1.05 s of its
    acquisition. One lane, offsets 0 and 1 take 0.6 s each: offset 2 would start at 1.2 s."""
    model = ModelShare(3, batch=3, partitions=1, lock_s=3.0)
    ran: list[int] = []

    def handle(msg: Message) -> None:
        ran.append(msg.offset)
        if msg.offset < 2 and delivery_count(msg) == 1:
            time.sleep(0.6)

    w, _s, t = _worker(model, handle, concurrency=1, message_timeout=0.95)
    _until(lambda: len(model.done) == 3)
    _stop(w, t)
    kinds = [(k[2], kind) for k, kind in model.acks]
    assert (2, "release") in kinds  # back to the group instead of overrunning its lock
    assert ran.count(2) == 1 and model.deliveries[(TOPIC, 0, 2)] == 2


def test_the_handler_sees_the_delivery_count() -> None:
    model = ModelShare(4, batch=4, partitions=1, first_deliveries={2: 3})
    seen: dict[int, int | None] = {}

    def handle(msg: Message) -> None:
        seen[msg.offset] = delivery_count(msg)

    w, _s, t = _worker(model, handle)
    _until(model.settled)
    _stop(w, t)
    assert seen == {0: 1, 1: 1, 2: 3, 3: 1}
    assert w.metrics.share_redeliveries.labels("g")._value.get() == 1


def test_refused_acknowledgements_are_counted() -> None:
    model = ModelShare(3, batch=3)
    model.refuse = [AckFailure(TOPIC, 0, frozenset({0, 2}), "INVALID_RECORD_STATE")]
    w, _s, t = _worker(model, lambda m: None)
    _until(model.settled)
    _stop(w, t)
    assert w.metrics.share_ack_failures.labels("g")._value.get() == 2


def test_a_deadline_longer_than_the_lock_allows_is_refused_before_anything_runs() -> None:
    model = ModelShare(3, lock_s=15.0)
    w = Worker(TOPIC, "g", mode="share", sender=Sender(model), message_timeout=14.0,
               consumer=lambda g: model if g == "g" else _tier(g))
    w.handler(lambda m: None)
    from kworkers import ConfigError

    with pytest.raises(ConfigError, match="message_timeout"):
        w.run(install_signals=False)
    assert not model.acks


def test_async_handlers_run_in_share_mode_too() -> None:
    import asyncio

    model = ModelShare(120, batch=40)
    seen: list[tuple[int, int | None]] = []

    async def handle(msg: Message) -> None:
        await asyncio.sleep(0.001)
        seen.append((msg.offset, delivery_count(msg)))
        if msg.offset == 5:
            raise RetryableError("Flaky", "once")

    w, sender, t = _worker(model, handle, concurrency=8)
    _until(model.settled)
    _stop(w, t)
    assert sorted(o for o, _dc in seen) == list(range(120))
    assert {dc for _o, dc in seen} == {1}
    assert [(topic, v) for topic, v, _h in sender.sent] == [("t.retry.1s", b"5")]
    assert Counter(kind for _k, kind in model.acks) == {"accept": 120}


def test_batch_handlers_are_refused_in_share_mode() -> None:
    from kworkers import ConfigError

    model = ModelShare(3)
    w = Worker(TOPIC, "g", mode="share", sender=Sender(model),
               consumer=lambda g: model if g == "g" else _tier(g))
    w.batch_handler(lambda msgs: None)
    with pytest.raises(ConfigError, match="batch handlers are not supported in share mode"):
        w.run(install_signals=False)
    assert not model.acks
