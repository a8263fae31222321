"""The pause/resume decision, driven by hand: every input on its own, and hysteresis."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kworkers.consumer.backpressure import Limits, Load, PartitionLoad, decide

LIMITS = Limits(max_in_flight=100, per_partition=40, buffer_capacity=10)


def _load(*parts: tuple[int, bool], **kw: object) -> Load:
    return Load([PartitionLoad(("t", i), n, p) for i, (n, p) in enumerate(parts)],
                **kw)  # type: ignore[arg-type]


def test_a_busy_partition_pauses_alone() -> None:
    d = decide(LIMITS, _load((40, False), (5, False)))
    assert d.pause == (("t", 0),) and d.resume == () and d.in_flight == 45


def test_it_resumes_only_at_half_its_limit() -> None:
    assert decide(LIMITS, _load((21, True))).resume == ()
    assert decide(LIMITS, _load((20, True))).resume == (("t", 0),)


def test_the_global_limit_pauses_every_partition_and_waits_for_half() -> None:
    d = decide(LIMITS, _load((35, False), (35, False), (30, False)))
    assert set(d.pause) == {("t", 0), ("t", 1), ("t", 2)}
    assert decide(LIMITS, _load((20, True), (20, True), (11, True))).resume == ()
    assert len(decide(LIMITS, _load((20, True), (20, True), (10, True))).resume) == 3


def test_a_full_timer_heap_pauses_until_it_drained_to_half() -> None:
    d = decide(LIMITS, _load((1, False), buffered=10))
    assert d.pause == (("t", 0),) and d.buffer_full
    still = decide(LIMITS, _load((1, True), buffered=6, buffer_full=True))
    assert still.resume == () and still.buffer_full
    d = decide(LIMITS, _load((1, True), buffered=5, buffer_full=True))
    assert d.resume == (("t", 0),) and not d.buffer_full


def test_without_a_heap_the_buffer_input_is_ignored() -> None:
    d = decide(Limits(100, 40), _load((1, False), buffered=10_000))
    assert d.pause == () and not d.buffer_full


def test_draining_pauses_everything_and_resumes_nothing() -> None:
    d = decide(LIMITS, _load((0, False), (0, True), draining=True))
    assert d.pause == (("t", 0),) and d.resume == ()


@given(st.lists(st.tuples(st.integers(0, 200), st.booleans()), max_size=8),
       st.integers(0, 20), st.booleans(), st.booleans())
def test_never_pauses_and_resumes_one_partition_at_once(
    parts: list[tuple[int, bool]], buffered: int, full: bool, draining: bool
) -> None:
    d = decide(LIMITS, _load(*parts, buffered=buffered, buffer_full=full, draining=draining))
    assert not set(d.pause) & set(d.resume)
    paused = {("t", i) for i, (_n, p) in enumerate(parts) if p}
    assert not set(d.pause) & paused  # only running partitions are paused
    assert set(d.resume) <= paused  # only paused ones resumed
    if draining:
        assert d.resume == ()
