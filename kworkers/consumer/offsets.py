"""Which offset of a partition may be committed, given completions in any order.

Kafka commits a *position*: "everything before this offset is done". Handlers finish out of
order (key lanes, threads, a retry hand-off that takes a while), so the position is the lowest
offset still in flight, or one past the last tracked offset when nothing is. Offsets need not be
contiguous integers (compaction and transaction markers leave gaps): the tracker only knows the
offsets it was given, in fetch order.

The tracker also counts the bytes of its window (what backpressure bounds in bytes as well as in
records): each tracked offset may come with a size, and the window's bytes are those of the
offsets from the lowest incomplete one on, exactly, leaving as their offsets leave. Kept as
running sums (one per offset, in a list whose head is cut off in bulk), so a completion costs
no work per record for them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from itertools import accumulate, islice, repeat

#: the running sums' list is cut at its head once this many entries left the window (and
#: they are over half of it): one ``del`` of a slice instead of a pop per record
_CUT_AT = 4096


class OffsetTracker:
    """Per-partition commit position; never moves backwards."""

    __slots__ = ("_bytes_in", "_committed", "_cum", "_cut", "_done", "_last", "_pending",
                 "_position", "_unseen")

    def __init__(self) -> None:
        self._pending: deque[int] = deque()  # tracked, in fetch order; head = lowest in flight
        self._done: set[int] = set()  # completed but behind an incomplete one
        self._last = -1  # highest offset tracked
        self._position: int | None = None  # next offset to commit (None: nothing completed yet)
        self._committed: int | None = None
        #: the consumer handed over records this tracker never saw (fetched during a drain and
        #: given back): the consumer's position no longer vouches for what lies between
        self._unseen = False
        #: bytes of every offset ever tracked
        self._bytes_in = 0
        #: per offset of ``_pending`` (from index ``_cut`` on, in the same order): the bytes
        #: tracked before it, so the window holds ``_bytes_in`` less its head's entry
        self._cum: list[int] = []
        self._cut = 0

    def track(self, offset: int, size: int = 0) -> None:
        """Registers a fetched offset as in flight. Offsets must arrive in increasing order."""
        if offset <= self._last:
            raise ValueError(f"offset {offset} tracked after {self._last}: fetch order broken")
        self._last = offset
        self._pending.append(offset)
        self._cum.append(self._bytes_in)
        self._bytes_in += size

    def track_many(self, offsets: list[int], sizes: Iterable[int] | None = None) -> list[int]:
        """Tracks a fetched batch (increasing offsets), each with its size in bytes when
        ``sizes`` are given (in the same order); returns the offsets newly tracked (offsets at
        or below the last tracked one are a refetch and are left out)."""
        if not offsets:
            return offsets
        if offsets[0] <= self._last:
            last = self._last
            kept = [(o, s) for o, s in zip(offsets, repeat(0) if sizes is None else sizes,
                                          strict=False) if o > last]
            offsets = [o for o, _s in kept]
            sizes = [s for _o, s in kept]
            if not offsets:
                return offsets
        self._last = offsets[-1]
        self._pending.extend(offsets)
        sums = list(accumulate(repeat(0, len(offsets)) if sizes is None else sizes,
                               initial=self._bytes_in))
        self._bytes_in = sums.pop()
        self._cum.extend(sums)
        return offsets

    def _popped(self, n: int) -> None:
        """``n`` offsets left the head of the window: so do their running sums."""
        if not self._pending:
            self._cum.clear()
            self._cut = 0
            return
        cut = self._cut + n
        if cut >= _CUT_AT and 2 * cut >= len(self._cum):
            del self._cum[:cut]
            cut = 0
        self._cut = cut

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
            self._popped(n)
            pos = offsets[-1] + 1
            if self._position is None or pos > self._position:
                self._position = pos
            return
        pos = -1
        before = len(pending)
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
        if len(pending) != before:
            self._popped(before - len(pending))
        if pos >= 0 and (self._position is None or pos > self._position):
            self._position = pos

    def complete(self, offset: int) -> None:
        """Marks an in-flight offset done (idempotent; unknown offsets are ignored)."""
        pending = self._pending
        if pending and pending[0] == offset:
            before = len(pending)
            pending.popleft()
            pos = offset + 1
            done = self._done
            while pending and pending[0] in done:
                head = pending.popleft()
                done.discard(head)
                pos = head + 1
            self._popped(before - len(pending))
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
    def bytes_in(self) -> int:
        """The bytes of every offset ever tracked (what a fetch added is its difference)."""
        return self._bytes_in

    @property
    def window_bytes(self) -> int:
        """The bytes of the window's offsets (as given to ``track``/``track_many``)."""
        if not self._pending:
            return 0
        return self._bytes_in - self._cum[self._cut]

    @property
    def fetched_any(self) -> bool:
        """Whether any offset was ever tracked (a fresh tracker: nothing fetched yet)."""
        return self._last >= 0

    @property
    def oldest(self) -> int | None:
        """The lowest offset in flight (tracked, not completed), or None when none is."""
        return self._pending[0] if self._pending else None

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
