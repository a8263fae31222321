from __future__ import annotations

import random
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kworkers.consumer.offsets import OffsetTracker


def test_in_order_completion_moves_position() -> None:
    t = OffsetTracker()
    for o in range(5):
        t.track(o)
    assert t.position is None
    t.complete(0)
    assert cast("int | None", t.position) == 1  # re-read: complete() moved it
    t.complete(1)
    assert t.committable() == 2


def test_out_of_order_waits_for_the_gap() -> None:
    t = OffsetTracker()
    for o in (10, 11, 12, 13):
        t.track(o)
    t.complete(12)
    t.complete(13)
    assert t.position is None  # 10 still in flight
    t.complete(11)
    assert t.position is None
    t.complete(10)
    assert cast("int | None", t.position) == 14  # re-read: complete() moved it
    assert t.in_flight == 0


def test_gaps_in_offsets_are_not_waited_for() -> None:
    t = OffsetTracker()
    for o in (3, 7, 8):  # compaction / transaction markers skip offsets
        t.track(o)
    t.complete(3)
    assert t.position == 4
    t.complete(8)
    t.complete(7)
    assert t.position == 9


def test_committable_only_when_ahead_and_tracking_order_enforced() -> None:
    t = OffsetTracker()
    t.track(0)
    t.complete(0)
    assert t.committable() == 1
    t.mark_committed(1)
    assert t.committable() is None
    t.mark_committed(0)  # never backwards
    assert t.committed == 1
    with pytest.raises(ValueError):
        t.track(0)


def test_duplicate_and_unknown_completions_are_ignored() -> None:
    t = OffsetTracker()
    t.track(5)
    t.track(6)
    t.complete(6)
    t.complete(6)
    t.complete(99)
    t.complete(1)
    assert t.position is None
    t.complete(5)
    assert t.position == 7


def _offsets(gaps: list[int]) -> list[int]:
    """Increasing offsets with the given gaps (compaction and markers leave gaps)."""
    out, o = [], 0
    for g in gaps:
        o += g
        out.append(o)
    return out


@given(st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=200), st.randoms())
def test_random_completion_orders_never_go_back_or_skip(
    gaps: list[int], rnd: random.Random
) -> None:
    offsets = _offsets(gaps)
    t = OffsetTracker()
    for off in offsets:
        t.track(off)
    order = offsets[:]
    rnd.shuffle(order)
    done: set[int] = set()
    last = -1
    for off in order:
        t.complete(off)
        done.add(off)
        pos = t.position
        if pos is not None:
            assert pos >= last  # monotonic
            last = pos
            # everything below the position is done; the position itself is not (or past end)
            assert all(x in done for x in offsets if x < pos)
            nxt = [x for x in offsets if x >= pos]
            assert not nxt or nxt[0] not in done
    assert t.position == offsets[-1] + 1


@given(st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=200), st.randoms(),
       st.integers(min_value=1, max_value=20))
def test_bulk_track_and_complete_agree_with_one_by_one(
    gaps: list[int], rnd: random.Random, chunk: int
) -> None:
    offsets = _offsets(gaps)
    one, bulk = OffsetTracker(), OffsetTracker()
    for off in offsets:
        one.track(off)
    for i in range(0, len(offsets), chunk):
        assert bulk.track_many(offsets[i:i + chunk]) == offsets[i:i + chunk]
    assert bulk.track_many(offsets[:3]) == []  # a refetch is not tracked twice
    order = offsets[:]
    rnd.shuffle(order)
    for i in range(0, len(order), chunk):
        part = order[i:i + chunk]
        for off in part:
            one.complete(off)
        bulk.complete_many(part)
        assert bulk.position == one.position
        assert bulk.in_flight == one.in_flight


@given(st.lists(st.integers(min_value=1, max_value=3), min_size=2, max_size=200), st.randoms(),
       st.integers(min_value=2, max_value=20))
