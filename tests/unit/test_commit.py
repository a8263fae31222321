"""Commit policy and the commit-retry rules of seed 001 (exact call sequences)."""

from __future__ import annotations

import pytest

from kworkers.consumer.commit import (
    CommitOutcome,
    CommitPolicy,
    commit_with_retry,
)
from kworkers.errors import ConfigError


class Retryable(Exception):
    pass


class Permanent(Exception):
    pass


class Script:
    """A commit that fails according to a script; records every call and every sleep."""

    def __init__(self, *steps: type[Exception] | None) -> None:
        self.steps = list(steps)
        self.calls = 0
        self.sleeps: list[float] = []

    def commit(self) -> None:
        step = self.steps[self.calls] if self.calls < len(self.steps) else None
        self.calls += 1
        if step is not None:
            raise step("injected")

    def run(self):  # type: ignore[no-untyped-def]
        return commit_with_retry(
            self.commit, lambda e: isinstance(e, Retryable), self.sleeps.append
        )


def test_success_first_time() -> None:
    s = Script(None)
    r = s.run()
    assert (r.outcome, r.attempts, s.calls, s.sleeps) == (CommitOutcome.COMMITTED, 1, 1, [])


def test_success_on_fifth_and_last_attempt() -> None:
    s = Script(Retryable, Retryable, Retryable, Retryable, None)
    r = s.run()
    assert r.outcome is CommitOutcome.COMMITTED
    assert s.calls == 5
    assert s.sleeps == [0.1, 0.2, 0.4, 0.8]


def test_five_retryable_then_give_up() -> None:
    s = Script(*[Retryable] * 6)
    r = s.run()
    assert r.outcome is CommitOutcome.FAILED
    assert s.calls == 5  # not 6: five attempts in all
    assert s.sleeps == [0.1, 0.2, 0.4, 0.8]
    assert isinstance(r.error, Retryable)


def test_permanent_on_first_attempt_is_a_confirmed_failure() -> None:
    s = Script(Permanent)
    r = s.run()
    assert (r.outcome, s.calls, s.sleeps) == (CommitOutcome.FAILED, 1, [])


def test_permanent_after_retryable_is_uncertain() -> None:
    s = Script(Retryable, Retryable, Permanent)
    r = s.run()
    assert r.outcome is CommitOutcome.UNCERTAIN
    assert s.calls == 3
    assert s.sleeps == [0.1, 0.2]


def test_retryable_then_success() -> None:
    s = Script(Retryable, None)
    r = s.run()
    assert (r.outcome, r.attempts, s.sleeps) == (CommitOutcome.COMMITTED, 2, [0.1])


def test_policy_interval_or_count() -> None:
    p = CommitPolicy(interval_s=1.0, max_completions=100)
    assert not p.should_commit(now=10.5, last_commit_at=10.0, completions=5)
    assert p.should_commit(now=11.0, last_commit_at=10.0, completions=5)
    assert p.should_commit(now=10.1, last_commit_at=10.0, completions=100)
    assert not p.should_commit(now=99.0, last_commit_at=10.0, completions=0)
    with pytest.raises(ConfigError):
        CommitPolicy(interval_s=0)
    with pytest.raises(ConfigError):
        CommitPolicy(max_completions=0)


def test_a_rebalance_defers_at_once_and_after_a_retryable_error_is_uncertain() -> None:
    from kworkers.consumer.commit import CommitOutcome, commit_with_retry

    class Rebalancing(Exception):
        pass

    class Timeout(Exception):
        pass

    def script(*errors: type[Exception]) -> list[type[Exception]]:
        return list(errors)

    for errors, outcome, waits in ((script(Rebalancing), CommitOutcome.DEFERRED, []),
                                   (script(Timeout, Rebalancing), CommitOutcome.UNCERTAIN, [0.1])):
        left = list(errors)
        slept: list[float] = []

        def commit(left: list[type[Exception]] = left) -> None:
            if left:
                raise left.pop(0)("x")

        r = commit_with_retry(commit, lambda e: isinstance(e, Timeout), slept.append,
                              is_rebalancing=lambda e: isinstance(e, Rebalancing))
        assert r.outcome is outcome and slept == waits


def test_a_last_chance_commit_retries_a_rebalance_briefly_then_defers() -> None:
    """A revoke's or a drain's commit has no next commit to carry its positions: a refusal by
    a rebalance is retried with the short waits; only when they are spent is it deferred."""
    from kworkers.consumer.commit import REBALANCE_WAITS, CommitOutcome, commit_with_retry

    class Rebalancing(Exception):
        pass

    for refusals, outcome in ((2, CommitOutcome.COMMITTED),
                              (len(REBALANCE_WAITS) + 1, CommitOutcome.DEFERRED)):
        left = [refusals]
        slept: list[float] = []

        def commit(left: list[int] = left) -> None:
            if left[0]:
                left[0] -= 1
                raise Rebalancing("x")

        r = commit_with_retry(commit, lambda e: False, slept.append,
                              is_rebalancing=lambda e: isinstance(e, Rebalancing),
                              rebalance_waits=REBALANCE_WAITS)
        assert r.outcome is outcome
        assert slept == list(REBALANCE_WAITS[:min(refusals, len(REBALANCE_WAITS))])
        assert sum(REBALANCE_WAITS) < sum((0.1, 0.2, 0.4, 0.8))
