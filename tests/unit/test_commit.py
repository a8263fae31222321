"""Commit policy and seed 001's commit-retry rules, now driven asynchronously: the exact
sequences of attempts and waits, the hung broker, matching outcomes to what was sent."""

from __future__ import annotations

import itertools
from typing import Literal, cast

import pytest

from kworkers.clock import Clock
from kworkers.consumer.commit import (
    COMMIT_RETRY_WAITS,
    REBALANCE_WAITS,
    CommitOutcome,
    CommitPolicy,
    CommitRun,
    ErrorKind,
)
from kworkers.errors import ConfigError

TP = ("t", 0)


class Retryable(Exception):
    pass


class Permanent(Exception):
    pass


class Rebalancing(Exception):
    pass


KINDS = {Retryable: ErrorKind.RETRYABLE, Permanent: ErrorKind.PERMANENT,
         Rebalancing: ErrorKind.REBALANCING}


def drive(*steps: type[Exception] | Literal["hang"] | None, last_chance: bool = False,
          timeout_s: float = 10.0) -> tuple[CommitRun, list[float]]:
    """A commit answered according to ``steps`` (None: success; a class: that refusal; the
    string "hang": no answer at all); returns the run and the times each attempt went out, on
    a clock the run never sleeps on (the loop polls meanwhile)."""
    run = CommitRun({TP: 10}, "periodic", timeout_s, last_chance=last_chance)
    now = 0.0
    sent: list[float] = []
    run.send(now)
    sent.append(now)
    answers = list(steps)
    while not run.done:
        step = answers.pop(0) if answers else None
        now += 0.001  # the answer comes back after a round trip
        if step == "hang":
            now += timeout_s
            assert run.expired(now)
            run.timed_out(now)
        elif step is None:
            run.result(now, None, None)
        else:
            run.result(now, step("injected"), KINDS[step])
        if cast(bool, run.done):  # re-read: the answer may have ended the run
            break
        assert run.resend_at is not None and not run.due(now)
        now = run.resend_at
        assert run.due(now)
        run.send(now)
        sent.append(now)
    return run, sent


def test_success_first_time() -> None:
    run, _sent = drive(None)
    assert (run.outcome, run.attempts, run.waits) == (CommitOutcome.COMMITTED, 1, [])


def test_success_on_fifth_and_last_attempt() -> None:
    run, _sent = drive(Retryable, Retryable, Retryable, Retryable, None)
    assert run.outcome is CommitOutcome.COMMITTED and run.attempts == 5
    assert run.waits == [0.1, 0.2, 0.4, 0.8]


def test_five_retryable_then_give_up() -> None:
    run, _sent = drive(*[Retryable] * 6)
    assert run.outcome is CommitOutcome.FAILED
    assert run.attempts == 5  # not 6: five attempts in all
    assert run.waits == [0.1, 0.2, 0.4, 0.8]
    assert isinstance(run.error, Retryable)


def test_permanent_on_first_attempt_is_a_confirmed_failure() -> None:
    run, _sent = drive(Permanent)
    assert (run.outcome, run.attempts, run.waits) == (CommitOutcome.FAILED, 1, [])


def test_permanent_after_retryable_is_uncertain() -> None:
    run, _sent = drive(Retryable, Retryable, Permanent)
    assert run.outcome is CommitOutcome.UNCERTAIN and run.attempts == 3
    assert run.waits == [0.1, 0.2]


def test_retryable_then_success() -> None:
    run, _sent = drive(Retryable, None)
    assert (run.outcome, run.attempts, run.waits) == (CommitOutcome.COMMITTED, 2, [0.1])


def test_the_waits_are_loop_time_between_an_answer_and_the_next_attempt() -> None:
    _run, sent = drive(Retryable, Retryable, None)
    gaps = [round(b - a - 0.001, 6) for a, b in itertools.pairwise(sent)]
    assert gaps == [0.1, 0.2]


def test_a_hung_broker_is_a_retryable_timeout_per_attempt_and_ends_in_failure() -> None:
    """The sequence the synchronous commit never reached: the broker answers nothing. Each
    attempt times out after ``timeout_s`` and is sent again by seed 001's waits; after five
    the run has FAILED (the next commit or a redelivery covers it), never waiting forever."""
    hangs: list[Literal["hang"]] = ["hang"] * 6
    run, sent = drive(*hangs, timeout_s=2.0)
    assert run.outcome is CommitOutcome.FAILED and run.attempts == 5
    assert run.waits == list(COMMIT_RETRY_WAITS)
    assert isinstance(run.error, TimeoutError)
    assert sent[-1] <= 5 * 2.0 + sum(COMMIT_RETRY_WAITS) + 0.01


def test_a_hung_attempt_then_a_permanent_refusal_is_uncertain() -> None:
    run, _sent = drive("hang", Permanent, timeout_s=2.0)
    assert run.outcome is CommitOutcome.UNCERTAIN


def test_a_rebalance_defers_at_once_and_after_a_retryable_error_is_uncertain() -> None:
    run, _sent = drive(Rebalancing)
    assert (run.outcome, run.waits) == (CommitOutcome.DEFERRED, [])
    run, _sent = drive(Retryable, Rebalancing)
    assert (run.outcome, run.waits) == (CommitOutcome.UNCERTAIN, [0.1])


