"""The hand-off step: a failed attempt goes to its tier or the DLQ, pipelined, never dropped.

Beside the router on purpose: ``FailureRouter`` decides where a record goes and with which
headers (pure); this step sends it and owns what a send's outcome means.

Pipelined: a runner hands a failure off and moves on to its next record at once; the record's
offset completes when the broker's delivery report arrives (the offset tracker takes
completions in any order), so a lane is never paced by round trips. At most ``limit`` hand-offs
wait for their acknowledgement at a time (then a runner waits for room); an unacknowledged
hand-off holds the commit, because its offset is not complete.

What a refused send means:

- *transient* (broker unreachable, timed out, queue full): retried in place with a growing wait,
  holding the commit, for as long as it takes;
- *permanent* (not authorised, record too large, or the destination still missing after
  ``MISSING_LIMIT`` tries, each after a metadata refresh by the client): the record goes to its
  own source's DLQ with the reason instead;
- the DLQ itself refusing for good: the worker turns unhealthy and says why (the record stays
  uncommitted, retried in place, until the process is restarted).

A hand-off is abandoned only when its partition is revoked or the worker stops: the offset was
never completed, so the next owner reads the record again.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from queue import SimpleQueue
from typing import Literal

from kworkers.clock import Clock
from kworkers.consumer.partition import PartitionState
from kworkers.consumer.ports import Completion
from kworkers.errors import HandOffError, failure_type
from kworkers.message import Message
from kworkers.metrics import Metrics
from kworkers.retry_tiers.failure_log import FailureLog
from kworkers.retry_tiers.router import FailureRouter, HandOff, Sender
from kworkers.supervision import Supervisor

log = logging.getLogger("kworkers.handoff")

FIRST_WAIT_S = 0.1
MAX_WAIT_S = 5.0
#: sends to a missing destination before it counts as gone for good
MISSING_LIMIT = 3
#: hand-offs awaiting acknowledgement per loop, by default
DEFAULT_LIMIT = 10_000

SendErrorKind = Literal["transient", "missing", "permanent"]


def all_transient(_exc: BaseException) -> SendErrorKind:
    """For senders that cannot tell: retry everything in place (never drop)."""
    return "transient"


class _Pending:
    """One hand-off until its acknowledgement."""

    __slots__ = ("blocked", "misses", "msg", "plan", "ps", "wait")

    def __init__(self, ps: PartitionState, msg: Message, plan: HandOff) -> None:
        self.ps = ps
        self.msg = msg
        self.plan = plan
        self.misses = 0
        self.wait = FIRST_WAIT_S
        self.blocked = False


class HandOffStep:
    def __init__(self, router: FailureRouter, sender: Sender, metrics: Metrics, group: str,
                 completions: SimpleQueue[Completion], clock: Clock, stop: threading.Event,
                 supervisor: Supervisor,
                 classify: Callable[[BaseException], SendErrorKind] = all_transient,
                 limit: int = DEFAULT_LIMIT) -> None:
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
        self.failures = FailureLog(log, group, clock)
        self._m_blocked = metrics.handoff_blocked.labels(group)
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._pending = 0
        self._retries: list[tuple[float, int, _Pending]] = []
        self._seq = itertools.count()

    # ------------------------------------------------------------------ runner side

    @property
    def pending(self) -> int:
        return self._pending

    def has_room(self) -> bool:
        return self._pending < self.limit

    def wait_room(self, ps: PartitionState) -> bool:
        """Blocks while ``limit`` hand-offs are unacknowledged; False if abandoned meanwhile."""
        with self._room:
            while self._pending >= self.limit:
                if ps.revoking or self.stop.is_set():
                    return False
                self._room.wait(0.1)
        return True

    def submit(self, ps: PartitionState, msg: Message, exc: BaseException) -> bool:
        """Hands ``msg``'s failed attempt off. True: its completion is now this step's (posted
        when acknowledged); False: abandoned (revoked, stopping, or no destination at all):
        the runner stops and the record will be delivered again."""
        if ps.revoking or self.stop.is_set() or not self.wait_room(ps):
            return False
        plan = self._plan(msg, exc)
        if plan is None:
            return False
        with self._lock:
            self._pending += 1
            ps.handoffs += 1
        self.failures.handed(failure_type(exc), plan.topic)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s/%d@%d attempt %d failed (%s: %s) -> %s %s", msg.topic, msg.partition,
                      msg.offset, msg.attempt, type(exc).__name__, str(exc)[:200],
                      plan.destination, plan.topic)
        self._send(_Pending(ps, msg, plan))
        return True

    def _plan(self, msg: Message, exc: BaseException) -> HandOff | None:
        try:
            return self.router.plan(msg, exc)
        except Exception as bad:  # a record the router cannot place: its own DLQ, with why
            log.warning("%s/%d@%d cannot be routed (%s): dead-lettering it", msg.topic,
                        msg.partition, msg.offset, bad)
            try:
                return self.router.dead_letter(msg, bad)
            except Exception as worse:
                self.supervisor.fail("hand-off", f"no destination for {msg.topic}/"
                                     f"{msg.partition}@{msg.offset}: {worse}")
                return None

    # ------------------------------------------------------------------ sending

    def _send(self, p: _Pending) -> None:
        plan = p.plan
        try:
            fut = self.sender.send(plan.topic, plan.key, plan.value, plan.headers)
        except Exception as err:  # a Sender should put errors in its future; be safe anyway
            self._refused(p, err)
            return
        fut.add_done_callback(partial(self._delivered, p))

    def _delivered(self, p: _Pending, fut: Future[None]) -> None:
        err = fut.exception()
        if err is not None:
            self._refused(p, err)
            return
        plan = p.plan
        if plan.destination == "retry":
            self.metrics.retries.labels(self.group, plan.label).inc()
            self.completions.put((p.ps, [p.msg.offset], 1, 0, 0.0))
        else:
            self.metrics.dead_letters.labels(self.group, plan.label).inc()
            self.completions.put((p.ps, [p.msg.offset], 0, 1, 0.0))
        self._release(p)

    def _release(self, p: _Pending) -> None:
        with self._room:
            self._pending -= 1
            p.ps.handoffs -= 1
            self._room.notify()
        if p.blocked:
            self._m_blocked.dec()

    def _refused(self, p: _Pending, err: BaseException) -> None:
        """Runs on the producer's thread (delivery reports): decides, never sends from here."""
        plan = p.plan
        self.metrics.handoff_failures.labels(self.group, plan.destination).inc()
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
            if plan.destination != "dlq":
                log.warning("%s refused %s/%d@%d for good (%s): dead-lettering it instead",
                            plan.topic, p.msg.topic, p.msg.partition, p.msg.offset, err)
                p.plan = self.router.dead_letter(p.msg, HandOffError(
                    f"{plan.topic} refused the hand-off: {err}"))
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
