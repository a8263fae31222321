"""Time lag: how long the oldest record a partition has not completed has been waiting.

The definition (the same in ``kworkers_consumer_time_lag_seconds``, ``kworkers lag`` and the
console): for the partition's oldest record not yet completed (the one at the group's
position), ``now - t``, where ``t`` is

* on a source topic: the record's Kafka timestamp (the producer's ``CreateTime``, or the
  broker's ``LogAppendTime`` when the topic says so);
* on a retry tier or a schedule rung: its ``kw-due-at``, so the figure is how late a due
  record is; a record not yet due counts 0.

Never below 0 (a producer clock ahead of ours, a record not yet due). A partition with nothing
outstanding (caught up, idle or not) is 0. A record whose producer set a timestamp far in the
past counts from it, as Kafka does: a backfill that keeps the events' own times reads as far
behind (the rendered time-lag trigger counts such a partition once, so it asks for at most one
replica per partition behind; a topic with ``message.timestamp.type=LogAppendTime`` measures
from the append instead).

The worker knows ``t`` for the records it fetched: per fetched run of a partition
(``Stamps.add``, once per run, not per record) the first and last offsets with their times;
a record between them is interpolated by offset (exact at the ends; monotonic times give a
figure between the two). A partition whose oldest outstanding record is not fetched yet (it
sits in the client's queue, or the partition is paused holding nothing) is bounded from
above: that record came after the last one fetched and after the moment the partition was
last seen caught up. Until one of these is known (just assigned, nothing fetched) there is no
figure, and the series is absent rather than wrong, as for the lag itself (``lag_view``).

Pure: offsets and times in, seconds out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Run:
    """A fetched run of one partition: its first and last offsets and their times (epoch
    seconds; None where a record had none)."""

    first: int
    first_t: float | None
    last: int
    last_t: float | None

    def time_of(self, offset: int) -> float | None:
        if self.first_t is None or self.last_t is None or self.last == self.first:
            # the earlier time where one is missing: a figure too high, never too low
            return self.first_t if self.first_t is not None else self.last_t
        share = (offset - self.first) / (self.last - self.first)
        return self.first_t + share * (self.last_t - self.first_t)


class Stamps:
    """The runs a partition fetched that may still hold its oldest outstanding record (owned
    by the poll thread, like the rest of ``PartitionState``)."""

    __slots__ = ("_runs", "last_t")

    #: runs kept at most (a partition's window spans a few; older ones are dropped)
    LIMIT = 1024

    def __init__(self) -> None:
        self._runs: deque[Run] = deque()
        #: the time of the last record fetched (the next one is no older, times being
        #: monotonic per partition)
        self.last_t: float | None = None

    def add(self, first: int, first_t: float | None, last: int, last_t: float | None) -> None:
        self._runs.append(Run(first, first_t, last, last_t))
        if len(self._runs) > self.LIMIT:
            self._runs.popleft()
        if last_t is not None:
            self.last_t = last_t if self.last_t is None else max(self.last_t, last_t)

    def time_of(self, offset: int) -> float | None:
        """``offset``'s time, if a run kept holds it; runs wholly before it are dropped (the
        oldest outstanding offset only moves forward)."""
        runs = self._runs
        while runs and runs[0].last < offset:
            runs.popleft()
        if runs and runs[0].first <= offset:
            return runs[0].time_of(offset)
        return None

    def __len__(self) -> int:
        return len(self._runs)


def time_lag(now: float, outstanding: int | None, head_t: float | None,
             last_t: float | None = None, caught_up_at: float | None = None) -> float | None:
    """The partition's time lag in seconds, or None while it is not known.

    ``outstanding``: records from the oldest not completed to the log end (None: unknown);
    ``head_t``: the oldest outstanding record's time, when it was fetched; ``last_t``: the time
    of the last record fetched; ``caught_up_at``: when the partition was last seen with
    nothing outstanding. The last two bound a record not fetched yet (module doc)."""
    if outstanding is None:
        return None
    if outstanding <= 0:
        return 0.0
    if head_t is not None:
        return max(0.0, now - head_t)
    bounds = [t for t in (last_t, caught_up_at) if t is not None]
    if not bounds:
        return None
    return max(0.0, now - max(bounds))
