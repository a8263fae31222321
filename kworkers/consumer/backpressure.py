"""Which partitions to pause and resume, and how much one poll may take: one pure decision.

Why pure and in one place: every reason to stop fetching (a partition holding its share, a
drain, an open circuit breaker) is an input here, so a new reason is one more input rather than
another branch in the poll loop, and the whole policy is tested without a consumer. Pausing
keeps records in Kafka instead of in memory; hysteresis (a partition resumes once a tenth of its
share of records is done, half of its byte share) keeps it from flapping between the two.

The admission rule (why shares, not one global cap): each assigned partition may hold
``share`` records not yet done, an even split of ``max_in_flight`` over the assigned partitions
(at most ``per_partition``; for a tier loop also an even split of the timer heap's capacity). A
partition is paused only for what *it* holds, never because others hold a lot: a global
"pause everything at ``max_in_flight``, resume at half" lets a backlog on some partitions keep
another, with nothing of its own in flight, paused for as long as the backlog lasts. A resume
can therefore never leave a partition paused with nothing of its own in flight (outside a drain
or an open breaker).

The bound: a partition is paused at the end of the poll step in which it reached its share, so
it holds at most its share plus what that one poll gave it; and one poll takes at most
``poll_size`` records: the room left under the global bound ``B``, or, when that is less, the
least room any open partition has left under its share (at least one). Overshoot past a share
is only ever created by a poll taken while the total was under ``B`` (a poll no larger than
every open partition's room cannot cross a share), and it only shrinks afterwards, so all
overshoot together stays under ``B``; the shares add up to at most
``max(B, partitions)``. Hence at most ``B + max(B, partitions)`` records, ``2 B`` for any
sensible assignment, and about ``B`` plus one poll in practice (docs/RELIABILITY.md states it
with the defaults). When an assignment grows, the shares shrink and the partitions kept may
hold their old, larger share until they drain: nothing more is fetched for them meanwhile.

Not yet done, not everything behind the oldest unfinished record (issue #50): with thousands of
keys, a key's next record waits behind its own chain while records of other keys after it
finish, and counting those finished ones made a partition stop with most of its share done
(100,000 records of 10,000 keys, a 100 ms handler, 5,000 in flight: ~11,000 records/s against
plain asyncio's ~37,000; the same with the bounds lifted 10x, 0.68x asyncio instead of 0.42x).
A finished record holds no memory beyond its offset, but everything from the oldest unfinished
record on is what a crash makes the next owner run again, so that window has a bound of its own,
``WINDOW_FACTOR`` shares (the byte share below counts the whole window too): a partition stops
at either; it resumes once a tenth of its share of records not yet done is done
(``resume_mark``), and once its window is a share below its bound (half the window's bound
would keep a partition stopped for its records not yet done paused until its head record
finished, however little its window held). While one of a
partition's hand-offs waits for its acknowledgement, the poll loop counts its whole window
against the share again (``processor._counted``): a failure that cannot be placed yet (its tier
or DLQ down) is no I/O worth overlapping.

Why a hold before a pause: librdkafka empties a paused partition's read-ahead, and after the
resume its records come back only with the next fetch response, which a fetch long-polling
the idle partitions delays by up to ``fetch.wait.max.ms`` (500 ms): one hot partition beside
idle ones ran ~1,700 records a cycle at its share, then waited about half a second (measured:
the last partition of a 300,000-record backlog took 1.6 s of a 2.3 s run, its polls empty).
So when no partition left open wants records (``Load.wants``: the client caught up with the
end of its log), the partitions at their share are *held* instead: the loop takes nothing
from the client at all (no poll, so the bound above is untouched) and librdkafka keeps their
read-ahead. A hold is bounded (``Load.may_hold`` goes false after a while; the loop's
callbacks wait while it lasts), after which they are paused as before, and it ends at the
same resume mark a pause does; any open partition that wants records turns every hold into a
pause, because the next poll would hand the held ones more.

Bytes as well as records (issue #45): a record of 500 KB costs what 1,000 small ones do, so a
bound in records alone is a bound in memory only for small records. Each partition also has a
byte share, an even split of ``max_bytes`` (what its window holds:
``OffsetTracker.window_bytes``, keys, values and what a record costs beyond them), and stops
at either share, resuming only below half of both. A poll cannot be sized in bytes (the client
hands out records), so the byte bound is kept another way: while the loop holds ``max_bytes``
or more (``over``) it takes nothing at all (every open partition stops, held or paused as
above) and no paused partition resumes. Bytes grow only through a poll, and every poll starts
below ``max_bytes``: so a loop holds at most ``max_bytes`` plus one poll, whatever the number
of partitions, and one poll is at most what the client had queued (``queued.max.messages.kbytes``
plus a fetch per broker, which kworkers sizes from ``max_bytes``: ``kworkers.memory``). The
next poll's size in records is cut to a partition's byte share, and to the room left, over the
last poll's record size (``poll_size``), so in practice a loop stops about at ``max_bytes``.

Liveness with bytes: a partition holding nothing is open whatever its byte share (a share
smaller than one record still takes that record, which then runs alone: the partition stops
at once and resumes when it is done); the loop-wide stop holds every partition only while the
partitions over their shares drain, and ends the step the total falls below ``max_bytes``
(no hysteresis there: a stop kept down to a mark would let one slow partition over its share
keep the others waiting longer). A partition stopped by the loop-wide stop holding nothing of
its own waits on purpose: the stall detector sees it as held (``Hold.MEMORY``), not stalled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kworkers.consumer.ports import TP

#: how many shares a partition's window (its records from the oldest not yet done on, done or
#: not: what a crash runs again) may span: a record share of 3,333 (the defaults over 6
#: partitions) lets a partition's window reach 26,664 records, 160,000 for the loop
WINDOW_FACTOR = 8


@dataclass(frozen=True, slots=True)
class Limits:
    max_in_flight: int
    per_partition: int
    #: capacity of the retry loop's timer heap (None: no heap)
    buffer_capacity: int | None = None
    #: bytes the loop may hold (``OffsetTracker.window_bytes`` summed; None: no byte bound)
    max_bytes: int | None = None

    def share(self, partitions: int) -> int:
        """What one of ``partitions`` assigned partitions may hold before it is paused."""
        n = max(1, partitions)
        share = min(self.per_partition, self.max_in_flight // n)
        if self.buffer_capacity is not None:
            share = min(share, self.buffer_capacity // n)
        return max(1, share)

    def bound(self) -> int:
        """The global bound one poll's size is kept under."""
        if self.buffer_capacity is None:
            return self.max_in_flight
        return min(self.max_in_flight, self.buffer_capacity)

    def byte_share(self, partitions: int) -> int | None:
        """The bytes one of ``partitions`` assigned partitions may hold before it stops
        (None: no byte bound); at least one byte, so a partition holding nothing is open."""
        if self.max_bytes is None:
            return None
        return max(1, self.max_bytes // max(1, partitions))

    def over(self, total_bytes: int) -> bool:
        """The loop holds its byte bound or more: it takes nothing until it holds less."""
        return self.max_bytes is not None and total_bytes >= self.max_bytes


class PartitionLoad(NamedTuple):
    tp: TP
    #: the partition's records fetched and not yet done (running, queued in a lane, waiting
    #: for a hand-off's acknowledgement; a tier partition's records in the timer heap too)
    in_flight: int
    paused: bool
    #: taking nothing more without a pause in the client (the hold above)
    held: bool = False
    #: the bytes of its window (``PartitionState.held_bytes``: from the oldest record not yet
    #: done on, done or not)
    bytes: int = 0
    #: its window in records (``OffsetTracker.window``; None: ``in_flight``): one record
    #: whose hand-off is stuck keeps everything behind it uncommittable
    window: int | None = None


@dataclass(frozen=True, slots=True)
class Load:
    parts: Sequence[PartitionLoad]
    #: a graceful stop is under way: fetch nothing more
    draining: bool = False
    #: the circuit breaker is not closed: keep the backlog in Kafka
    breaker_open: bool = False
    #: the member fenced itself: fetch nothing while it may not be one
    fenced: bool = False
    #: a partition at its share may be held rather than paused (the loop bounds how long)
    may_hold: bool = False
    #: whether the client has (or may have) records of a partition the loop has not taken
    #: yet; asked only when a hold is possible (None: always, so never a hold)
    wants: Callable[[TP], bool] | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    pause: tuple[TP, ...]
    resume: tuple[TP, ...]
    in_flight: int
    #: each partition's share under this assignment
    share: int
    #: the partitions held after this decision (none of them in ``pause``)
    held: tuple[TP, ...] = ()
    #: bytes held, summed over the partitions
    bytes: int = 0
    #: the loop holds its byte bound: nothing is taken, nothing resumed (``Limits.over``)
    over: bool = False


#: what a record is taken to cost before a loop has seen any (its first poll's size): a small
#: record's, so a worker of small records takes a whole batch at once as before
FIRST_RECORD_BYTES = 1024


def resume_mark(share: int) -> int:
    """A paused partition resumes once it holds this many records not yet done or fewer: a
    tenth of its share below it (at least one record, so a share of one resumes empty).

    Why not half (the rule before, issue #50): a resume is not a refill. The records come back
    only with a fetch, and once every partition of a broker is paused librdkafka's broker
    thread sleeps up to a second (a resume does not wake it), so a partition resumed at half
    ran its handlers dry meanwhile whenever half a share lasted less than that: 1,000 keys of a
    100 ms async handler at 1,000 in flight ran at 0.84x plain asyncio, with a tenth 0.93-0.96x
    (``benchmarks iobound``). Pausing more often (a pause empties the partition's read-ahead)
    did not slow the no-op handlers that reach their share most often (sync, batch and async
    no-op sides against the raw loop, 1,000,000 records), nor a failure storm's hand-offs
    (BENCHMARKS.md, "The resume mark").
    """
    return share - max(1, share // 10)


def half(n: int) -> int:
    """The resume mark of a byte share and of a window's bound: half, hysteresis enough for
    records that may be large (a pause empties a partition's read-ahead, so a large record's
    share is fetched again at each resume)."""
    return n // 2


class Marks(NamedTuple):
    """One assignment's shares and resume marks: records not yet done, the window in records,
    and its bytes."""

    share: int
    low: int
    byte_share: int | None
    byte_low: int | None
    window_share: int
    window_low: int

    @classmethod
    def of(cls, limits: Limits, partitions: int) -> Marks:
        share, byte_share = limits.share(partitions), limits.byte_share(partitions)
        window = WINDOW_FACTOR * share
        return cls(share, resume_mark(share), byte_share,
                   None if byte_share is None else half(byte_share),
                   window, max(half(window), window - share))

    def full(self, in_flight: int, nbytes: int, window: int | None = None) -> bool:
        """At any share: the partition takes nothing more."""
        return (in_flight >= self.share
                or (window is not None and window >= self.window_share)
                or (self.byte_share is not None and nbytes >= self.byte_share))

    def down(self, in_flight: int, nbytes: int, window: int | None = None) -> bool:
        """At or under every resume mark: a stopped partition may take records again."""
        return (in_flight <= self.low
                and (window is None or window <= self.window_low)
                and (self.byte_low is None or nbytes <= self.byte_low))


def decide(limits: Limits, load: Load) -> Decision:
    total = sum(p.in_flight for p in load.parts)
    total_bytes = sum(p.bytes for p in load.parts)
    marks = Marks.of(limits, len(load.parts))
    stop_all = load.draining or load.breaker_open or load.fenced
    over = limits.over(total_bytes)
    pause: list[TP] = []
    resume: list[TP] = []
    #: open partitions that must take nothing more: held, or paused below
    stopping: list[TP] = []
    for p in load.parts:
        if p.paused:
            if not stop_all and not over and marks.down(p.in_flight, p.bytes, p.window):
                resume.append(p.tp)
        elif stop_all:
            pause.append(p.tp)
        elif over or marks.full(p.in_flight, p.bytes, p.window) or (
                p.held and not marks.down(p.in_flight, p.bytes, p.window)):
            stopping.append(p.tp)
    held: tuple[TP, ...] = ()
    if stopping:
        if _may_hold(load, set(stopping), set(resume)):
            held = tuple(stopping)
        else:
            pause += stopping
    return Decision(tuple(pause), tuple(resume), total, marks.share, held, total_bytes, over)


def _may_hold(load: Load, stopping: set[TP], resumed: set[TP]) -> bool:
    """No partition open after this decision (and not stopping) wants records: the next poll
    would only hand out records of the stopping ones, so the loop need not poll at all."""
    wants = load.wants
    if not load.may_hold or wants is None:
        return False
    return not any(wants(p.tp) for p in load.parts
                   if (not p.paused or p.tp in resumed) and p.tp not in stopping)


def poll_size(limits: Limits, held: int, batch: int, room: int = 1, held_bytes: int = 0,
              record_bytes: int = 0, partitions: int = 1) -> int:
    """How many records the next poll may take: a full batch while there is room under the
    global bound; past it, ``room``: the least room (share minus what it holds) of any
    partition the poll can hand records to (open: neither paused nor held), at least one.

    A poll no larger than every open partition's room cannot carry any of them past its
    share, so it makes no overshoot and is safe at any total (one record was the floor, and a
    tier loop whose heap was full filled its last partitions one record per step: 2,214 steps,
    at ~150 us each, for a storm's 10,000 tier records read back).

    With a byte bound, also no more records than one partition's byte share (of
    ``partitions``) holds at ``record_bytes`` each (the last poll's record size; 0: not known
    yet, ``FIRST_RECORD_BYTES``), nor than the bytes left under the bound do, at least one. A
    fetch hands a partition's records out in runs, so a larger poll gives one partition many
    shares at once, and the loop-wide stop then holds every other (a liveness run: one
    partition started 403 records of the first 1,000, the others 116-146, after a first poll
    of 300 records, all of one partition, before any size was known). Not what keeps the
    bound (a record may be larger than the last ones: ``decide``'s loop-wide stop keeps it),
    but what keeps a loop of large records from taking far more than a share at every poll.
    Small records never reach it: a 64 MiB bound over 6 partitions is 18,000 records of 600 B
    a share."""
    n = max(1, min(batch, max(room, limits.bound() - held)))
    byte_share = limits.byte_share(partitions)
    if limits.max_bytes is not None and byte_share is not None:
        left = min(limits.max_bytes - held_bytes, byte_share)
        n = min(n, max(1, left // (record_bytes if record_bytes > 0 else FIRST_RECORD_BYTES)))
    return n


def least_room(share: int, open_in_flight: Iterable[int]) -> int:
    """``poll_size``'s ``room``: the least of ``share`` minus what each open partition holds
    (1 when none is open: a poll then hands out nothing)."""
    return max(1, min((share - n for n in open_in_flight), default=1))
