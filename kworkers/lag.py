"""Consumer lag as KEDA's Kafka scaler counts it, and the retry backlog it should not count.

Why mirror KEDA rather than print "high watermark minus position": the pool is sized by KEDA,
so the number an operator needs is the one KEDA acts on, with the same rules for a partition
the group never committed on:

* committed offset present: ``latest - committed`` (KEDA does not clamp it; neither do we);
* no commit and ``scaleToZeroOnInvalidOffset``: 0;
* no commit, ``offsetResetPolicy: latest``: 1 (so a group that never ran still gets a pod);
* no commit, ``offsetResetPolicy: earliest``: ``latest`` (the whole log is ahead of it).

Retry tiers are consumed by a group of their own (``<group>.retry``) so records waiting for
their due time never count as the main group's lag. ``kworkers lag`` shows that group apart,
and splits its lag into records still *waiting* (``kw-due-at`` in the future) and records due
now. Counting the waiting ones means reading the tier partitions; that happens in the CLI's
adapter, and this module only does the arithmetic on what was read.

Time lag (``time_lag``): how long the record at the committed position has waited, ``now``
minus its timestamp (a retry tier: minus its ``kw-due-at``, 0 while it is not due), 0 for a
partition with no lag; the worker's own gauge measures the same from the oldest record it has
not completed (``kworkers.consumer.time_lag`` says the definition in full).

Everything here is pure: offsets and due times in, numbers out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from kworkers.errors import ConfigError
from kworkers.topic_names import topic_order

ResetPolicy = Literal["latest", "earliest"]

#: The policy kworkers renders (``kworkers deploy render``'s ScaledObject) and every reading of
#: lag assumes unless told otherwise (``kworkers lag``, the console): the worker's consumers
#: start a partition with no commit from its earliest offset, so the whole log is ahead of
#: them, and an empty partition never committed on (a retry tier nothing failed into yet) is
#: lag 0. Under KEDA's own default (``latest``) that partition would count 1, and every empty
#: tier would read as a due retry.
RENDERED_RESET_POLICY: ResetPolicy = "earliest"

#: At most this many records are read per tier partition to count the waiting ones.
WAITING_SCAN_LIMIT = 10_000


def partition_lag(
    latest: int,
    committed: int | None,
    reset_policy: ResetPolicy = RENDERED_RESET_POLICY,
    scale_to_zero_on_invalid: bool = False,
) -> int:
    """One partition's lag as KEDA computes it; ``committed`` None (or < 0) = no commit."""
    if reset_policy not in ("latest", "earliest"):
        raise ConfigError(f"offset reset policy: 'latest' or 'earliest', got {reset_policy!r}")
    if committed is None or committed < 0:
        if scale_to_zero_on_invalid:
            return 0
        return 1 if reset_policy == "latest" else latest
    return latest - committed


def count_waiting(due_ats: Iterable[float | None], now: float) -> int:
    """Records not yet due: a due time strictly after ``now`` (no due time = due now)."""
    return sum(1 for d in due_ats if d is not None and d > now)


@dataclass(frozen=True)
class PartitionLag:
    """One partition of a group: offsets, KEDA's lag, and for retry tiers the waiting part.

    ``waiting`` is None where it was not counted (main topics); ``truncated`` says the count
    stopped at the scan limit, so the true number may be larger.
    """

    topic: str
    partition: int
    committed: int | None
    latest: int
    lag: int
    waiting: int | None = None
    truncated: bool = False
    #: seconds the record at the committed position has waited (None: not read)
    time_lag: float | None = None

    @property
    def due(self) -> int | None:
        """Lag that is due now (runnable), for a retry tier partition."""
        if self.waiting is None:
            return None
        return max(0, self.lag - self.waiting)


@dataclass(frozen=True)
class GroupLag:
    """A group's partitions and their totals."""

    group: str
    partitions: tuple[PartitionLag, ...]

    @property
    def total(self) -> int:
        return sum(p.lag for p in self.partitions)

    @property
    def waiting(self) -> int:
        return sum(p.waiting or 0 for p in self.partitions)

    @property
    def truncated(self) -> bool:
        return any(p.truncated for p in self.partitions)

    @property
    def time_lag(self) -> float | None:
        """The group's time lag: its partitions' largest (None: none was read)."""
        return max((p.time_lag for p in self.partitions if p.time_lag is not None),
                   default=None)


def lag_seconds(now: float, lag: int, t: float | None) -> float | None:
    """A partition's time lag from the time ``t`` of the record at its committed position
    (its timestamp, or a tier record's due time): 0 with no lag, never below 0, None when the
    record was not read."""
    if lag <= 0:
        return 0.0
    return None if t is None else max(0.0, now - t)


def group_lag(
    group: str,
    offsets: Sequence[tuple[str, int, int, int | None]],
    reset_policy: ResetPolicy = RENDERED_RESET_POLICY,
    scale_to_zero_on_invalid: bool = False,
    waiting: dict[tuple[str, int], tuple[int, bool]] | None = None,
    times: dict[tuple[str, int], float | None] | None = None,
    now: float = 0.0,
) -> GroupLag:
    """``GroupLag`` from ``(topic, partition, latest, committed)`` rows, sorted as the
    pipeline runs (``topic_names.topic_order``: tiers by delay, not as text).

    ``waiting`` maps a partition to ``(records not yet due, truncated)``; it is only known
    for the retry tier group. ``times`` maps a partition to the time of the record at its
    committed position (``lag_seconds``, read at ``now``); without it no time lag is given.
    """
    rows = []
    for topic, part, latest, committed in sorted(offsets,
                                                 key=lambda r: (topic_order(r[0]), r[1])):
        lag = partition_lag(latest, committed, reset_policy, scale_to_zero_on_invalid)
        w = None if waiting is None else waiting.get((topic, part), (0, False))
        rows.append(PartitionLag(
            topic, part, committed if committed is not None and committed >= 0 else None,
            latest, lag, None if w is None else min(w[0], max(lag, 0)),
            False if w is None else w[1],
            None if times is None else lag_seconds(now, lag, times.get((topic, part)))))
    return GroupLag(group, tuple(rows))
