"""The hand-off step: a failed attempt goes to its tier or the DLQ, a successful one's outputs
to their topics; pipelined, never dropped (at least once; exactly once is ``buffered``'s).

Beside the router on purpose: ``FailureRouter`` decides where a record goes and with which
headers (pure); this step sends it and owns what a send's outcome means, asking the hand-off's
``Destination`` (``retry_tiers.destinations``) what it counts as and whether a refusal falls
back to the DLQ: it names no concrete destination. A handler's outputs
(``activity.produce``) follow the same rules: the record completes once every output of its
call is acknowledged, and an output refused for good sends the record to its own DLQ with the
reason (the outputs already acknowledged stay: at least once).

Pipelined: a runner hands a failure off and moves on to its next record at once; the record's
offset completes when the broker's delivery report arrives (the offset tracker takes
completions in any order), so a lane is never paced by round trips. At most ``limit`` hand-offs
and outputs wait for their acknowledgement at a time, and at most ``limit_bytes`` of their
keys, values and headers (the producer holds a copy of each until then: issue #45); then a
runner waits for room, except when nothing waits at all (a record larger than
``limit_bytes`` still goes, alone). An unacknowledged hand-off holds the commit, because its
offset is not complete.

What a refused send means:

- *transient* (broker unreachable, timed out, queue full): retried in place with a growing wait,
  holding the commit, for as long as it takes;
- *permanent* (not authorised, record too large, or the destination still missing after
  ``MISSING_LIMIT`` tries, each after a metadata refresh by the client): the record goes to its
  own source's DLQ with the reason instead (a destination that ``falls_back``: a tier, an
  output, a user's route);
- the DLQ itself refusing for good (nothing to fall back to): the worker turns unhealthy and
  says why (the record stays uncommitted, retried in place, until the process is restarted).

A hand-off is abandoned only when its partition is revoked or the worker stops: the offset was
never completed, so the next owner reads the record again.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

from kworkers.clock import Clock
from kworkers.consumer.failure_log import FailureLog
from kworkers.consumer.outputs import Emitted, Output
from kworkers.consumer.partition import Partition
from kworkers.consumer.ports import Completion, Sender, SendErrorKind
from kworkers.consumer.settings import LoopSettings
from kworkers.errors import HandOffError
from kworkers.memory import message_bytes
from kworkers.message import Message
from kworkers.metrics import Metrics
from kworkers.retry_tiers.destinations import DLQ, RETRY
from kworkers.retry_tiers.router import FailureRouter, HandOff
from kworkers.supervision import Supervisor

log = logging.getLogger("kworkers.handoff")

FIRST_WAIT_S = 0.1
MAX_WAIT_S = 5.0
#: sends to a missing destination before it counts as gone for good
MISSING_LIMIT = 3

def all_transient(_exc: BaseException) -> SendErrorKind:
    """For senders that cannot tell: retry everything in place (never drop)."""
    return "transient"


class _Record:
    """One record's outputs until each is acknowledged (or its record dead-lettered)."""

    __slots__ = ("after", "dead", "left", "msg")

    def __init__(self, msg: Message, left: int, after: _After | None) -> None:
        self.msg = msg
        self.left = left
        self.dead = False
        self.after = after


class _After:
    """A call's hooks, run once the outputs of all its records are acknowledged."""

    __slots__ = ("hooks", "left")

    def __init__(self, hooks: list[Callable[[], None]], left: int) -> None:
        self.hooks = hooks
        self.left = left


class _Pending:
    """One record sent on a record's behalf (its hand-off, or one of its outputs) until its
    acknowledgement; called with the sender's delivery report."""

    __slots__ = ("blocked", "misses", "msg", "plan", "ps", "rec", "size", "step", "wait")

    def __init__(self, step: HandOffStep, ps: Partition, msg: Message, plan: HandOff | Output,
                 rec: _Record | None = None) -> None:
        self.step = step
        self.ps = ps
        self.msg = msg
        self.plan = plan
        self.rec = rec
        #: what the producer holds of it until acknowledged (counted once, at the send)
        self.size = (message_bytes(plan.key, plan.value, plan.headers)
                     if isinstance(plan, Output) else plan.size)
        self.misses = 0
        self.wait = FIRST_WAIT_S
        self.blocked = False

    def __call__(self, err: BaseException | None) -> None:
        self.step._delivered(self, err)

    @property
    def destination(self) -> str:
        """The metric label of where it goes."""
        plan = self.plan
        return "output" if isinstance(plan, Output) else plan.destination.label

    @property
    def falls_back(self) -> bool:
        """Refused for good, the record goes to its own DLQ instead (else the worker fails)."""
        plan = self.plan
        return isinstance(plan, Output) or plan.destination.falls_back


