"""What a lane's runner asks of its runtime, and how it reports what it handled.

``Runner.steps`` (``kworkers.consumer.runner``) is a generator: it yields ``Request`` values
(a record or batch to run, a failed attempt to hand off, a short wait) and the runtime
(``kworkers.consumer.runtime``) answers each. The seams both sides see live here, apart from
the runner's logic, so a runtime can be read without the lifecycle and the other way round.
"""

from __future__ import annotations

from collections.abc import Generator
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any, Protocol

from kworkers.clock import Clock
from kworkers.consumer.partition import Item, Lane, PartitionState
from kworkers.consumer.ports import Completion
from kworkers.message import Message

if TYPE_CHECKING:
    from kworkers.consumer.runner import Runner

#: a runner reports completions at least this often within a long batch
PARTIAL_POST_S = 0.05

class HandOffRequest:
    """Asked of the runtime by ``Runner.steps``: hand this failed attempt off."""

    __slots__ = ("exc", "msg")

    def __init__(self, msg: Message, exc: BaseException) -> None:
        self.msg = msg
        self.exc = exc


class Wait:
    """Asked of the runtime by a batch runner filling a batch: pause a moment (sleep or await)."""

    SECONDS = 0.002


WAIT = Wait()
#: what ``Runner.steps`` yields: a record (or a batch of records) to run, a failure to hand off,
#: or a short wait while a batch fills
Request = Message | list[Message] | HandOffRequest | Wait
#: sent back: the handler's exception (or None) for a record or a batch; for a hand-off, True
#: when the hand-off step took it (it completes the offset on acknowledgement), False when
#: abandoned; nothing for a wait
Steps = Generator[Request, Any, None]
#: the record a watchdog took a lane for, or the whole batch
TimedOut = Message | list[Message]


class HandOffs(Protocol):
    """The hand-off step as runners see it (``kworkers.retry_tiers.handoff.HandOffStep``)."""

    def has_room(self) -> bool: ...
    def wait_room(self, ps: PartitionState) -> bool: ...
    def submit(self, ps: PartitionState, msg: Message, exc: BaseException) -> bool: ...
    def tick(self) -> None:
        """Called by the poll loop every step (retries due, summaries)."""
        ...


class Runtime(Protocol):
    """Where runners execute: ``ThreadRuntime`` (sync handlers) or ``AsyncRuntime``."""

    is_async: bool
    #: runners execute on the thread that starts them (the poll thread)
    is_inline: bool

    def run(self, runner: Runner, lane: Lane, items: list[Item], inc: int,
            timed_out: TimedOut | None) -> None: ...

    def alive(self) -> bool: ...

    def stalled(self, bound: float) -> str | None:
        """A handler call (or the event loop) busy for longer than ``bound`` s, described."""
        ...

    def shutdown(self) -> None: ...


class Progress:
    """A runner's handled offsets not yet reported (hand-offs report their own on
    acknowledgement).

    ``lane.done`` always names the current list, so a revoke can collect it from a runner that
    is stuck on a later record.
    """

    __slots__ = ("done", "lane", "now", "q", "t0")

    def __init__(self, q: SimpleQueue[Completion], lane: Lane, clock: Clock) -> None:
        self.q = q
        self.lane = lane
        self.now = clock.monotonic
        self._reset()

    def _reset(self) -> None:
        self.done: list[int] = []
        self.lane.done = self.done
        self.t0 = self.now()

    def record(self, offset: int) -> None:
        self.done.append(offset)
        if self.now() - self.t0 > PARTIAL_POST_S:
            self.post()

    def post(self) -> None:
        if self.done:
            self.q.put((self.lane.part, self.done, 0, 0, self.now() - self.t0))
        self._reset()

    def finish(self, inc: int) -> None:
        """The runner stops early (revoke, stop, abandoned hand-off): report, drop the queue."""
        self.post()
        lane = self.lane
        with lane.lock:
            if lane.incarnation == inc:
                lane.queue = []
                lane.running = False

    def hold(self, inc: int, rest: list[Item]) -> None:
        """The breaker is open: report, and put the records not started back at the head of
        the lane (in order); the poll loop restarts the lane when the breaker admits again."""
        self.post()
        lane = self.lane
        with lane.lock:
            if lane.incarnation == inc:
                lane.queue = rest + lane.queue
                lane.running = False
