"""Rate limits without a broker: the bucket's decision, the pacer's blocks, and the bound.

The bound (``kworkers.pace.limit``): at most ``burst + per_second * T`` starts in any window of
``T`` seconds, however many replicas take blocks from one bucket and however late in its
lifetime each spends a token. It is checked here on simulated pools (a fake clock, replicas
interleaved at random, starts observed up to ``START_MARGIN_S`` after their token), with two
canaries the same check catches: a bucket that keeps no reserve for unspent blocks, and
replicas that each keep a bucket of their own.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from kworkers import ConfigError
from kworkers.clock import FakeClock
from kworkers.message import Message
from kworkers.pace import LocalBuckets, RateLimit, buckets_for, decide
from kworkers.pace.bucket import Grant
from kworkers.pace.limit import START_MARGIN_S
from kworkers.pace.pacer import Allotment, Pacer
from kworkers.testing.windows import judge

TP = ("t", 0)


# ------------------------------------------------------------------ the decision


def test_a_fresh_bucket_grants_its_capacity_then_refills_at_the_rate() -> None:
    grant, tat = decide(None, 100.0, 10, 2.0, 3.5)
    assert grant == Grant(3) and tat == pytest.approx(101.5)
    grant, tat2 = decide(tat, 100.0, 1, 2.0, 3.5)
    assert grant.granted == 0 and grant.retry_after == pytest.approx(0.25)
    assert tat2 == tat
    grant, _ = decide(tat, 100.25, 5, 2.0, 3.5)
    assert grant == Grant(1)


def test_a_bucket_left_alone_is_full_again_and_no_fuller() -> None:
    _g, tat = decide(None, 0.0, 3, 1.0, 3.0)
    grant, _ = decide(tat, 1000.0, 100, 1.0, 3.0)
    assert grant == Grant(3)


@pytest.mark.parametrize("seed", range(5))
def test_grants_in_any_window_stay_within_capacity_plus_rate_times_its_length(seed: int) -> None:
    rng = random.Random(seed)
    rate, capacity = 7.0, 4.5
    tat: float | None = None
    now, grants = 0.0, []
    for _ in range(5000):
        now += rng.expovariate(40.0)
        grant, tat = decide(tat, now, rng.randint(1, 6), rate, capacity)
        grants += [now] * grant.granted
    verdict = judge(grants, rate, capacity, 0.0)
    assert verdict.starts > 800  # the bucket was kept busy (125 s at 7/s): the bound reached
    assert verdict.excess <= 1e-6
    assert verdict.excess > -1.5  # and it is tight: some window came within a token of it


# ------------------------------------------------------------------ the value


def test_rate_limit_values_are_checked_with_their_setting_named() -> None:
    for bad, text in [(dict(per_second=0), "per_second"), (dict(per_second=float("inf")),
                      "per_second"), (dict(per_second=5, burst=1), "burst"),
                      (dict(per_second=5, per="user"), "per"),
                      (dict(per_second=5, scope="host"), "scope"),
                      (dict(per_second=5, name=" x"), "name")]:
        with pytest.raises(ConfigError, match=f"rate_limit.{text}"):
            RateLimit(**bad)  # type: ignore[arg-type]


def test_the_bucket_keeps_back_what_unspent_blocks_may_hold() -> None:
    lim = RateLimit(per_second=50, burst=50)
    assert lim.lifetime == 0.25
    assert lim.capacity == pytest.approx(50 - 12.5)
    assert lim.spend_within == pytest.approx(0.2)
    assert lim.max_block == 18
    tiny = RateLimit(per_second=100, burst=2)
    assert tiny.lifetime == pytest.approx(0.005) and tiny.capacity == pytest.approx(1.5)
    assert RateLimit(per_second=0.5).allowed_burst == 2
    assert RateLimit(per_second=120.5).allowed_burst == 121


def test_a_pool_limit_needs_a_store_every_replica_shares(tmp_path: Path) -> None:
    clock = FakeClock()
    with pytest.raises(ConfigError, match="no PostgreSQL or Redis store"):
        buckets_for(RateLimit(per_second=5), clock, None, None)
    from kworkers.idempotency import SqliteStore

    with pytest.raises(ConfigError, match="SQLite store cannot be shared"):
        buckets_for(RateLimit(per_second=5), clock, None, SqliteStore(str(tmp_path / "s.db")))
    assert isinstance(buckets_for(RateLimit(per_second=5, scope="replica"), clock, None, None),
                      LocalBuckets)


def test_what_a_rate_limit_cannot_go_with_is_one_clear_error() -> None:
    """Inline execution (nothing may wait on the poll thread), a bucket name function without
    a plain limit, a rate_store for a per-process bucket: refused when the worker is built."""
    from kworkers import Worker

    replica = RateLimit(per_second=5, scope="replica")
    with pytest.raises(ConfigError, match="rate_limit needs 'threads'"):
        Worker(["t"], "g", rate_limit=replica, execution="inline")
    with pytest.raises(ConfigError, match="rate_key names each record's bucket"):
        Worker(["t"], "g", rate_limit=RateLimit(per_second=5, per="key", scope="replica"),
               rate_key=lambda m: "x")
    with pytest.raises(ConfigError, match="rate_store is for scope='pool'"):
        Worker(["t"], "g", rate_limit=replica, rate_store=LocalBuckets(FakeClock()))
    with pytest.raises(ConfigError, match="a RateLimit or None"):
        Worker(["t"], "g", rate_limit=50)


# ------------------------------------------------------------------ the pacer


def _pacer(lim: RateLimit, clock: FakeClock, store: object | None = None,
           **kw: object) -> Pacer:
    return Pacer(lim, store or LocalBuckets(clock), "g", clock,  # type: ignore[arg-type]
                 sleep=clock.advance, **kw)  # type: ignore[arg-type]


def test_blocks_grow_while_spent_in_time_and_shrink_when_tokens_expire() -> None:
    clock = FakeClock(10.0)
    calls: list[int] = []

    class Counting(LocalBuckets):
        def take(self, name: str, want: int, rate: float, capacity: float) -> Grant:
            calls.append(want)
            return super().take(name, want, rate, capacity)

    p = _pacer(RateLimit(per_second=100, burst=1000), clock, Counting(clock))
    for _ in range(6):
        got = p.acquire(TP, "g", 10_000, lambda: False)
        assert got is not None
    # the first an eighth of a lifetime's worth (100/s x 0.2 s / 8); each block spent at
    # once: the next is twice as big
    assert calls == [2, 4, 8, 16, 32, 64]
    got = p.acquire(TP, "g", 1, lambda: False)  # a block of 128, one token spent
    # the approx stands in for ``until`` in the comparison
    assert got == Allotment(1, cast(float, pytest.approx(clock.monotonic() + 0.2)))
    clock.advance(0.3)  # the other 127 expire unspent
    p.acquire(TP, "g", 1, lambda: False)
    assert calls[-1] == 64


def test_the_next_block_is_asked_for_while_the_others_spend_this_one() -> None:
    """Half a block spent: the next runner asks the store for the next block, and while that
    ask is in flight the other runners keep taking tokens (nobody waits for the round trip
    far from the limit); the spare keeps the deadline of its own grant."""
    clock = FakeClock(10.0)
    entered, release = threading.Event(), threading.Event()
    sizes: list[int] = []

    class Slow(LocalBuckets):
        def take(self, name: str, want: int, rate: float, capacity: float) -> Grant:
            sizes.append(want)
            if len(sizes) == 5:  # the ask ahead of need: held until the test lets it go
                entered.set()
                release.wait(10)
            return super().take(name, want, rate, capacity)

    p = _pacer(RateLimit(per_second=100, burst=1000), clock, Slow(clock))
    for _ in range(3):
        assert p.acquire(TP, "g", 10_000, lambda: False) is not None  # blocks of 2, 4, 8
    first = p.acquire(TP, "g", 8, lambda: False)  # a block of 16: half spent
    assert first is not None and first.count == 8 and sizes == [2, 4, 8, 16]
    clock.advance(0.05)
    ahead = threading.Thread(target=p.acquire, args=(TP, "g", 1, lambda: False))
    ahead.start()  # half spent: this runner asks for the next block first
    assert entered.wait(10)
    # meanwhile: the current block, no wait (a pacer that waited would give up: None)
    got = p.acquire(TP, "g", 2, lambda: clock.monotonic() > 10.1)
    assert got == Allotment(2, first.until) and p.waiting() == set()
    release.set()
    ahead.join(10)
    assert not ahead.is_alive() and sizes == [2, 4, 8, 16, 32]  # spent fast: twice as big
    rest = p.acquire(TP, "g", 100, lambda: False)
    assert rest is not None and rest.count == 5 and rest.until == first.until
    spare = p.acquire(TP, "g", 100, lambda: False)  # the spare, on its own deadline
    assert spare is not None and spare.count == 32 and spare.until > first.until
    assert sizes == [2, 4, 8, 16, 32]


def test_a_record_without_a_token_waits_and_a_halt_ends_the_wait() -> None:
    clock = FakeClock()
    waits: list[float] = []
    waiting: list[int] = []
    p = _pacer(RateLimit(per_second=2, burst=2), clock, on_wait=waits.append,
               on_waiting=waiting.append)
    got = p.acquire(TP, "g", 5, lambda: False)
    assert got is not None and got.count == 1  # capacity 1.5: one token at once
    t0 = clock.monotonic()
    got = p.acquire(TP, "g", 1, lambda: False)
    # the bucket (1.5) kept half a token: the next whole one comes a quarter second later
    assert got is not None and clock.monotonic() - t0 == pytest.approx(0.25, abs=0.06)
    assert waiting == [1, 0] and waits == [pytest.approx(clock.monotonic() - t0)]
    halted = {"now": False}

    def sleep(s: float) -> None:
        clock.advance(s)
        halted["now"] = True

    p._sleep = sleep
    assert p.acquire(TP, "g", 1, lambda: halted["now"]) is None
    assert p.waiting() == set()


def test_an_unreachable_store_fails_closed_and_work_resumes_when_it_answers() -> None:
    clock = FakeClock()
    errors: list[int] = []

    class Flaky(LocalBuckets):
        remote = True
        down = 3

        def take(self, name: str, want: int, rate: float, capacity: float) -> Grant:
            if self.down:
                self.down -= 1
                raise ConnectionError("store down")
            return super().take(name, want, rate, capacity)

    store = Flaky(clock)
    p = _pacer(RateLimit(per_second=10), clock, store, on_store_error=lambda: errors.append(1))
    got = p.acquire(TP, "g", 1, lambda: False)
    assert got is not None and len(errors) == 3
    assert clock.monotonic() == pytest.approx(0.1 + 0.2 + 0.4)  # nothing started meanwhile


def test_buckets_per_key_and_per_name() -> None:
    clock = FakeClock()
    msg = Message("t", 0, 0, b"\x01k", b"v")
    keyed = _pacer(RateLimit(per_second=5, per="key"), clock)
    assert keyed.fixed is None and keyed.bucket_of(msg) == "g/k:016b"
    assert cast(str, keyed.bucket_of(msg._replace(key=b"x" * 500))).startswith("g/k:7878")
    assert len(keyed.bucket_of(msg._replace(key=b"x" * 500)) or "") < 120
    named = _pacer(RateLimit(per_second=5, name="provider"), clock,
                   name_of=lambda m: None if m.offset else "eu")
    assert named.bucket_of(msg) == "provider/n:eu"
    assert named.bucket_of(msg._replace(offset=1)) is None


# ------------------------------------------------------------------ the bound, simulated


def _simulate(lim: RateLimit, replicas: int, seed: int, store: Callable[[FakeClock], object],
              steps: int = 6000) -> list[float]:
    """Replicas interleaved at random on one fake clock, each start observed up to
    START_MARGIN_S after its token. Half the blocks are spent at once, half held to the end
    of their lifetime and spent together: the adversary the bucket's reserve is for."""
    rng = random.Random(seed)
    clock = FakeClock(1000.0)
    shared = store(clock)
    pacers = [_pacer(lim, clock, shared if shared is not None else LocalBuckets(clock))
              for _ in range(replicas)]
    #: per replica: tokens held, good until, spend them only from this moment on
    held: list[list[float]] = [[0, 0.0, 0.0] for _ in range(replicas)]
    starts: list[float] = []
    for _ in range(steps):
        r = rng.randrange(replicas)
        clock.advance(rng.uniform(0, 0.004))
        tokens, until, spend_from = held[r]
        now = clock.monotonic()
        if tokens and now < until:
            if now >= spend_from:  # held to the end: all at once; else one by one
                n = int(tokens) if until - spend_from <= 0.0100001 else 1
                held[r][0] -= n
                starts += [now + rng.uniform(0, START_MARGIN_S) for _ in range(n)]
        else:
            got = pacers[r].acquire(TP, "g", rng.randint(1, 40), lambda: False)
            assert got is not None
            now = clock.monotonic()
            late = rng.random() < 0.5
            held[r] = [got.count, got.until, got.until - 0.01 if late else now]
    return starts


