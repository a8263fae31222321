"""What a poll loop needs to know: one frozen value, derived once from the worker's settings.

Why a value of its own rather than the worker's ``WorkerConfig``: the engine (``consumer/``)
then depends on nothing above it. ``WorkerConfig`` holds every setting a user can set (client
connections, topics, retry policy, mode) and validates them; it derives a ``LoopSettings``
once (``WorkerConfig.loop``), and both processors, the partitioned and the share one, take
only this. The bounds that follow from the settings (how long a stop waits, when a handler
call is hung, when a partition is stalled) are decided here, and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from kworkers.consumer.commit import CommitPolicy
from kworkers.consumer.stall import UNHEALTHY_AFTER
from kworkers.consumer.stall import default_bound as default_stall_bound
from kworkers.memory import DEFAULT_IN_FLIGHT_BYTES, hand_off_bytes

Ordering = Literal["partition", "key"]

#: a hung handler call is never judged sooner than this
MIN_STALL_BOUND_S = 60.0
#: how long one poll may block when nothing else is due (the loop's idle step)
POLL_TIMEOUT_S = 0.1
#: the most a consumer's close may take at a stop (a clean close takes a fraction of this)
MAX_CLOSE_S = 5.0
#: a handler call is bounded whether or not it has a deadline; False only in the canary that
#: shows the test of it has teeth (the rule before issue #43: no deadline, no bound)
BOUND_WITHOUT_DEADLINE = True


@dataclass(frozen=True, slots=True)
class LoopSettings:
    ordering: Ordering = "partition"
    #: handler executions at once: threads for sync handlers, tasks for async ones
    concurrency: int = 8
    consume_batch: int = 500
    max_in_flight: int = 20_000
    max_in_flight_per_partition: int = 5_000
    #: bytes of records fetched and not completed, per loop (``kworkers.memory``)
    max_in_flight_bytes: int = DEFAULT_IN_FLIGHT_BYTES
    #: the retry loop's timer heap, split into its partitions' shares
    delay_buffer: int = 10_000
    #: failed attempts handed off and not yet acknowledged, per loop
    handoff_limit: int = 10_000
    commit: CommitPolicy = field(default_factory=CommitPolicy)
    #: per-message deadline (None: none)
    message_timeout: float | None = None
    revoke_timeout: float = 10.0
    drain_timeout: float = 30.0
    #: a partition idle this long with lag is stalled (None: ``stall.default_bound``)
    stall_timeout: float | None = None
    #: stop starting records (and committing) once the group coordinator was silent for the
    #: session timeout less ``fence_margin`` (``kworkers.consumer.fencing``)
    self_fencing: bool = True
    #: None: ``fencing.default_margin`` of the session timeout
    fence_margin: float | None = None

    def hand_off_bytes(self) -> int:
        """Bytes of hand-offs and outputs unacknowledged per loop before runners wait."""
        return hand_off_bytes(self.max_in_flight_bytes)

    def started_work_bound(self) -> float:
        """How long a graceful stop waits for handler calls already started: their deadline
        when there is one, never more than ``drain_timeout`` (queued records are not waited
        for: the next owner reads them again)."""
        if self.message_timeout is None:
            return self.drain_timeout
        return min(self.drain_timeout, self.message_timeout)

    def leave_bound(self) -> float:
        """The longest a graceful stop takes: started work, then ``revoke_timeout`` for the
        last commit (which polls through a rebalance in progress) and the close, whatever the
        broker does (``close_budget`` of it for the close)."""
        return self.started_work_bound() + self.revoke_timeout

    def close_budget(self) -> float:
        """How much of ``revoke_timeout`` the consumer's close may take (it hangs on a frozen
        broker; the worker leaves without it after this)."""
        return min(MAX_CLOSE_S, self.revoke_timeout / 2)

    def slow_call_bound(self) -> float | None:
        """A handler call running this long since it started or since its last heartbeat makes
        the worker unready, naming the record and how long it has run
        (``kworkers.consumer.calls``): the partition stall bound (60 s at the defaults).
        (None only in the canary, ``BOUND_WITHOUT_DEADLINE``.)"""
        if self.hung_call_bound() is None:
            return None
        return self.partition_stall_bound()

    def hung_call_bound(self) -> float | None:
        """A handler call running this long since it started or since its last heartbeat is
        hung: Python cannot stop its thread, so the worker turns unhealthy and exits
        (committing what finished) and a restart frees it; the record's next run counts as an
        attempt (a takeover of its lease). With a deadline (its lane moved on at it) three
        deadlines, at least a minute; without one, ``UNHEALTHY_AFTER`` stall bounds (180 s at
        the defaults): a handler that never returns holds its partition as surely as a
        stall does. (None only in the canary, ``BOUND_WITHOUT_DEADLINE``.)"""
        if self.message_timeout is None:
            if not BOUND_WITHOUT_DEADLINE:
                return None
            return UNHEALTHY_AFTER * self.partition_stall_bound()
        return max(3 * self.message_timeout, MIN_STALL_BOUND_S)

    def partition_stall_bound(self) -> float:
        """How long an assigned partition may make no progress, with lag and nothing running or
        holding it, before it counts as stalled (``kworkers.consumer.stall``)."""
        if self.stall_timeout is not None:
            return float(self.stall_timeout)
        return default_stall_bound(self.message_timeout, self.commit.interval_s)
