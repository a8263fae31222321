"""route(): where a failed record goes, under a fake clock and with every non-retryable shape."""

from __future__ import annotations

import pytest

from kworkers.clock import FakeClock
from kworkers.errors import DecodeError, NonRetryableError, RetryableError
from kworkers.retry_tiers.policy import RetryPolicy, SeededJitter, no_jitter
from kworkers.retry_tiers.routing import (
    MAX_ERROR_MESSAGE,
    DeadLetterDecision,
    RetryDecision,
    route,
)
from kworkers.retry_tiers.tiers import TierLadder

HAND = RetryPolicy(initial=1.0, backoff=2.0, max_interval=10.0, max_attempts=4)
LADDER = TierLadder()


def test_retry_schedule_under_fake_clock() -> None:
    clock = FakeClock(0.0)
    err = RuntimeError("db down")

    d1 = route(HAND, LADDER, "orders", 1, err, clock.now(), no_jitter)
    assert isinstance(d1, RetryDecision)
    assert d1.next_attempt == 2
    assert d1.delay == 1.0
    assert d1.due_at == 1.0  # exactly, not 999 ms
    assert d1.tier.topic == "orders.retry.1s"
    assert (d1.error_type, d1.error_message) == ("RuntimeError", "db down")

    clock.set(d1.due_at)
    d2 = route(HAND, LADDER, "orders", 2, err, clock.now(), no_jitter)
    assert isinstance(d2, RetryDecision)
    assert (d2.next_attempt, d2.delay, d2.due_at) == (3, 2.0, 3.0)
    assert d2.tier.label == "1s"

    clock.set(d2.due_at)
    d3 = route(HAND, LADDER, "orders", 3, err, clock.now(), no_jitter)
    assert isinstance(d3, RetryDecision)
    assert (d3.next_attempt, d3.delay, d3.due_at) == (4, 4.0, 7.0)

    clock.set(d3.due_at)
    d4 = route(HAND, LADDER, "orders", 4, err, clock.now(), no_jitter)
    assert d4 == DeadLetterDecision(
        attempts=4, reason="exhausted", error_type="RuntimeError", error_message="db down"
    )


def test_attempt_beyond_max_is_exhausted_too() -> None:
    d = route(HAND, LADDER, "orders", 9, RuntimeError(), 0.0, no_jitter)
    assert isinstance(d, DeadLetterDecision)
    assert (d.attempts, d.reason) == (9, "exhausted")


def test_jitter_is_applied_to_the_delay_and_picks_the_tier() -> None:
    d = route(HAND, LADDER, "orders", 4, RuntimeError(), 100.0, lambda d: d * 0.5)
    assert isinstance(d, DeadLetterDecision)  # attempt 4 of 4
    p = RetryPolicy(initial=10.0, max_interval=600.0)
    r = route(p, LADDER, "orders", 2, RuntimeError(), 100.0, lambda d: d * 0.25)
    assert isinstance(r, RetryDecision)
    assert (r.delay, r.due_at, r.tier.label) == (5.0, 105.0, "5s")


def test_seeded_jitter_stays_within_the_backoff() -> None:
    src = SeededJitter(seed=1)
    for attempt in (1, 2, 3):
        r = route(HAND, LADDER, "orders", attempt, RuntimeError(), 50.0, src)
        assert isinstance(r, RetryDecision)
        assert 0.0 <= r.delay < 2.0 ** (attempt - 1)
        assert r.due_at == 50.0 + r.delay


def test_default_policy_zero_fields_do_not_hot_loop() -> None:
    r = route(
        RetryPolicy(initial=0.0, max_attempts=0), LADDER, "t", 1, RuntimeError(), 0.0, no_jitter
    )
    assert isinstance(r, RetryDecision)
    assert r.due_at == 1.0
    d = route(RetryPolicy(max_attempts=0), LADDER, "t", 5, RuntimeError(), 0.0, no_jitter)
    assert isinstance(d, DeadLetterDecision)


def _raise_from() -> BaseException:
    try:
        try:
            raise KeyError("k")
        except KeyError as inner:
            raise NonRetryableError("BadSpec", "no such field") from inner
    except NonRetryableError as e:
        return e


def _wrapped_cause() -> BaseException:
    try:
        try:
            raise NonRetryableError("BadSpec", "bad input")
        except NonRetryableError as inner:
            raise RuntimeError("handler failed") from inner
    except RuntimeError as e:
        return e


def _implicit_context() -> BaseException:
    try:
        try:
            raise DecodeError("not avro")
        except DecodeError:
            raise RuntimeError("while decoding")  # noqa: B904 - the implicit context is the test
    except RuntimeError as e:
        return e


NON_RETRYABLE: list[tuple[str, BaseException, tuple[str, ...]]] = [
    ("direct", NonRetryableError("BadSpec", "nope"), ()),
    ("raised from", _raise_from(), ()),
    ("cause of RuntimeError", _wrapped_cause(), ()),
    ("context of RuntimeError", _implicit_context(), ()),
    ("in ExceptionGroup", ExceptionGroup("many", [ValueError("a"), NonRetryableError("T")]), ()),
    ("decode error", DecodeError("garbage"), ()),
    ("policy-listed typed", RetryableError("BadSpec", "typed but listed"), ("BadSpec",)),
    ("policy-listed class", ValueError("plain"), ("ValueError",)),
]


@pytest.mark.parametrize(
    ("label", "exc", "listed"), NON_RETRYABLE, ids=[n[0] for n in NON_RETRYABLE]
)
def test_non_retryable_goes_to_dlq_after_one_attempt(
    label: str, exc: BaseException, listed: tuple[str, ...]
) -> None:
    policy = RetryPolicy(max_attempts=10, non_retryable=listed)
    d = route(policy, LADDER, "orders", 1, exc, 0.0, no_jitter)
    assert isinstance(d, DeadLetterDecision), label
    assert (d.attempts, d.reason) == (1, "non_retryable")


def test_policy_matches_the_type_not_the_message() -> None:
    policy = RetryPolicy(non_retryable=("BadSpec",))
    r = route(policy, LADDER, "orders", 1, RetryableError("Timeout", "BadSpec"), 0.0, no_jitter)
    assert isinstance(r, RetryDecision)
    assert r.error_type == "Timeout"
    r2 = route(policy, LADDER, "orders", 1, RuntimeError("BadSpec"), 0.0, no_jitter)
    assert isinstance(r2, RetryDecision)


def test_typed_retryable_error_is_retried_with_its_type() -> None:
    r = route(HAND, LADDER, "orders", 1, RetryableError("Timeout", "slow"), 0.0, no_jitter)
    assert isinstance(r, RetryDecision)
    assert (r.error_type, r.error_message) == ("Timeout", "slow")


def test_error_message_truncated() -> None:
    r = route(HAND, LADDER, "orders", 1, RuntimeError("x" * 5000), 0.0, no_jitter)
    assert isinstance(r, RetryDecision)
    assert len(r.error_message) == MAX_ERROR_MESSAGE == 1000
    d = route(HAND, LADDER, "orders", 1, NonRetryableError("T", "y" * 5000), 0.0, no_jitter)
    assert isinstance(d, DeadLetterDecision)
    assert len(d.error_message) == MAX_ERROR_MESSAGE


def test_attempt_below_one_is_a_bug() -> None:
    with pytest.raises(ValueError, match="attempt"):
        route(HAND, LADDER, "orders", 0, RuntimeError(), 0.0, no_jitter)
