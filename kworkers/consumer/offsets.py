"""Which offset of a partition may be committed, given completions in any order.

Kafka commits a *position*: "everything before this offset is done". Handlers finish out of
order (key lanes, threads, a retry hand-off that takes a while), so the position is the lowest
offset still in flight, or one past the last tracked offset when nothing is. Offsets need not be
contiguous integers (compaction and transaction markers leave gaps): the tracker only knows the
offsets it was given, in fetch order.
"""

from __future__ import annotations

from collections import deque
from itertools import islice, repeat


class OffsetTracker:
    """Per-partition commit position; never moves backwards."""

    __slots__ = ("_committed", "_done", "_last", "_pending", "_position", "_unseen")

    def __init__(self) -> None:
        self._pending: deque[int] = deque()  # tracked, in fetch order; head = lowest in flight
        self._done: set[int] = set()  # completed but behind an incomplete one
        self._last = -1  # highest offset tracked
        self._position: int | None = None  # next offset to commit (None: nothing completed yet)
        self._committed: int | None = None
        #: the consumer handed over records this tracker never saw (fetched during a drain and
        #: given back): the consumer's position no longer vouches for what lies between
        self._unseen = False

    def track(self, offset: int) -> None:
        """Registers a fetched offset as in flight. Offsets must arrive in increasing order."""
        if offset <= self._last:
            raise ValueError(f"offset {offset} tracked after {self._last}: fetch order broken")
        self._last = offset
        self._pending.append(offset)

    def track_many(self, offsets: list[int]) -> list[int]:
        """Tracks a fetched batch (increasing offsets); returns those newly tracked (offsets at
        or below the last tracked one are a refetch and are left out)."""
        if not offsets:
            return offsets
        if offsets[0] <= self._last:
            offsets = [o for o in offsets if o > self._last]
            if not offsets:
                return offsets
        self._last = offsets[-1]
        self._pending.extend(offsets)
        return offsets

    def complete_many(self, offsets: list[int]) -> None:
        pending = self._pending
        done = self._done
        n = len(offsets)
        if n > 1 and not done and len(pending) >= n and pending[0] == offsets[0] and \
                list(islice(pending, n)) == offsets:
            # The common case, a lane's run completed in fetch order from the head: compared
            # and dropped in C rather than offset by offset.
            if n == len(pending):
                pending.clear()
            else:
                for _ in repeat(None, n):
                    pending.popleft()
            pos = offsets[-1] + 1
            if self._position is None or pos > self._position:
                self._position = pos
            return
        pos = -1
        for offset in offsets:
            if pending and pending[0] == offset:
                pending.popleft()
                pos = offset + 1
                while pending and pending[0] in done:
                    head = pending.popleft()
                    done.discard(head)
                    pos = head + 1
            elif pending and pending[0] < offset <= self._last:
                done.add(offset)
        if pos >= 0 and (self._position is None or pos > self._position):
            self._position = pos

    def complete(self, offset: int) -> None:
        """Marks an in-flight offset done (idempotent; unknown offsets are ignored)."""
        pending = self._pending
        if pending and pending[0] == offset:
            pending.popleft()
            pos = offset + 1
            done = self._done
            while pending and pending[0] in done:
                head = pending.popleft()
                done.discard(head)
                pos = head + 1
            if self._position is None or pos > self._position:
                self._position = pos
        elif pending and offset > pending[0] and offset <= self._last:
            self._done.add(offset)

    @property
    def in_flight(self) -> int:
        return len(self._pending) - len(self._done)

    @property
    def window(self) -> int:
        """Offsets held from the lowest incomplete one on, completed or not: what one stuck
        record keeps in memory behind it, and what backpressure bounds."""
        return len(self._pending)

    @property
    def position(self) -> int | None:
        """Lowest offset not yet done (the value to commit), or None before any completion."""
        return self._position

    def committable(self) -> int | None:
        """The position when it is ahead of the last committed one, else None."""
        pos = self._position
        if pos is None or (self._committed is not None and pos <= self._committed):
            return None
        return pos

    def advance(self, position: int) -> bool:
        """Moves the position to ``position`` (the consumer's own, one past what it read) when
        nothing is in flight and it is ahead: the offsets between were no records for the
        application (transaction markers, aborted records), and a position left before them
        shows a lag that never goes away (KEDA never scales to zero). True when it moved."""
        if self._unseen or self._pending or position <= self._last + 1:
            return False
        if self._position is not None and position <= self._position:
            return False
        self._last = position - 1
        self._position = position
        return True

    def given_back(self) -> None:
        """The consumer handed over records of this partition that were not tracked (polled
        during a drain, dropped): from now on ``advance`` never moves past them."""
        self._unseen = True

    def mark_committed(self, position: int) -> None:
        if self._committed is None or position > self._committed:
            self._committed = position

    @property
    def committed(self) -> int | None:
        return self._committed