def test_runs_completed_in_fetch_order_agree_with_one_by_one(
    gaps: list[int], rnd: random.Random, chunk: int
) -> None:
    """``complete_many``'s fast path (a run from the head, compared in C) against ``complete``:
    lanes' runs completed mostly in order, some out of order, some twice."""
    offsets = _offsets(gaps)
    one, bulk = OffsetTracker(), OffsetTracker()
    one.track_many(offsets)
    bulk.track_many(offsets)
    runs = [offsets[i:i + chunk] for i in range(0, len(offsets), chunk)]
    if len(runs) > 2 and rnd.random() < 0.5:
        runs[1], runs[2] = runs[2], runs[1]  # a later run first: the slow path, then fast
    if rnd.random() < 0.3:
        runs.insert(rnd.randrange(1, len(runs) + 1), rnd.choice(runs))  # a run done twice
    fast = 0
    for run in runs:
        head = bulk._pending[0] if bulk._pending else None
        fast += len(run) > 1 and head == run[0] and not bulk._done
        for off in run:
            one.complete(off)
        bulk.complete_many(run)
        assert (bulk.position, bulk.in_flight, bulk.window) == \
            (one.position, one.in_flight, one.window)
    assert fast >= 1  # the fast path ran at least once (the first run starts at the head)
    assert bulk.position == offsets[-1] + 1


# ------------------------------------------------------------------ the window's bytes

def _window_model(tracked: dict[int, int], done: set[int]) -> int:
    """The bytes of the offsets from the lowest incomplete one on (completed or not)."""
    pending = sorted(o for o in tracked if o not in done)
    if not pending:
        return 0
    return sum(size for o, size in tracked.items() if o >= pending[0])


@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 10**6)), min_size=1, max_size=300),
       st.randoms(), st.integers(1, 40), st.booleans())
def test_the_window_bytes_are_exactly_those_of_its_offsets(
        records: list[tuple[int, int]], rnd: random.Random, chunk: int, bulk: bool) -> None:
    """Random sizes, fetches in chunks (a refetch among them), completions in any order, one
    by one or in runs: after every step the window's bytes are the sum over its offsets."""
    offsets = _offsets([g for g, _s in records])
    sizes = dict(zip(offsets, (s for _g, s in records), strict=True))
    t = OffsetTracker()
    tracked: dict[int, int] = {}
    done: set[int] = set()
    order = offsets[:]
    rnd.shuffle(order)
    fetched = 0
    while fetched < len(offsets) or order:
        if fetched < len(offsets) and (not order or rnd.random() < 0.5):
            start = max(0, fetched - rnd.randint(0, 3))  # a refetch of the last few at times
            batch = offsets[start:fetched + chunk]
            new = t.track_many(batch, [sizes[o] for o in batch])
            assert new == offsets[fetched:fetched + chunk]
            tracked.update((o, sizes[o]) for o in new)
            fetched += len(new)
        else:
            ready = [o for o in order if o in tracked][:chunk]
            if not ready:
                continue
            order = [o for o in order if o not in ready]
            if bulk:
                t.complete_many(sorted(ready) if rnd.random() < 0.5 else ready)
            else:
                for o in ready:
                    t.complete(o)
            done.update(ready)
        assert t.window_bytes == _window_model(tracked, done)
    assert t.window_bytes == 0 and t.window == 0


def test_the_running_sums_are_cut_at_their_head_as_the_window_moves_on() -> None:
    """A long-lived partition keeps only about its window's sums, not one per record ever."""
    t = OffsetTracker()
    for start in range(0, 100_000, 100):
        t.track_many(list(range(start, start + 100)), [7] * 100)
        if start >= 1000:  # a window of about 1,000 records, completed from its head
            t.complete_many(list(range(start - 1000, start - 900)))
    assert t.window == 1000 and t.window_bytes == 7000
    assert len(t._cum) < 3 * 4096  # the bound on what the sums keep
