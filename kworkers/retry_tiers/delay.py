"""A bounded timer heap: a tier consumer reads ahead and runs each record at its due time.

Holding not-yet-due records here, instead of pausing the partition until the head record is
due, removes head-of-line blocking: records with different due times in one tier each run on
time and complete out of order. The bound is what keeps read-ahead from eating memory; when
``full``, the caller pauses the partition.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Generic, TypeVar

from kworkers.errors import ConfigError

T = TypeVar("T")


class DelayBuffer(Generic[T]):
    """Items ordered by due time, ties in insertion order; push and pop are O(log n).

    Not thread-safe: it belongs to the poll thread, which fires due timers.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ConfigError(f"a delay buffer needs a capacity >= 1, got {capacity}")
        self._capacity = capacity
        # The sequence number breaks ties (same due time -> offset order) and keeps the heap
        # from ever comparing two items, which need not be orderable.
        self._heap: list[tuple[float, int, T]] = []
        self._seq = itertools.count()

    def push(self, due_at: float, item: T) -> None:
        """Hold ``item`` until ``due_at``; ``BufferError`` when full (pause, don't grow)."""
        if math.isnan(due_at):
            raise ValueError("due_at is NaN; it would corrupt the heap order")
        if self.full:
            raise BufferError(f"delay buffer full ({self._capacity} items)")
        heapq.heappush(self._heap, (due_at, next(self._seq), item))

    @property
    def full(self) -> bool:
        return len(self._heap) >= self._capacity

    @property
    def capacity(self) -> int:
        return self._capacity

    @capacity.setter
    def capacity(self, value: int) -> None:
        """A new hard bound (the owner's assignment changed); items above it stay."""
        if value < 1:
            raise ConfigError(f"a delay buffer needs a capacity >= 1, got {value}")
        self._capacity = value

    def __len__(self) -> int:
        return len(self._heap)

    def next_due(self) -> float | None:
        """When the earliest item is due: how long the poll loop may wait for its next timer."""
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[T]:
        """Every item due at or before ``now``, in due order; never one that is not yet due."""
        out: list[T] = []
        while self._heap and self._heap[0][0] <= now:
            out.append(heapq.heappop(self._heap)[2])
        return out

    def drop(self, pred: Callable[[T], bool]) -> list[T]:
        """Remove and return, in due order, the items ``pred`` selects (a revoked partition's).

        O(n): revocations are rare and the buffer is bounded.
        """
        keep: list[tuple[float, int, T]] = []
        gone: list[tuple[float, int, T]] = []
        for entry in self._heap:
            (gone if pred(entry[2]) else keep).append(entry)
        if gone:
            heapq.heapify(keep)
            self._heap = keep
        return [entry[2] for entry in sorted(gone, key=lambda e: (e[0], e[1]))]
