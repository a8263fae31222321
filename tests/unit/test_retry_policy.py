"""Backoff and jitter: the seed's section 3 worked by hand, the defaults, and the statistics."""

from __future__ import annotations

import math

import pytest

from kworkers.retry_tiers.policy import (
    RetryPolicy,
    SeededJitter,
    backoff,
    jitter,
    no_jitter,
)

HAND = RetryPolicy(initial=1.0, backoff=2.0, max_interval=10.0, max_attempts=4)


@pytest.mark.parametrize(
    ("n", "expected", "half"),
    [(1, 1.0, 0.5), (2, 2.0, 1.0), (3, 4.0, 2.0), (4, 8.0, 4.0), (5, 10.0, 5.0), (6, 10.0, 5.0)],
)
def test_backoff_hand_example(n: int, expected: float, half: float) -> None:
    d = backoff(HAND, n)
    assert d == expected
    assert jitter(d, 0.5) == half


def test_backoff_is_for_the_failed_attempt_not_the_next() -> None:
    # The first retry waits exactly b0: an exponent off by one would give 2.
    assert backoff(RetryPolicy(initial=3.0), 1) == 3.0


def test_backoff_rejects_attempt_below_one() -> None:
    for n in (0, -1):
        with pytest.raises(ValueError, match="attempt"):
            backoff(HAND, n)


def test_backoff_huge_attempt_is_capped_not_overflowing() -> None:
    assert backoff(HAND, 10_000) == 10.0
    assert backoff(RetryPolicy(backoff=1e300), 5) == 60.0


def test_non_integer_factor() -> None:
    p = RetryPolicy(initial=2.0, backoff=1.5, max_interval=100.0)
    assert backoff(p, 1) == 2.0
    assert backoff(p, 2) == 3.0
    assert backoff(p, 3) == 4.5
    assert backoff(p, 4) == pytest.approx(6.75)
    assert backoff(p, 20) == 100.0


def test_defaults() -> None:
    p = RetryPolicy()
    assert (p.initial, p.backoff, p.max_interval, p.max_attempts) == (1.0, 2.0, 60.0, 5)
    assert p.non_retryable == ()


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan])
def test_zero_or_negative_fields_mean_default(bad: float) -> None:
    p = RetryPolicy(initial=bad, backoff=bad, max_interval=bad, max_attempts=0).normalized()
    assert (p.initial, p.backoff, p.max_interval, p.max_attempts) == (1.0, 2.0, 60.0, 5)
    assert RetryPolicy(max_attempts=-3).normalized().max_attempts == 5


def test_backoff_below_one_means_default() -> None:
    assert RetryPolicy(backoff=0.5).normalized().backoff == 2.0
    assert RetryPolicy(backoff=1.0).normalized().backoff == 1.0  # constant backoff is legal


def test_normalized_keeps_set_fields_and_non_retryable() -> None:
    p = RetryPolicy(
        initial=0.25, backoff=3.0, max_interval=7.0, max_attempts=9, non_retryable=("X",)
    )
    assert p.normalized() == p


def test_backoff_uses_the_normalized_policy() -> None:
    # An empty policy must not retry in a hot loop: zero initial -> 1 s.
    zero = RetryPolicy(initial=0.0, backoff=0.0, max_interval=0.0, max_attempts=0)
    assert [backoff(zero, n) for n in (1, 2, 3, 7, 8)] == [1.0, 2.0, 4.0, 60.0, 60.0]


def test_jitter_bounds_and_validation() -> None:
    assert jitter(10.0, 0.0) == 0.0
    assert jitter(10.0, 0.999) == pytest.approx(9.99)
    for bad in (1.0, -0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match="u"):
            jitter(10.0, bad)


def test_no_jitter_is_identity() -> None:
    assert no_jitter(7.25) == 7.25


def test_seeded_jitter_bounds_and_mean() -> None:
    d, n = 8.0, 20_000
    src = SeededJitter(seed=12345)
    draws = [src(d) for _ in range(n)]
    assert all(0.0 <= x < d for x in draws)
    mean = sum(draws) / n
    sd_of_mean = d / math.sqrt(12) / math.sqrt(n)
    assert abs(mean - d / 2) <= 4 * sd_of_mean
    # Not "added on top": nothing reaches the full backoff, and the spread is wide.
    assert min(draws) < 0.01 * d and max(draws) > 0.99 * d


def test_seeded_jitter_is_reproducible_and_independent() -> None:
    a, b = SeededJitter(seed=7), SeededJitter(seed=7)
    assert [a(1.0) for _ in range(100)] == [b(1.0) for _ in range(100)]
    assert SeededJitter(seed=7)(1.0) != SeededJitter(seed=8)(1.0)
