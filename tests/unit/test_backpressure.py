"""The pause/resume decision and the poll size, driven by hand: every input on its own,
hysteresis, the liveness rule (no partition paused for what others hold) and the memory bound."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from kworkers.consumer.backpressure import Limits, Load, PartitionLoad, decide, poll_size

LIMITS = Limits(max_in_flight=100, per_partition=40)


def _load(*parts: tuple[int, bool], **kw: bool) -> Load:
    return Load([PartitionLoad(("t", i), n, p) for i, (n, p) in enumerate(parts)], **kw)


def test_a_busy_partition_pauses_alone() -> None:
    d = decide(LIMITS, _load((40, False), (5, False)))
    assert d.pause == (("t", 0),) and d.resume == () and d.in_flight == 45


def test_it_resumes_only_at_half_its_share() -> None:
    assert decide(LIMITS, _load((21, True))).resume == ()
    assert decide(LIMITS, _load((20, True))).resume == (("t", 0),)


def test_the_global_bound_is_split_into_shares() -> None:
    assert LIMITS.share(1) == 40  # the per-partition cap
    assert LIMITS.share(3) == 33  # an even split of max_in_flight
    assert LIMITS.share(500) == 1  # never nothing
    assert Limits(100, 40, buffer_capacity=10).share(2) == 5  # a tier loop: the heap too
    d = decide(LIMITS, _load((33, False), (32, False), (0, False)))
    assert d.pause == (("t", 0),) and d.share == 33


def test_no_partition_is_paused_for_what_others_hold() -> None:
    """The starvation this rule replaced: the global "pause all at max_in_flight, resume all
    at half" kept a partition with nothing in flight paused while the others' backlog lasted."""
    d = decide(LIMITS, _load((40, False), (40, False), (0, False)))
    assert ("t", 2) not in d.pause
    d = decide(LIMITS, _load((60, True), (60, True), (0, True)))
    assert d.resume == (("t", 2),)


def test_an_assignment_that_grows_shrinks_the_shares_of_the_partitions_kept() -> None:
    d = decide(LIMITS, _load((30, False), (0, False), (0, False), (0, False)))
    assert d.share == 25 and d.pause == (("t", 0),)


def test_draining_and_an_open_breaker_pause_everything_and_resume_nothing() -> None:
    for kw in ({"draining": True}, {"breaker_open": True}):
        d = decide(LIMITS, _load((0, False), (0, True), **kw))
        assert d.pause == (("t", 0),) and d.resume == ()


def test_one_poll_takes_the_room_left_under_the_bound_and_never_nothing() -> None:
    assert poll_size(LIMITS, 0, 30) == 30
    assert poll_size(LIMITS, 90, 30) == 10
    assert poll_size(LIMITS, 100, 30) == 1
    assert poll_size(LIMITS, 150, 30) == 1
    assert poll_size(Limits(100, 40, buffer_capacity=20), 15, 30) == 5


@given(st.lists(st.tuples(st.integers(0, 200), st.booleans()), max_size=8),
       st.booleans(), st.booleans())
def test_never_pauses_and_resumes_one_partition_at_once(
    parts: list[tuple[int, bool]], draining: bool, breaker: bool
) -> None:
    d = decide(LIMITS, _load(*parts, draining=draining, breaker_open=breaker))
    assert not set(d.pause) & set(d.resume)
    paused = {("t", i) for i, (_n, p) in enumerate(parts) if p}
    assert not set(d.pause) & paused  # only running partitions are paused
    assert set(d.resume) <= paused  # only paused ones resumed
    if draining or breaker:
        assert d.resume == ()
    else:  # liveness: a partition at or under half its share is never left paused
        left = {("t", i) for i, (n, p) in enumerate(parts) if p and n <= d.share // 2}
        assert left <= set(d.resume)


def _simulate(limits: Limits, n: int, batch: int, steps: int, seed: int,
              clamp: bool = True) -> int:
    """The poll loop's admission with adversarial fetches: each poll's records go to one
    unpaused partition (librdkafka hands out a partition's fetched run together), random
    completions between polls. Returns the most records ever held."""
    rnd = random.Random(seed)
    held = [0] * n
    paused = [False] * n
    peak = 0
    for _ in range(steps):
        k = poll_size(limits, sum(held), batch) if clamp else batch
        open_ = [i for i in range(n) if not paused[i]]
        if open_:
            while k > 0:
                i = rnd.choice(open_)
                got = rnd.randint(1, k)
                held[i] += got
                k -= got
        peak = max(peak, sum(held))
        for i in range(n):  # some partitions complete some records
            if held[i] and rnd.random() < 0.3:
                held[i] -= rnd.randint(0, held[i])
        d = decide(limits, Load([PartitionLoad(("t", i), held[i], paused[i])
                                 for i in range(n)]))
        for _tp, i in d.pause:
            paused[i] = True
        for _tp, i in d.resume:
            paused[i] = False
    return peak


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 60), st.integers(20, 2000), st.integers(1, 500), st.integers(0, 10**6))
def test_records_held_stay_within_the_stated_bound(n: int, bound: int, batch: int,
                                                   seed: int) -> None:
    limits = Limits(bound, per_partition=bound)
    assert _simulate(limits, n, batch, 300, seed) <= bound + max(bound, n)


def test_without_the_poll_size_the_bound_does_not_hold() -> None:
    """The canary of the bound above: polls of a full batch each, one partition at a time,
    push past it once the shares are small next to a batch."""
    limits = Limits(2000, per_partition=2000)
    peaks = [_simulate(limits, 40, 500, 300, seed, clamp=False) for seed in range(5)]
    assert max(peaks) > 2000 + max(2000, 40), peaks
    assert all(_simulate(limits, 40, 500, 300, s) <= 4000 for s in range(5))