def plan_hand_off(router: FailureRouter, msg: Message, exc: BaseException,
                  supervisor: Supervisor) -> HandOff | None:
    """Where ``msg``'s failed attempt goes; a record the router cannot place goes to its own
    DLQ with why, and None (the worker fails) when not even that can be worked out."""
    try:
        return router.plan(msg, exc)
    except Exception as bad:
        log.warning("%s/%d@%d cannot be routed (%s): dead-lettering it", msg.topic,
                    msg.partition, msg.offset, bad)
        try:
            return router.dead_letter(msg, bad)
        except Exception as worse:
            supervisor.fail("hand-off", f"no destination for {msg.topic}/{msg.partition}@"
                            f"{msg.offset}: {worse}")
            return None


class HandOffStep:
    def __init__(self, router: FailureRouter, sender: Sender, metrics: Metrics, group: str,
                 completions: SimpleQueue[Completion], clock: Clock, stop: threading.Event,
                 supervisor: Supervisor,
                 classify: Callable[[BaseException], SendErrorKind] = all_transient,
                 limit: int = LoopSettings().handoff_limit,
                 limit_bytes: int = LoopSettings().hand_off_bytes()) -> None:
        self.router = router
        self.sender = sender
        self.metrics = metrics
        self.group = group
        self.completions = completions
        self.clock = clock
        #: set when the worker stops for good: hand-offs still retrying give up
        self.stop = stop
        self.supervisor = supervisor
        self.classify = classify
        self.limit = limit
        self.limit_bytes = limit_bytes
        self.failures = FailureLog(log, group, clock)
        self._m_blocked = metrics.handoff_blocked.labels(group)
        # shown at 0 from the first scrape: the first refusal is then an increase rate() sees
        for label in dict.fromkeys((RETRY.label, DLQ.label, "output",
                                    *(r.destination.label for r in router.routes))):
            metrics.handoff_failures.labels(group, label)
        #: the labelled counters, looked up once per tier or error type, not per record
        self._m_retries: dict[str, Any] = {}
        self._m_dead: dict[str, Any] = {}
        # What is sent and not yet acknowledged is counted without a lock: runners send from
        # many threads and delivery reports release from others, and a lock there was the
        # failure path's worst contention (8 handler threads failing every record: a quarter
        # of the sends found it held, CPU per failed record 54 -> 39 us without it,
        # ``benchmarks handoff_cpu``). A list's append and pop and a deque's append and
        # popleft are each one step under the GIL (and locked per object without one).
        #: one entry per hand-off or output unacknowledged: ``pending`` is its length
        self._unacked: list[None] = []
        #: their sizes as they are sent, and the negated size of each released since the
        #: last fold into ``_bytes`` (``pending_bytes``)
        self._sizes: deque[int] = deque()
        self._bytes = 0
        #: held by the one thread folding ``_sizes`` into ``_bytes``; never waited for
        self._fold = threading.Lock()
        self._room = threading.Condition()
        #: runners waiting for room (under ``_room``): a release notifies only when one waits
        #: (one that starts waiting just after a release read 0 wakes at its 0.1 s timeout)
        self._waiting = 0
        #: the hand-offs refused and retried later, by due time (under ``_lock``)
        self._lock = threading.Lock()
        self._retries: list[tuple[float, int, _Pending]] = []
        self._seq = itertools.count()
        self._after: SimpleQueue[list[Callable[[], None]]] | None = None
        #: acknowledged hand-offs the poll thread has not taken yet (``acknowledged``)
        self._acks: deque[_Pending] = deque()

    # ------------------------------------------------------------------ runner side

    @property
    def pending(self) -> int:
        return len(self._unacked)

    @property
    def pending_bytes(self) -> int:
        """The bytes of what is unacknowledged (``_Pending.size``), as of the last fold: a
        fold another thread is in the middle of is not waited for."""
        sizes = self._sizes
        if sizes and self._fold.acquire(False):
            try:
                total = self._bytes
                try:
                    while True:
                        total += sizes.popleft()
                except IndexError:
                    pass
                self._bytes = total
            finally:
                self._fold.release()
        return self._bytes

    def has_room(self) -> bool:
        n = len(self._unacked)
        return n < self.limit and (not n or self.pending_bytes < self.limit_bytes)

    def wait_room(self, ps: Partition) -> bool:
        """Blocks while ``limit`` hand-offs (or ``limit_bytes`` of them) are unacknowledged;
        False if abandoned meanwhile."""
        with self._room:
            while not self.has_room():
                if ps.revoking or self.stop.is_set():
                    return False
                self._waiting += 1
                try:
                    self._room.wait(0.1)
                finally:
                    self._waiting -= 1
        return True

    def submit(self, ps: Partition, msg: Message, exc: BaseException) -> bool:
        """Hands ``msg``'s failed attempt off. True: its completion is now this step's (posted
        when acknowledged); False: abandoned (revoked, stopping, or no destination at all):
        the runner stops and the record will be delivered again."""
        if ps.revoking or self.stop.is_set():
            return False
        if not self.has_room() and not self.wait_room(ps):
            return False
        plan = plan_hand_off(self.router, msg, exc, self.supervisor)
        if plan is None:
            return False
        pending = _Pending(self, ps, msg, plan)
        self._unacked.append(None)
        self._sizes.append(pending.size)
        ps.unacked.append(None)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s/%d@%d attempt %d failed (%s: %s) -> %s %s", msg.topic, msg.partition,
                      msg.offset, msg.attempt, type(exc).__name__, str(exc)[:200],
                      plan.destination.label, plan.topic)
        self._send(pending)
        return True

    def emit(self, ps: Partition, emitted: list[Emitted],
             after: list[Callable[[], None]]) -> bool:
        """Sends a successful call's outputs; each record completes once all of its outputs
        are acknowledged, and ``after`` runs once those of every record of the call are."""
        if ps.revoking or self.stop.is_set():
            return False
        if not self.has_room() and not self.wait_room(ps):
            return False
        hooks = _After(after, len(emitted)) if after else None
        sends: list[_Pending] = []
        for msg, outs in emitted:
            rec = _Record(msg, len(outs), hooks)
            sends += [_Pending(self, ps, msg, out, rec) for out in outs]
        tokens = [None] * len(sends)
        self._unacked.extend(tokens)
        self._sizes.extend([p.size for p in sends])
        ps.unacked.extend(tokens)
        for p in sends:
            self._send(p)
        return True

    # ------------------------------------------------------------------ sending

    def _send(self, p: _Pending) -> None:
        plan = p.plan
        try:
            self.sender.send(plan.topic, plan.key, plan.value, plan.headers, p)
        except Exception as err:  # a Sender should report errors to ``done``; be safe anyway
            self._refused(p, err)

    def _delivered(self, p: _Pending, err: BaseException | None) -> None:
        """The delivery report, on the sender's thread: an acknowledged hand-off waits for the
        poll thread (``acknowledged``), which completes its offset."""
        if err is not None:
            self._refused(p, err)
            return
        plan = p.plan
        if p.rec is not None:
            self._output_done(p, p.rec, dead=not isinstance(plan, Output))
            return
        if isinstance(plan, Output):
            raise AssertionError("an output is always sent for a record")
        acks = self._acks
        acks.append(p)
        if len(acks) == 1:  # the first since the poll thread took them: wake it (no offsets)
            self.completions.put(Completion(p.ps, [], 0, 0, 0.0, 0))
        self._release(p)  # after the append: a partition not busy has its acks queued

    def acknowledged(self) -> list[Completion]:
        """From the poll thread: the hand-offs acknowledged since it last asked, one
        completion per partition and one update per tier's counter. A storm's delivery
        reports come in bursts of hundreds; a completion and a counter update each (a lock)
        on the producer's thread cost more than the rest of the report's Python."""
        acks = self._acks
        if not acks:  # every step of every loop asks; most have nothing
            return []
        done: dict[Partition, tuple[list[int], list[int]]] = {}
        counts: dict[tuple[bool, str, str, str], int] = {}
        try:
            while True:
                p = acks.popleft()
                plan = p.plan
                assert not isinstance(plan, Output)  # an output's record completes per record
                entry = done.get(p.ps)
                if entry is None:
                    entry = done[p.ps] = ([], [0, 0])
                entry[0].append(p.msg.offset)
                retried = plan.destination.retried
                entry[1][0 if retried else 1] += 1
                what = (retried, plan.label, plan.decision.error_type, plan.topic)
                counts[what] = counts.get(what, 0) + 1
        except IndexError:
            pass
        for (retried, label, error_type, topic), n in counts.items():
            self._counter(retried, label).inc(n)
            self.failures.handed(error_type, topic, n)
        return [Completion(ps, offsets, n[0], n[1], 0.0, 0) for ps, (offsets, n) in done.items()]

    def _counter(self, retried: bool, label: str) -> Any:
        """The labelled counter of a tier (retries) or an error type (dead letters)."""
        if retried:
            counters, family = self._m_retries, self.metrics.retries
        else:
            counters, family = self._m_dead, self.metrics.dead_letters
        counter = counters.get(label)
        if counter is None:
            counter = counters[label] = family.labels(self.group, label)
        return counter

    def _output_done(self, p: _Pending, rec: _Record, dead: bool) -> None:
        if dead:
            self.metrics.dead_letters.labels(self.group, "OutputRefused").inc()
        rec.left -= 1
        if rec.left == 0:
            self.completions.put(Completion(p.ps, [rec.msg.offset], 0, 1 if rec.dead else 0,
                                            0.0, 0))
            hooks = rec.after
            if hooks is not None and not rec.dead:
                hooks.left -= 1
                if hooks.left == 0:
                    self._run_after(hooks.hooks)
        self._release(p)

    def _run_after(self, hooks: list[Callable[[], None]]) -> None:
        """The call's outputs are acknowledged: what waited for them runs (the store's
        completion of the record's key), on a thread of its own, never on the producer's
        delivery thread."""
        if self._after is None:
            self._after = SimpleQueue()
            threading.Thread(target=self._serve_after, name=f"kworkers-after-{self.group}",
                             daemon=True).start()
        self._after.put(hooks)

    def _serve_after(self) -> None:
        assert self._after is not None
        while True:
            for hook in self._after.get():
                try:
                    hook()
                except Exception:
                    log.exception("%s: completing a record after its outputs failed (its "
                                  "key stays claimed until its lease ends)", self.group)

    def _release(self, p: _Pending) -> None:
        self._sizes.append(-p.size)
        p.ps.unacked.pop()
        self._unacked.pop()
        if self._waiting:
            with self._room:
                self._room.notify()
        if p.blocked:
            self._m_blocked.dec()

    def _refused(self, p: _Pending, err: BaseException) -> None:
        """Runs on the producer's thread (delivery reports): decides, never sends from here."""
        plan = p.plan
        self.metrics.handoff_failures.labels(self.group, p.destination).inc()
        self.failures.refused(plan.topic, str(err))
        if p.ps.revoking or self.stop.is_set():
            self._release(p)  # the next owner reads the record again
            return
        if not p.blocked:
            p.blocked = True
            self._m_blocked.inc()
        kind = self.classify(err)
        if kind == "missing":
            p.misses += 1
        if kind == "permanent" or p.misses >= MISSING_LIMIT:
            rec = p.rec
            if rec is not None and isinstance(plan, Output):
                if rec.dead:  # another output of the record took it to its DLQ already
                    self._output_done(p, rec, dead=False)
                    return
                rec.dead = True
            if p.falls_back:
                what = "an output" if isinstance(plan, Output) else "the hand-off"
                log.warning("%s refused %s of %s/%d@%d for good (%s): dead-lettering the "
                            "record instead", plan.topic, what, p.msg.topic, p.msg.partition,
                            p.msg.offset, err)
                p.plan = self.router.dead_letter(p.msg, HandOffError(
                    f"{plan.topic} refused {what}: {err}"))
                p.misses, p.wait = 0, FIRST_WAIT_S
                self._schedule(p, 0.0)
                return
            self.supervisor.fail("dead-letter queue", f"{plan.topic} refuses dead letters "
                                 f"({err}); {p.msg.topic}/{p.msg.partition}@{p.msg.offset} "
                                 "stays uncommitted")
        self._schedule(p, p.wait)
        p.wait = min(p.wait * 2, MAX_WAIT_S)

    def _schedule(self, p: _Pending, delay: float) -> None:
        with self._lock:
            heapq.heappush(self._retries, (self.clock.monotonic() + delay, next(self._seq), p))

    # ------------------------------------------------------------------ poll-thread side

    def tick(self) -> None:
        """From the poll loop: sends the retries now due, writes the failure summary."""
        if self._retries:
            now = self.clock.monotonic()
            due: list[_Pending] = []
            with self._lock:
                while self._retries and self._retries[0][0] <= now:
                    due.append(heapq.heappop(self._retries)[2])
            for p in due:
                if p.ps.revoking or self.stop.is_set():
                    self._release(p)
                else:
                    self._send(p)
        self.failures.flush()
