"""The drainable-lag rule (issue #47 item 2): what more replicas could drain, from the stall
detector's ``Hold`` facts, one rule in one place (``kworkers.consumer.drainable``).

The property a pool's autoscaling needs: a partition held on purpose by something more
replicas cannot relieve counts 0, and a partition that more replicas could drain counts all
its outstanding records. The canary is the raw lag (what KEDA's Kafka scaler counts), run
through the same check and caught counting held partitions.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kworkers.consumer.drainable import RULE, Drain, drainable
from kworkers.consumer.stall import Hold

Rule = Callable[..., int]

#: (hold, outstanding, due fetched, pool-wide limit) -> what more replicas could drain
CASES: list[tuple[Hold | None, int, int, bool, int]] = [
    (None, 500, 0, False, 500),                # a backlog: all of it
    (None, 500, 0, True, 500),                 # a pool limit not at its bound holds nothing
    (Hold.MEMORY, 500, 0, False, 500),         # its loop's own byte bound: another replica
    (Hold.RATE_LIMIT, 500, 0, False, 500),     # scope="replica": another replica, another bucket
    (Hold.RATE_LIMIT, 500, 0, True, 0),        # scope="pool": one bucket for all of them
    (Hold.BREAKER, 500, 0, False, 0),          # the downstream is down
    (Hold.REGISTRY, 500, 0, False, 0),         # the schema registry does not answer
    (Hold.FENCED, 500, 0, False, 0),           # this member fenced itself
    (Hold.LEASE, 500, 0, False, 0),            # another attempt holds the key's lease
    (Hold.DRAINING, 500, 0, False, 0),         # about to move: its next owner reports it
    (Hold.NOT_DUE, 500, 0, False, 0),          # retries waiting for their due time
    (Hold.NOT_DUE, 500, 40, False, 40),        # ... with 40 due and queued: those 40
    (Hold.NOT_DUE, 30, 40, False, 30),         # never more than outstanding
    (None, -3, 0, False, 0),                   # never below 0
]


def _check(rule: Rule) -> None:
    for hold, out, due, pool, want in CASES:
        got = rule(hold, out, due, pool_rate_limit=pool)
        assert got == want, f"{hold} with {out} outstanding ({due} due, pool={pool}): {got}"


def _raw_lag(hold: Hold | None, outstanding: int, due_fetched: int = 0, *,
             pool_rate_limit: bool = False) -> int:
    """The canary: every outstanding record counts, as KEDA's Kafka scaler counts lag."""
    return max(0, outstanding)


@pytest.mark.parametrize("canary", [False, True], ids=["rule", "canary-raw-lag"])
def test_held_partitions_count_nothing_and_drainable_ones_count_everything(
        canary: bool) -> None:
    if not canary:
        _check(drainable)
        return
    with pytest.raises(AssertionError, match=r"Hold\.RATE_LIMIT with 500 outstanding"):
        _check(_raw_lag)


def test_a_pool_wide_bucket_at_its_bound_holds_the_whole_loop() -> None:
    """Records queued for a handler slot behind those waiting for the pool's one bucket would
    wait for the same bucket on any replica: nothing of the loop drains elsewhere."""
    assert drainable(None, 300, pool_rate_limit=True, pool_at_bound=True) == 0
    assert drainable(Hold.MEMORY, 300, pool_rate_limit=True, pool_at_bound=True) == 0
    assert drainable(None, 300, pool_rate_limit=True) == 300  # not at its bound: all
    # retries coming due are not the source's rate limit's: they still count their due part
    assert drainable(Hold.NOT_DUE, 300, 7, pool_rate_limit=True, pool_at_bound=True) == 7


def test_every_hold_is_decided() -> None:
    """A new ``Hold`` (issues #43, #45 add them) must be classified here, never defaulted."""
    assert set(RULE) == set(Hold), f"undecided: {set(Hold) - set(RULE)}"
    assert set(RULE.values()) <= set(Drain)


def test_an_unclassified_hold_counts_as_not_drainable() -> None:
    class Other:  # what a Hold member added without a decision would look like at run time
        pass

    assert drainable(Other(), 100) == 0  # type: ignore[arg-type]