def test_a_last_chance_commit_retries_a_rebalance_briefly_then_defers() -> None:
    """The drain's commit has no next commit to carry its positions: a refusal by a
    rebalance is sent again after the short waits; only when they are spent is it deferred."""
    run, _sent = drive(Rebalancing, Rebalancing, None, last_chance=True)
    assert run.outcome is CommitOutcome.COMMITTED
    assert run.waits == list(REBALANCE_WAITS[:2])
    run, _sent = drive(*[Rebalancing] * (len(REBALANCE_WAITS) + 1), last_chance=True)
    assert run.outcome is CommitOutcome.DEFERRED and run.waits == list(REBALANCE_WAITS)
    assert sum(REBALANCE_WAITS) < sum(COMMIT_RETRY_WAITS)


def test_a_run_that_may_not_be_sent_again_ends_where_it_would_be() -> None:
    """A revoke's run (and any run whose partitions left): a resend after the new owner
    committed could move the position back, so it ends unsent instead."""
    run = CommitRun({TP: 10}, "revoke", 10.0, resendable=False)
    run.send(0.0)
    run.result(0.1, Retryable("x"), ErrorKind.RETRYABLE)
    assert run.outcome is CommitOutcome.FAILED and run.attempts == 1 and run.waits == []
    run = CommitRun({TP: 10}, "periodic", 10.0)
    run.send(0.0)
    run.result(0.1, Retryable("x"), ErrorKind.RETRYABLE)
    assert run.resend_at is not None
    run.stop_resending()  # its partitions were revoked meanwhile
    assert run.outcome is CommitOutcome.UNCERTAIN and run.resend_at is None


def test_an_outcome_is_matched_by_the_offsets_it_names() -> None:
    run = CommitRun({("t", 0): 10, ("t", 1): 4}, "periodic", 10.0)
    assert run.matches({("t", 1): 4, ("t", 0): 10})
    assert not run.matches({("t", 0): 9, ("t", 1): 4})  # an earlier run's
    assert not run.matches({("t", 0): 10})


def test_policy_interval_or_count() -> None:
    p = CommitPolicy(interval_s=1.0, max_completions=100)
    assert not p.should_commit(now=10.5, last_commit_at=10.0, completions=5)
    assert p.should_commit(now=11.0, last_commit_at=10.0, completions=5)
    assert p.should_commit(now=10.1, last_commit_at=10.0, completions=100)
    assert not p.should_commit(now=99.0, last_commit_at=10.0, completions=0)
    with pytest.raises(ConfigError, match="interval"):
        CommitPolicy(interval_s=0)
    with pytest.raises(ConfigError, match="max_completions"):
        CommitPolicy(max_completions=0)
    with pytest.raises(ConfigError, match="timeout_s"):
        CommitPolicy(timeout_s=0)
    with pytest.raises(ConfigError, match="timeout_s"):
        CommitPolicy(timeout_s=float("nan"))


class _Port:
    """A consumer port that answers each commit with what ``answers`` says, in order."""

    group = "g"

    def __init__(self, *answers: BaseException | None) -> None:
        self.answers = list(answers)
        self.sent: list[dict[tuple[str, int], int]] = []
        self.reports: list[tuple[dict[tuple[str, int], int], BaseException | None]] = []

    def commit_async(self, positions: dict[tuple[str, int], int]) -> None:
        self.sent.append(positions)
        self.reports.append((positions, self.answers.pop(0)))

    def commit_results(self) -> list[tuple[dict[tuple[str, int], int], BaseException | None]]:
        out, self.reports = self.reports, []
        return out

    def is_rebalancing(self, error: BaseException) -> bool:
        return False

    def is_retryable(self, error: BaseException) -> bool:
        return isinstance(error, Retryable)


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def monotonic(self) -> float:
        return self.t

    def now(self) -> float:
        return self.t


def test_commit_latency_counts_from_the_first_attempt_to_the_outcome() -> None:
    """``kworkers_commit_duration_seconds``: one observation per commit, spanning its retries
    (a retryable refusal, the 100 ms backoff, the second attempt), on the injected clock."""
    from kworkers.consumer.committer import Committer
    from kworkers.consumer.partition import PartitionState
    from kworkers.consumer.ports import ConsumerPort
    from kworkers.metrics import Metrics

    m, clock, port = Metrics(), _Clock(), _Port(Retryable("busy"), None)
    committer = Committer(cast(ConsumerPort, port), m, "g", cast(Clock, clock), 10.0)
    ps = PartitionState("t", 0)
    ps.tracker.track_many([0, 1])
    ps.tracker.complete_many([0, 1])
    assert committer.start([ps], "periodic") is not None
    clock.t += 0.03
    assert committer.tick({ps.tp: ps}) == []     # refused: a retry is scheduled
    clock.t += COMMIT_RETRY_WAITS[0]
    committer.tick({ps.tp: ps})                  # the retry goes out
    clock.t += 0.02
    (done,) = committer.tick({ps.tp: ps})
    assert done.outcome is CommitOutcome.COMMITTED and len(port.sent) == 2
    assert m.registry.get_sample_value("kworkers_commit_duration_seconds_count",
                                       {"group": "g"}) == 1
    total = m.registry.get_sample_value("kworkers_commit_duration_seconds_sum", {"group": "g"})
    assert total == pytest.approx(0.03 + COMMIT_RETRY_WAITS[0] + 0.02)
