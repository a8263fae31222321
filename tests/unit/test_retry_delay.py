"""DelayBuffer: never early, due order, bounded, and partition drops."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kworkers.errors import ConfigError
from kworkers.retry_tiers.delay import DelayBuffer


def test_never_returns_an_item_before_it_is_due() -> None:
    buf: DelayBuffer[str] = DelayBuffer(10)
    buf.push(5.0, "a")
    assert buf.pop_due(4.999) == []
    assert buf.pop_due(-1.0) == []
    assert len(buf) == 1
    assert buf.pop_due(5.0) == ["a"]  # due exactly now counts
    assert len(buf) == 0 and buf.next_due() is None


def test_due_order_with_ties_in_insertion_order() -> None:
    buf: DelayBuffer[str] = DelayBuffer(10)
    for due, item in [(3.0, "c"), (1.0, "a1"), (2.0, "b"), (1.0, "a2"), (9.0, "z")]:
        buf.push(due, item)
    assert buf.next_due() == 1.0
    assert buf.pop_due(3.0) == ["a1", "a2", "b", "c"]
    assert buf.next_due() == 9.0
    assert buf.pop_due(100.0) == ["z"]


def test_capacity() -> None:
    buf: DelayBuffer[int] = DelayBuffer(2)
    buf.push(1.0, 1)
    fullness = [buf.full]
    buf.push(2.0, 2)
    fullness.append(buf.full)
    with pytest.raises(BufferError):
        buf.push(0.5, 3)
    assert len(buf) == 2
    buf.pop_due(1.0)
    fullness.append(buf.full)
    assert fullness == [False, True, False]
    buf.push(0.5, 3)
    assert buf.pop_due(10.0) == [3, 2]


@pytest.mark.parametrize("bad", [0, -1])
def test_capacity_must_be_positive(bad: int) -> None:
    with pytest.raises(ConfigError):
        DelayBuffer[int](bad)


def test_nan_due_time_is_refused() -> None:
    buf: DelayBuffer[int] = DelayBuffer(2)
    with pytest.raises(ValueError):
        buf.push(float("nan"), 1)


def test_drop_removes_matching_items_in_due_order() -> None:
    buf: DelayBuffer[tuple[int, str]] = DelayBuffer(10)
    buf.push(3.0, (0, "c"))
    buf.push(1.0, (1, "a"))
    buf.push(2.0, (0, "b"))
    buf.push(0.5, (1, "z"))
    dropped = buf.drop(lambda item: item[0] == 0)
    assert dropped == [(0, "b"), (0, "c")]
    assert len(buf) == 2
    assert buf.next_due() == 0.5
    assert buf.pop_due(10.0) == [(1, "z"), (1, "a")]
    assert buf.drop(lambda item: True) == []


ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 50).map(lambda t: t / 2)),
        st.tuples(st.just("pop"), st.integers(-5, 60).map(lambda t: t / 2)),
        st.tuples(st.just("drop"), st.integers(0, 3)),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, capacity=st.integers(1, 12))
def test_matches_a_sorted_model(ops: list[tuple[str, float]], capacity: int) -> None:
    buf: DelayBuffer[int] = DelayBuffer(capacity)
    model: list[tuple[float, int]] = []  # (due, seq); seq is also the item
    seq = 0
    for op, arg in ops:
        if op == "push":
            if len(model) >= capacity:
                assert buf.full
                with pytest.raises(BufferError):
                    buf.push(arg, -1)
                continue
            buf.push(arg, seq)
            model.append((arg, seq))
            seq += 1
        elif op == "pop":
            got = buf.pop_due(arg)
            want = sorted(m for m in model if m[0] <= arg)
            assert got == [s for _, s in want]
            model = [m for m in model if m[0] > arg]
            due_of = dict((s, d) for d, s in want)
            assert all(due_of[s] <= arg for s in got)  # never early
        else:
            mod = int(arg) + 1

            def pred(s: int, mod: int = mod) -> bool:
                return s % mod == 0

            got = buf.drop(pred)
            want = sorted(m for m in model if m[1] % mod == 0)
            assert got == [s for _, s in want]
            model = [m for m in model if m[1] % mod != 0]
        assert len(buf) == len(model)
        assert buf.full == (len(model) >= capacity)
        assert buf.next_due() == (min(model)[0] if model else None)
