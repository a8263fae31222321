"""What the poll loop tells the outside about its partitions: the views the stall
watch judges, why paused partitions are paused. Read from the poll thread's state, never
changing it, and kept out of the loop so the loop reads as what it does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from typing import Protocol

from kworkers.clock import Clock
from kworkers.consumer.partition import PartitionState
from kworkers.consumer.ports import TP
from kworkers.consumer.stall import Hold, PartitionView
from kworkers.consumer.tier_gate import TierGate


class _Gauge(Protocol):
    def set(self, value: float) -> None: ...


class _Labelled(Protocol):
    def labels(self, *values: str) -> _Gauge: ...


def pause_reason(draining: bool, breaker_open: bool, fenced: bool = False) -> str:
    """Why paused partitions are paused now: a drain, a fenced member or an open breaker
    pauses all of them; otherwise each paused partition holds its share (``backpressure``)."""
    if draining:
        return "draining"
    if fenced:
        return "fenced"
    if breaker_open:
        return "breaker"
    return "backpressure"


def stall_views(parts: Iterable[PartitionState], calling: Set[TP], gate: TierGate | None,
                draining: bool, breaker_open: bool,
                registry: Set[TP] = frozenset(),
                fenced: bool = False,
                rate_limited: Set[TP] = frozenset(), *,
                clock: Clock | None = None,
                breaker_ends: float | None = None,
                asked: Mapping[TP, float] | None = None,
                registry_due: Mapping[TP, float] | None = None,
                leases: Mapping[TP, float] | None = None,
                memory: bool = False) -> tuple[PartitionView, ...]:
    """The partitions as the stall watch needs them (``kworkers.consumer.stall``).
    ``registry``: the partitions whose next record waits for the schema registry;
    ``rate_limited``: those whose next record waits for a rate-limit token; ``leases``: those
    whose next record waits for another attempt's lease on its key, with the lease's end.

    Each hold comes with the time it should be over by, where one is known (``hold_ends``,
    monotonic; ``clock`` converts the gate's due times): the earliest waiting tier record's due
    time (the gate's own account of what it admitted and released), the breaker's end of
    cool-down (``breaker_ends``), the moment a rate-limited record last asked for a token
    (``asked``: a waiter asks every few milliseconds and takes a token as soon as there is
    one), the moment a record waiting for the schema registry should have asked it again
    (``registry_due``), the lease's expiry. ``stall.overdue`` judges them.

    ``memory``: the loop holds its byte bound (``backpressure``): a partition holding nothing
    waits for the others' records to complete, a hold that ends with the loop's next
    completion, so it is over by the loop's last progress (a loop at its bound that completes
    nothing for a stall bound holds nobody on purpose)."""
    common = (Hold.DRAINING if draining else Hold.FENCED if fenced else
              Hold.BREAKER if breaker_open else None)
    common_ends = breaker_ends if common is Hold.BREAKER else None
    mono = clock.monotonic() if clock is not None else 0.0
    wall = clock.now() if clock is not None else 0.0
    views = []
    states = list(parts)
    last = max((ps.progress_at for ps in states), default=0.0) if memory else 0.0
    for ps in states:
        hold, ends = common, common_ends
        if hold is None and gate is not None and gate.held(ps):
            hold = Hold.NOT_DUE
            due = gate.earliest_due(ps) if clock is not None else None
            ends = None if due is None else mono - (wall - due)
        if hold is None and ps.tp in registry:
            hold = Hold.REGISTRY
            ends = None if registry_due is None else registry_due.get(ps.tp)
        if hold is None and ps.tp in rate_limited:
            hold = Hold.RATE_LIMIT
            ends = None if asked is None else asked.get(ps.tp)
        if hold is None and leases is not None and ps.tp in leases:
            hold, ends = Hold.LEASE, leases[ps.tp]
        tr = ps.tracker
        if hold is None and memory and not tr.window:
            hold, ends = Hold.MEMORY, last
        pos = tr.position if tr.position is not None else tr.committed
        views.append(PartitionView(ps.tp, ps.progress_at, ps.tp in calling or ps.handoffs > 0,
                                   hold, tr.window, pos, ends))
    return tuple(views)