@pytest.mark.parametrize("seed", range(4))
def test_a_pool_sharing_one_bucket_never_exceeds_burst_plus_rate_times_t(seed: int) -> None:
    lim = RateLimit(per_second=50, burst=20)
    shared = LocalBuckets
    starts = _simulate(lim, 3, seed, shared)
    verdict = judge(starts, lim.per_second, lim.allowed_burst, 0.0)
    assert verdict.starts > 500 and verdict.excess <= 1e-6, verdict


class _NoReserve(RateLimit):
    """Canary: a bucket as large as the burst, as if blocks were spent the moment granted."""

    @property
    def capacity(self) -> float:
        return float(self.allowed_burst)


def test_canary_a_bucket_without_the_reserve_for_unspent_blocks_breaks_the_bound() -> None:
    lim = _NoReserve(per_second=50, burst=20)
    worst = max(judge(_simulate(lim, 3, seed, LocalBuckets), 50, 20, 0.0).excess
                for seed in range(4))
    assert worst > 1


def test_canary_replicas_with_a_bucket_each_break_the_pool_bound() -> None:
    lim = RateLimit(per_second=50, burst=20)
    starts = _simulate(lim, 3, 0, lambda _c: None)
    assert judge(starts, 50, 20, 5.0).excess > 50


def test_one_pacer_on_threads_keeps_the_bound() -> None:
    """Real threads, real sleeps: an upper bound only (a slow machine only starts fewer)."""
    from kworkers.clock import SystemClock

    lim = RateLimit(per_second=200, burst=10, scope="replica")
    p = Pacer(lim, LocalBuckets(SystemClock()), "g", SystemClock())
    starts: list[float] = []
    lock = threading.Lock()
    import time

    def runner() -> None:
        tokens, until = 0, 0.0
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            if tokens and time.monotonic() < until:
                tokens -= 1
                with lock:
                    starts.append(time.monotonic())
                continue
            got = p.acquire(TP, "g", 7, lambda: False)
            assert got is not None
            tokens, until = got.count, got.until

    threads = [threading.Thread(target=runner) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    verdict = judge(starts, 200, 10, 0.0)
    assert verdict.starts > 20 and verdict.excess <= 1e-6, verdict


def test_windows_judge_refuses_nothing_and_finds_the_worst_window() -> None:
    assert judge([], 1, 1, 5).starts == 0
    v = judge([0, 0.1, 0.2, 10, 10.1, 10.2, 10.3], 0.1, 1, 5.0)
    assert v.busiest == 4  # in [10, 10.3]: 2.5 over the 5 s bound of 1.5
    assert v.excess == pytest.approx(7 - (1 + 0.1 * 10.3))  # all 7 in [0, 10.3]: worse
    assert v.worst == (0.0, 10.3)
    assert dataclasses.is_dataclass(v)


# ------------------------------------------------------------------ in the poll loop


def test_records_wait_for_tokens_in_their_lanes_and_their_partitions_are_paused() -> None:
    """The loop keeps polling while runners wait; each partition fills its share and is
    paused (nothing buffered past it), shows as held by the rate limit (not stalled), and
    every record runs once, within the bound."""
    import time

    from kworkers.consumer.stall import Hold
    from tests.unit.test_loop_with_fake_consumer import ScriptedConsumer, _Harness

    records = [Message("t", p, o, b"k", b"v") for o in range(30) for p in (0, 1)]
    consumer = ScriptedConsumer(records, [])
    starts: list[float] = []
    lock = threading.Lock()

    def handle(msg: Message) -> None:
        with lock:
            starts.append(time.monotonic())

    lim = RateLimit(per_second=25, burst=8, scope="replica")
    h = _Harness(consumer, handle, rate_limit=lim, max_in_flight_per_partition=8,
                 consume_batch=4)
    h.start()
    holds: set[Hold | None] = set()
    max_held = 0
    paused_seen = False
    deadline = time.monotonic() + 30
    while len(starts) < len(records) and time.monotonic() < deadline:
        paused_seen |= bool(consumer.paused)  # read while it runs: at the end none is paused
        loop = h.worker.loops[0]
        holds |= {v.hold for v in loop.stall_views}
        max_held = max([max_held, *(v.held for v in loop.stall_views)])
        time.sleep(0.005)
    h.stop()
    assert len(starts) == len(records)  # nothing lost, nothing twice
    verdict = judge(starts, lim.per_second, lim.allowed_burst, 0.5)
    assert verdict.excess <= 1e-6, verdict  # unpaced, the 60 would start within milliseconds
    assert Hold.RATE_LIMIT in holds
    assert paused_seen and 0 < max_held <= 8 + 4  # its share, plus at most the poll that filled it


def test_the_event_loop_waits_for_tokens_by_awaiting_and_asks_a_remote_store_off_it() -> None:
    """``aacquire`` (async handlers): the same answers as ``acquire``; a remote store's ask
    runs on a thread of its own, never on the loop; a halt ends the wait."""
    import asyncio

    clock = FakeClock()
    asked_on: list[str] = []

    class Remote(LocalBuckets):
        remote = True

        def take(self, name: str, want: int, rate: float, capacity: float) -> Grant:
            asked_on.append(threading.current_thread().name)
            return super().take(name, want, rate, capacity)

    p = _pacer(RateLimit(per_second=2, burst=2), clock, Remote(clock))

    async def main() -> tuple[Allotment | None, Allotment | None]:
        first = await p.aacquire(TP, "g", 5, lambda: False)
        second = await p.aacquire(TP, "g", 1, lambda: True)  # no token yet, halted
        return first, second

    first, second = asyncio.run(main())
    assert first is not None and first.count == 1 and second is None
    assert asked_on and threading.main_thread().name not in asked_on
    assert p.waiting() == set()
