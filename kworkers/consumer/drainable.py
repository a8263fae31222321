"""Drainable lag: the part of a partition's lag that more replicas could drain. One rule.

Why this exists: KEDA's Kafka scaler counts ``latest - committed`` on every partition, and
records the worker holds *on purpose* keep that up: an open breaker (the downstream is down), a
pool-wide rate limit at its bound, a registry that does not answer, a self-fenced member,
retries not yet due. More replicas drain none of it; they only add load to what is already
struggling. The rendered ScaledObject grows the pool on this figure instead
(``kworkers_drainable_lag``, docs/AUTOSCALING.md), and still wakes a pool at zero on any lag
(its Kafka triggers judge activation only).

The rule reads the same ``Hold`` facts the stall detector judges (``observe.stall_views``
builds them; a hold must be true when claimed, ``stall.overdue``), so the two can never
disagree about why a partition waits. Per hold:

* none, ``MEMORY`` (its loop is at its own byte bound) and ``RATE_LIMIT`` with
  ``scope="replica"``: every outstanding record is drainable: another replica brings its own
  bound, its own bucket;
* ``RATE_LIMIT`` with ``scope="pool"``: none: the pool's one bucket is the bottleneck; and
  while any record of the loop waits for that one bucket (``pool_at_bound``: a pool-wide
  limit with one bucket for every record, at its bound), no partition of the loop counts: the
  records queued behind the waiting ones for a handler slot would wait for the same bucket on
  any replica;
* ``NOT_DUE`` (a retry tier or schedule rung holding records until their ``kw-due-at``): only
  the records fetched and due (queued for a handler, or running); the records waiting in the
  heap are not, and neither are those not fetched yet: a tier has one delay, so a record
  behind one not yet due is due later still (jitter aside);
* ``BREAKER``, ``REGISTRY``, ``FENCED``, ``LEASE`` (another attempt's lease on its key): none;
* ``DRAINING`` (a graceful stop or a revoke under way): neither drainable nor held: the
  partition is about to move and its next owner reports it; 0 meanwhile, never counted twice.

A delayed partition (a retry tier, a schedule rung) none of whose records was fetched yet under
its assignment is *unseen*: 0, whatever its hold. Its records may all wait for due times nobody
has read yet, and the lag read made at the assignment routinely arrives before the first fetch:
counted as drainable then, a pool woken from zero by scheduled records asked for more replicas
at once (seen in CI). The figure is right from the first fetch on, a lag interval later.

Every ``Hold`` must be classified here: ``test_drainable`` fails when a new member is added
without a decision, and an unclassified hold counts as not drainable (a pool never grows on a
reason nobody thought about).

Pure: counts in, a count out.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from kworkers.consumer.stall import Hold


class Drain(enum.Enum):
    """What a hold leaves for more replicas to drain."""

    #: all of the partition's outstanding records
    ALL = "all"
    #: only what the replica's own rate limit holds (none when the limit is the pool's)
    UNLESS_POOL_LIMIT = "unless_pool_limit"
    #: only the records fetched and due
    DUE = "due"
    #: nothing
    NONE = "none"


#: every hold, and what it leaves drainable (the module doc says why)
RULE: Mapping[Hold, Drain] = {
    Hold.DRAINING: Drain.NONE,
    Hold.BREAKER: Drain.NONE,
    Hold.NOT_DUE: Drain.DUE,
    Hold.REGISTRY: Drain.NONE,
    Hold.FENCED: Drain.NONE,
    Hold.RATE_LIMIT: Drain.UNLESS_POOL_LIMIT,
    Hold.LEASE: Drain.NONE,
    Hold.MEMORY: Drain.ALL,
}


def drainable(hold: Hold | None, outstanding: int, due_fetched: int = 0, *,
              pool_rate_limit: bool = False, pool_at_bound: bool = False,
              unseen: bool = False) -> int:
    """Records of a partition that more replicas could drain.

    ``outstanding``: records from the lowest not yet completed to the log end (not the
    completed ones waiting for the next commit); ``due_fetched``: records fetched, not
    completed and not waiting in a tier's heap (only read for ``NOT_DUE``);
    ``pool_rate_limit``: the worker's rate limit has ``scope="pool"``; ``pool_at_bound``: one
    bucket for the whole pool and a record of the loop waits for it; ``unseen``: a delayed
    partition with nothing fetched yet under its assignment."""
    if unseen:
        return 0
    outstanding = max(0, outstanding)
    if pool_at_bound and hold is not Hold.NOT_DUE:
        return 0
    if hold is None:
        return outstanding
    how = RULE.get(hold, Drain.NONE)
    if how is Drain.ALL:
        return outstanding
    if how is Drain.UNLESS_POOL_LIMIT:
        return 0 if pool_rate_limit else outstanding
    if how is Drain.DUE:
        return min(outstanding, max(0, due_fetched))
    return 0
