"""A handler's outputs: the records it produces to other topics, held per call until it returns.

Why held, not produced at once: an output belongs to the attempt that made it. An attempt that
fails is handed to a tier and runs again, so its outputs must never be sent (the retry makes
its own); an attempt that succeeds completes its record only when its outputs are durable (at
least once: acknowledged by the broker; exactly once: committed in the transaction that also
commits the record's offset). So ``activity.produce`` appends to the *sink* of the call under
way (a context variable the runner sets around each handler call), and the runner decides what
becomes of the sink once the call returned.

A batch handler's outputs belong to the record named with ``record=`` (sent only when that
record succeeded), or to the batch as a whole: sent when the call returned or raised a
``BatchError`` (the handler's own account of the records that succeeded), and carried by the
batch's last record that succeeded, so an exactly-once transaction commits them only with the
offset of every record before it.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kworkers.message import Headers, Message


@dataclass(frozen=True, slots=True)
class Output:
    """One record a handler produces (bytes already: serialized when it was produced)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    #: a batch handler's record this output belongs to (None: the call's record, or the batch)
    record: Message | None = None


class Sink:
    """One handler call's outputs, and what to run once they are durable (the idempotency
    store's completion of the record's key waits for them: a key marked done before its
    outputs were durable would skip them on a redelivery)."""

    __slots__ = ("_offsets", "after", "batch", "checkpoint", "outputs")

    def __init__(self) -> None:
        # None until the call produces: most calls produce nothing, and a sink lives as long
        # as its runner's pass, so two empty lists per pass were two more objects alive per
        # record for the cyclic collector to walk (issue #50: at 5,000 async handlers in
        # flight its full passes stalled the event loop)
        self.outputs: list[Output] | None = None
        self.after: list[Callable[[], None]] | None = None
        self.batch: Sequence[Message] | None = None
        self._offsets: set[int] | None = None
        #: the last heartbeat of a call of this pass: (the record the handler saw, details);
        #: the runner hands it on with that call's failure (``errors.keep_checkpoint``)
        self.checkpoint: tuple[Message, bytes] | None = None

    def calling(self, batch: Sequence[Message]) -> None:
        """A batch call begins with these records (of one partition)."""
        self.batch = batch
        self._offsets = None

    def add(self, out: Output) -> None:
        """An output of the call under way; ``record=`` must name one of its batch."""
        rec = out.record
        if rec is not None:
            batch = self.batch
            if batch is None:
                raise ValueError("record= names the record an output belongs to in a batch "
                                 "handler; a single-record handler's outputs are its record's")
            if self._offsets is None:
                self._offsets = {m.offset for m in batch}
            first = batch[0]
            if (rec.topic, rec.partition) != (first.topic, first.partition) or \
                    rec.offset not in self._offsets:
                raise ValueError(f"record= names {rec.topic}/{rec.partition}@{rec.offset}, "
                                 "which is not a record of this batch")
        if self.outputs is None:
            self.outputs = [out]
        else:
            self.outputs.append(out)

    def then(self, hook: Callable[[], None]) -> None:
        """Runs ``hook`` once this call's outputs are durable (the idempotency store's
        completion of the record's key)."""
        if self.after is None:
            self.after = [hook]
        else:
            self.after.append(hook)

    def reset(self) -> None:
        """Empty again: what was taken from this sink keeps the old lists."""
        self.outputs = None
        self.after = None


#: the sink of the handler call under way (set by the runner around each call)
current_sink: contextvars.ContextVar[Sink | None] = contextvars.ContextVar(
    "kworkers_outputs", default=None)

#: one record's outputs: (the record, what it produced)
Emitted = tuple[Message, list[Output]]


def of_record(msg: Message, sink: Sink) -> list[Emitted]:
    return [(msg, sink.outputs or [])]


def of_batch(records: Sequence[Message], shown: Sequence[Message],
             failed: Mapping[Message, BaseException], sink: Sink) -> list[Emitted]:
    """A batch call's outputs by record, in offset order. ``records`` are the batch as read,
    ``shown`` what the handler saw (decoded copies: ``record=`` names one of those, matched by
    offset). Outputs named for a record that failed are dropped (its retry makes its own); the
    batch's own ride with its last record that succeeded (dropped when none did)."""
    by_offset = {m.offset: m for m in records}
    shown_offsets = {m.offset for m in shown}
    ok = [m for m in records if m not in failed]
    per: dict[int, list[Output]] = {}
    last = ok[-1].offset if ok else None
    for out in sink.outputs or ():
        if out.record is None:
            owner = last
        else:
            owner = out.record.offset  # checked by ``Sink.add``: a record of this batch
            if owner not in shown_offsets or by_offset[owner] in failed:
                continue
        if owner is not None:
            per.setdefault(owner, []).append(out)
    return [(m, per[m.offset]) for m in ok if m.offset in per]


class OutputBuffer:
    """Exactly once: outputs and hand-offs waiting for the transaction that commits their
    record's offset, per partition (by identity: a partition assigned again is a new one).

    Written by runners (``add``), read and emptied by the poll thread (``take``, ``put_back``,
    ``drop``), under one lock. ``take`` hands over only records *below* the position a
    transaction commits: outputs of a record finished ahead of a slower one wait for it, or a
    crash after the commit would run that record again and duplicate them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._parts: dict[int, dict[int, Entry]] = {}
        self._count = 0

    @property
    def count(self) -> int:
        """Outputs held (hand-offs included)."""
        return self._count

    def add(self, part: object, entries: Sequence[Entry]) -> None:
        with self._lock:
            held = self._parts.setdefault(id(part), {})
            for e in entries:
                old = held.get(e.offset)
                if old is not None:
                    self._count -= len(old.outputs)
                held[e.offset] = e
                self._count += len(e.outputs)

    def take(self, part: object, below: int) -> list[Entry]:
        """The entries of ``part`` below offset ``below``, in offset order, removed."""
        with self._lock:
            held = self._parts.get(id(part))
            if not held:
                return []
            offsets = sorted(o for o in held if o < below)
            out = [held.pop(o) for o in offsets]
            self._count -= sum(len(e.outputs) for e in out)
            self._room.notify_all()
            return out

    def put_back(self, part: object, entries: Sequence[Entry]) -> None:
        """A transaction that did not commit: its entries wait for the next one."""
        self.add(part, entries)

    def drop(self, part: object) -> None:
        """The partition is no longer this member's: what it held is never sent (the next
        owner runs those records again)."""
        with self._lock:
            held = self._parts.pop(id(part), None)
            if held:
                self._count -= sum(len(e.outputs) for e in held.values())
                self._room.notify_all()

    def wait_room(self, limit: int, gone: Callable[[], bool]) -> bool:
        """Blocks while ``limit`` outputs are held; False when ``gone()`` meanwhile."""
        with self._room:
            while self._count >= limit:
                if gone():
                    return False
                self._room.wait(0.1)
        return True


@dataclass(frozen=True, slots=True)
class Entry:
    """A record's outputs in an exactly-once buffer: produced in the transaction that commits
    ``offset + 1`` or beyond. ``after`` runs once that transaction committed."""

    offset: int
    msg: Message
    outputs: list[Output]
    retried: int = 0
    dead: int = 0
    after: list[Callable[[], None]] | None = None
    #: refused for good, the record goes to its own DLQ instead; False for the DLQ's own
    #: records (``Destination.falls_back``): the worker fails
    falls_back: bool = True
