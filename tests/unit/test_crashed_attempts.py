"""Crashes are attempts, a busy lease is not (issue #43, item 2), without a broker.

A worker on scripted consumers whose hand-offs loop back: a tier record is fed to the retry
loop's consumer, a dead letter kept. The broker-level proofs, with worker processes SIGKILLed
and restarted, are ``tests/faults/test_crash_attempts.py``.

- A key leased by an attempt whose worker died: the record waits for the lease's end (no
  attempt spent, no ``LeaseBusy`` dead letter), then the takeover counts the dead attempt as
  failed (``AttemptCrashed``) and the next attempt runs with its last heartbeat details.
  Canary: the rule before, a busy lease a failed attempt, dead-letters it as ``LeaseBusy``.
- The same key twice in one process (``LiveAttempts``): the second waits, then finds it done.
- The takeover of an expired lease at the last attempt: the DLQ as ``AttemptCrashed``, the
  handler not run. Canary: the rule before (the takeover runs) never gets there.
- Heartbeat details without a store travel on the tier record (``kw-checkpoint``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path

import pytest

from kworkers import RetryableError, RetryPolicy, TierLadder, Worker, activity
from kworkers.activity import id_headers
from kworkers.consumer import runner as runner_module
from kworkers.consumer.ports import Delivered
from kworkers.idempotency import SqliteStore
from kworkers.message import Headers, Message
from kworkers.retry_tiers.headers import ATTEMPT, CHECKPOINT, DLQ_REASON, ERROR_TYPE
from tests.tier_records import retry_record_headers
from tests.unit.test_loop_with_fake_consumer import ScriptedConsumer

TP = tuple[str, int]
TIER = "t.retry.50ms"
KEY = "wf-1/charge"


class _Assigned(ScriptedConsumer):
    """A scripted consumer assigned ``tps`` from the start, fed while it runs."""

    def __init__(self, tps: Iterable[TP], group: str, records: list[Message] | None = None):
        super().__init__(records or [], [], group)
        self.tps = sorted(tps)
        self.go.set()

    def subscribe(self, topics: Iterable[str], on_assign: Callable[[list[TP]], None],
                  on_revoke: Callable[[list[TP]], None],
                  on_lost: Callable[[list[TP]], None]) -> None:
        self.on_assign, self.on_revoke = on_assign, on_revoke
        on_assign(self.tps)

    def feed(self, msg: Message) -> None:
        with self.lock:
            self.records.append(msg)


class Loopback:
    """Hand-offs as the broker would take them: tier records to the retry loop, dead letters
    kept (with their headers)."""

    def __init__(self, tier: _Assigned) -> None:
        self.tier = tier
        self.offsets: dict[str, int] = {}
        self.tiered: list[dict[str, bytes]] = []
        self.dead: list[dict[str, bytes]] = []

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers,
             done: Delivered) -> None:
        if topic.endswith(".dlq"):
            self.dead.append(dict(headers))
        else:
            n = self.offsets.get(topic, 0)
            self.offsets[topic] = n + 1
            self.tiered.append(dict(headers))
            self.tier.feed(Message(topic, 0, n, key, value, headers))
        f: Future[None] = Future()
        f.add_done_callback(lambda x: done(x.exception()))
        f.set_result(None)


def _worker(main: list[Message], tmp: Path | None, *, max_attempts: int = 2,
            lease_s: float = 0.6, tier: list[Message] | None = None
            ) -> tuple[Worker, Loopback, SqliteStore | None]:
    main_c = _Assigned({(m.topic, m.partition) for m in main} or {("t", 0)}, "g", main)
    tier_c = _Assigned({(TIER, 0)}, "g.retry", tier)
    sender = Loopback(tier_c)
    store = SqliteStore(str(tmp / "store.db")) if tmp is not None else None
    w = Worker(topics=["t"], group_id="g", concurrency=4, sender=sender,
               consumer=lambda g: main_c if g == "g" else tier_c, idempotency=store,
               lease_s=lease_s, tiers=TierLadder((0.05,)), drain_timeout=1.0,
               retry=RetryPolicy(initial=0.05, backoff=1.0, max_interval=0.05,
                                 max_attempts=max_attempts))
    return w, sender, store


def _record(partition: int = 0, offset: int = 0) -> Message:
    return Message("t", partition, offset, b"k", b"v", id_headers("wf-1", "charge"))


def _run(w: Worker, until: Callable[[], bool], timeout: float = 20.0) -> None:
    t = threading.Thread(target=w.run, args=(False,), daemon=True)
    t.start()
    try:
        end = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < end, "timed out"
            time.sleep(0.01)
        time.sleep(0.3)  # anything more that would happen
    finally:
        w.stop()
        t.join(30)


def _dead_attempt(store: SqliteStore, lease_s: float) -> float:
    """A worker that claimed the key, heartbeated and died: its lease runs out in
    ``lease_s``."""
    now = time.time()
    c = store.claim(KEY, "dead-worker", lease_s, now)
    store.heartbeat(KEY, c.token, b"ckpt-3", lease_s, now)
    return now + lease_s


# ---------------------------------------------------------------- a dead attempt's lease


def test_a_dead_attempts_lease_is_waited_out_then_the_takeover_runs_with_its_checkpoint(
        tmp_path: Path) -> None:
    w, sender, store = _worker([_record()], tmp_path)
    assert store is not None
    ends = _dead_attempt(store, 0.8)
    ran: list[tuple[int, bytes | None, float]] = []

    @w.handler
    def handle(msg: Message) -> None:
        ran.append((activity.attempt(), activity.heartbeat_details(), time.time()))

    _run(w, lambda: bool(ran))
    assert [(a, d) for a, d, _t in ran] == [(2, b"ckpt-3")]
    assert ran[0][2] >= ends  # never while the dead attempt's lease was live
    assert sender.dead == []  # never dead-lettered as LeaseBusy
    assert [(h[ERROR_TYPE], h[ATTEMPT]) for h in sender.tiered] == [(b"AttemptCrashed", b"2")]
    assert store.is_done(KEY)


def test_canary_a_busy_lease_counted_as_a_failed_attempt_dead_letters_work_that_never_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module, "LEASES_WAIT", False)  # the rule before issue #43
    w, sender, store = _worker([_record()], tmp_path)
    assert store is not None
    _dead_attempt(store, 5.0)
    ran: list[int] = []
    w.handler(lambda msg: ran.append(1))
    _run(w, lambda: bool(sender.dead))
    assert [h[ERROR_TYPE] for h in sender.dead] == [b"LeaseBusy"] and ran == []


@pytest.mark.parametrize("canary", [False, True])
def test_the_same_key_twice_in_one_process_waits_for_the_first_then_finds_it_done(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, canary: bool) -> None:
    """The canary (the rule before issue #43) hands the second to a tier as ``LeaseBusy``."""
    if canary:
        monkeypatch.setattr(runner_module, "LEASES_WAIT", False)
    w, sender, _store = _worker([_record(0), _record(1)], tmp_path, lease_s=5.0)
    entered, release = threading.Event(), threading.Event()
    ran: list[int] = []

    @w.handler
    def handle(msg: Message) -> None:
        ran.append(msg.partition)
        entered.set()
        release.wait(10)

    waiting: list[dict[TP, float]] = []

    def first_holds_then_returns() -> bool:
        if entered.is_set() and not release.is_set():
            time.sleep(0.5)  # the second is refused meanwhile
            waiting.append(w.loops[0].runner.lease_waits())
            release.set()
        return release.is_set()

    _run(w, first_holds_then_returns)
    time.sleep(1.2)  # the second asks again within RECLAIM_S and finds the key done
    assert len(ran) == 1
    if canary:  # busy at attempt 1, busy again at attempt 2 of 2: dead, never having failed
        assert [h[ERROR_TYPE] for h in sender.tiered] == [b"LeaseBusy"], sender.tiered
        assert [h[ERROR_TYPE] for h in sender.dead] == [b"LeaseBusy"], sender.dead
    else:
        assert sender.tiered == [] and sender.dead == []
        assert len(waiting) == 1 and len(waiting[0]) == 1, waiting  # a lease hold, seen


# ---------------------------------------------------------------- crashes are attempts


def _crashed_at(attempt: int) -> list[Message]:
    """The record as a tier record of ``attempt``, its lease left by a dead attempt."""
    headers = (*id_headers("wf-1", "charge"),
               *retry_record_headers(TIER, "g", time.time(), attempt=attempt))
    return [Message(TIER, 0, 0, b"k", b"v", headers)]


def test_a_takeover_at_the_last_attempt_dead_letters_it_as_attempt_crashed_unrun(
        tmp_path: Path) -> None:
    w, sender, store = _worker([], tmp_path, max_attempts=2, tier=_crashed_at(2))
    assert store is not None
    _dead_attempt(store, 0.01)
    time.sleep(0.05)  # expired
    ran: list[int] = []
    w.handler(lambda msg: ran.append(1))
    _run(w, lambda: bool(sender.dead))
    [dead] = sender.dead
    assert (dead[ERROR_TYPE], dead[ATTEMPT], dead[DLQ_REASON]) == (
        b"AttemptCrashed", b"2", b"exhausted")
    assert ran == [] and store.details(KEY) == b"ckpt-3" and not store.is_done(KEY)


def test_canary_a_takeover_that_runs_never_reaches_the_dlq(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(activity, "CRASHES_COUNT", False)  # the rule before issue #43
    w, sender, store = _worker([], tmp_path, max_attempts=2, tier=_crashed_at(2))
    assert store is not None
    _dead_attempt(store, 0.01)
    time.sleep(0.05)
    ran: list[int] = []

    @w.handler
    def handle(msg: Message) -> None:
        ran.append(activity.attempt())

    _run(w, lambda: bool(ran))
    assert ran == [3] and sender.dead == []  # "attempt 3" of 2, and no dead letter


# ---------------------------------------------------------------- checkpoints without a store


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_heartbeat_details_travel_on_the_tier_record_without_a_store(kind: str) -> None:
    w, sender, _store = _worker([_record()], None, max_attempts=3)
    seen: list[tuple[int, bytes | None]] = []

    def step() -> None:
        seen.append((activity.attempt(), activity.heartbeat_details()))
        if activity.attempt() == 1:
            activity.record_heartbeat(b"ckpt-3")
        if activity.attempt() < 3:
            raise RetryableError("Flaky", "later")

    if kind == "sync":
        w.handler(lambda msg: step())
    else:
        @w.handler
        async def handle(msg: Message) -> None:
            await asyncio.sleep(0)
            step()

    _run(w, lambda: len(seen) == 3)
    # attempt 2 resumes from attempt 1's checkpoint; attempt 3 (no heartbeat of its own in
    # attempt 2) still from it
    assert seen == [(1, None), (2, b"ckpt-3"), (3, b"ckpt-3")]
    assert [h.get(CHECKPOINT) for h in sender.tiered] == [b"ckpt-3", b"ckpt-3"]


def test_a_source_records_own_checkpoint_header_is_never_believed() -> None:
    forged = Message("t", 0, 0, b"k", b"v", ((CHECKPOINT, b"forged"),))
    w, _sender, _store = _worker([forged], None)
    seen: list[bytes | None] = []
    w.handler(lambda msg: seen.append(activity.heartbeat_details()))
    _run(w, lambda: bool(seen))
    assert seen == [None]


def test_a_record_run_again_after_a_lease_wait_is_one_delivery_in_the_ledger(
        tmp_path: Path) -> None:
    """The test instrument: the runner calls the invoker again with the same record object
    after a ``LeaseBusy`` wait; that is the same delivery (a new object is a new one)."""
    from kworkers.errors import LeaseBusy
    from kworkers.testing.instruments import RecordingInvoker
    from kworkers.testing.ledger import Ledger

    ledger = Ledger(tmp_path / "l.db")
    busy = {"n": 1}

    def inner(handler: Callable[[Message], None], msg: Message) -> None:
        if busy["n"]:
            busy["n"] -= 1
            raise LeaseBusy("k", 0.0, "held")
        handler(msg)

    rec = RecordingInvoker(ledger, inner)
    msg = _record()
    with pytest.raises(LeaseBusy):
        rec(lambda m: None, msg)
    rec(lambda m: None, msg)  # the same record, after the wait
    rec(lambda m: None, _record())  # a redelivery: a new record object
    assert len(ledger.deliveries()) == 2

