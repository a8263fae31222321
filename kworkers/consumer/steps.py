"""What a lane's runner asks of its runtime, and how it reports what it handled.

``Runner.steps`` (``kworkers.consumer.runner``) is a generator: it yields ``Request`` values
(a record or batch to run, a failed attempt to hand off, a short wait) and the runtime
(``kworkers.consumer.runtime``) answers each. The seams both sides see live here, apart from
the runner's logic, so a runtime can be read without the lifecycle and the other way round.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from queue import SimpleQueue
from typing import Any, Protocol

from kworkers.clock import Clock
from kworkers.consumer.outputs import Emitted
from kworkers.consumer.partition import Item, Lane, Partition
from kworkers.consumer.ports import TP, Completion, Handler, Invoker
from kworkers.message import Message

#: a runner reports completions at least this often within a long batch
PARTIAL_POST_S = 0.05

class HandOffRequest:
    """Asked of the runtime by ``Runner.steps``: hand this failed attempt off."""

    __slots__ = ("exc", "msg")

    def __init__(self, msg: Message, exc: BaseException) -> None:
        self.msg = msg
        self.exc = exc


class EmitRequest:
    """Asked of the runtime by ``Runner.steps``: a handler call succeeded and produced these
    outputs; their records complete when the outputs are durable (``HandOffs.emit``)."""

    __slots__ = ("after", "emitted")

    def __init__(self, emitted: list[Emitted], after: list[Callable[[], None]]) -> None:
        self.emitted = emitted
        self.after = after


class DecodeRequest:
    """Asked of the runtime by ``Runner.steps``: decode this record before its handler runs
    (the worker's deserializers, ``kworkers.payloads.decode``). Sent back: the decoded copy,
    the exception that condemns it, or None when its partition halted while it waited for a
    registry that did not answer."""

    __slots__ = ("msg",)

    def __init__(self, msg: Message) -> None:
        self.msg = msg


class Decoder(Protocol):
    """Decodes records on a runner's thread or the event loop (``RecordDecoder``)."""

    def decode(self, msg: Message, halted: Callable[[], bool]
               ) -> Message | BaseException | None: ...

    async def adecode(self, msg: Message, halted: Callable[[], bool]
                      ) -> Message | BaseException | None: ...

    def waiting(self) -> set[TP]:
        """The partitions whose next record waits for the registry (a hold, not a stall)."""
        ...

    def asks_due(self) -> dict[TP, float]:
        """When each of those partitions' records should have asked the registry again by
        (monotonic): a wait past it has stopped asking, no longer a hold (``stall.overdue``)."""
        ...


class PaceRequest:
    """Asked of the runtime by ``Runner.steps``: tokens of rate-limit bucket ``name`` for up
    to ``want`` records of partition ``tp`` before the next one starts (``kworkers.pace``).
    Sent back: the ``Tokens`` (at least one), or None when the partition halted or the member
    fenced itself while it waited."""

    __slots__ = ("name", "tp", "want")

    def __init__(self, tp: TP, name: str, want: int) -> None:
        self.tp = tp
        self.name = name
        self.want = want


class Tokens(Protocol):
    """What a runner got from its pacer: start at most ``count`` records before ``until``
    (monotonic); a token left at ``until`` is spent no more."""

    @property
    def count(self) -> int: ...
    @property
    def until(self) -> float: ...


class Pacer(Protocol):
    """The worker's rate limit as runners see it (``kworkers.pace.pacer.Pacer``)."""

    #: the bucket of every record (None: one per key or per name, ``bucket_of`` each record)
    fixed: str | None

    @property
    def pool_wide(self) -> bool:
        """The limit is the pool's (``scope="pool"``): more replicas share it, so what it
        holds is not drainable (``consumer.drainable``)."""
        ...

    def bucket_of(self, msg: Message) -> str | None: ...

    def acquire(self, tp: TP, name: str, want: int,
                halted: Callable[[], bool]) -> Tokens | None: ...

    async def aacquire(self, tp: TP, name: str, want: int,
                       halted: Callable[[], bool]) -> Tokens | None: ...

    def waiting(self) -> set[TP]:
        """The partitions whose next record waits for a token (a hold, not a stall)."""
        ...

    def asked(self) -> dict[TP, float]:
        """When a waiting record of each of those partitions last asked for a token
        (monotonic): a wait that stopped asking is no longer a hold (``stall.overdue``)."""
        ...


class Wait:
    """Asked of the runtime by a batch runner filling a batch: pause a moment (sleep or await)."""

    SECONDS = 0.002


class LeaseWait:
    """Asked of the runtime by ``Runner.steps``: the record's key is another attempt's
    (``errors.LeaseBusy``), wait ``seconds`` before it runs again (sleep or await, in short
    steps). Sent back: True once waited, False when the partition halted or the member fenced
    itself meanwhile (the record did not run)."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


WAIT = Wait()
#: what ``Runner.steps`` yields: a record (or a batch of records) to run, a failure to hand off,
#: outputs to send, a record to decode, tokens to take, a short wait while a batch fills, or a
#: wait for another attempt's lease
Request = (Message | list[Message] | HandOffRequest | EmitRequest | DecodeRequest | PaceRequest
           | Wait | LeaseWait)
#: sent back: the handler's exception (or None) for a record or a batch; for a hand-off or
#: outputs, True when the hand-off step took them (it completes the offsets once they are
#: durable), False when abandoned; nothing for a wait
Steps = Generator[Request, Any, None]
#: the record a watchdog took a lane for, or the whole batch
TimedOut = Message | list[Message]


class HandOffs(Protocol):
    """The hand-off step as runners see it (``kworkers.consumer.handoff.HandOffStep``)."""

    def has_room(self) -> bool: ...
    def wait_room(self, ps: Partition) -> bool: ...
    def submit(self, ps: Partition, msg: Message, exc: BaseException) -> bool: ...
    def emit(self, ps: Partition, emitted: list[Emitted],
             after: list[Callable[[], None]]) -> bool:
        """Takes a successful call's outputs: True when the step now owns the completion of
        their records (posted once the outputs are durable), False when abandoned."""
        ...
    def tick(self) -> None:
        """Called by the poll loop every step (retries due, summaries)."""
        ...
    def acknowledged(self) -> list[Completion]:
        """From the poll thread, with the completion queue's: hand-offs acknowledged since it
        last asked, taken in bulk (the step posts an empty completion to wake the thread)."""
        ...


class Job(Protocol):
    """What a runtime needs of the runner it drives (``kworkers.consumer.runner.Runner``):
    the skeleton to drive, and how to call a handler and hand a failure off."""

    handler: Handler
    invoke: Invoker
    clock: Clock
    #: the per-message deadline an async runtime bounds each call by (None: none)
    timeout: float | None
    hand_offs: HandOffs
    #: the worker's deserializers, when it has any (``DecodeRequest``)
    decoder: Decoder | None
    #: the worker's rate limit, when it has one (``PaceRequest``)
    pacer: Pacer | None

    def steps(self, lane: Lane, batch: list[Item], inc: int,
              timed_out: TimedOut | None) -> Steps: ...
    def hand_off(self, ps: Partition, msg: Message, exc: BaseException) -> bool: ...
    def emit(self, ps: Partition, req: EmitRequest) -> bool: ...


class Runtime(Protocol):
    """Where runners execute: ``ThreadRuntime`` (sync handlers) or ``AsyncRuntime``."""

    is_async: bool
    #: runners execute on the thread that starts them (the poll thread)
    is_inline: bool

    def run(self, runner: Job, lane: Lane, items: list[Item], inc: int,
            timed_out: TimedOut | None) -> None: ...

    def alive(self) -> bool: ...

    def contended(self) -> bool:
        """Runners wait for a place to run: a runner between two passes over its lane should
        give its place up and queue again behind them (fairness under a backlog)."""
        ...

    def calling(self) -> set[TP]:
        """The partitions a handler call is under way for right now (the stall detector)."""
        ...

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

    __slots__ = ("calls", "done", "lane", "now", "q", "t0")

    def __init__(self, q: SimpleQueue[Completion], lane: Lane, clock: Clock) -> None:
        self.q = q
        self.lane = lane
        self.now = clock.monotonic
        self._reset()

    def _reset(self) -> None:
        #: the list is made with the first offset: a pass reports (and resets) after each
        #: slow record and once more at its end, and a list made each time for nothing was
        #: one more object per record for the cyclic collector (issue #50)
        self.done: list[int] | tuple[()] = ()
        #: records whose handler ran since the last report, failed ones included
        self.calls = 0
        self.lane.reporting(())
        self.t0 = self.now()

    def record(self, offset: int) -> None:
        done = self.done
        if done:
            done.append(offset)
        else:
            self.done = done = [offset]
            self.lane.reporting(done)
        self.calls += 1
        if self.now() - self.t0 > PARTIAL_POST_S:
            self.post()

    def record_many(self, offsets: list[int]) -> None:
        """A whole batch handled: ``record`` once per batch, not per record."""
        done = self.done
        if done:
            done.extend(offsets)
        elif offsets:
            self.done = done = list(offsets)
            self.lane.reporting(done)
        self.calls += len(offsets)
        if self.now() - self.t0 > PARTIAL_POST_S:
            self.post()

    def ran(self, records: int = 1) -> None:
        """Handler calls whose offsets are another step's to complete (a failure's hand-off,
        outputs to send): their time counts (the handler-duration histogram observes every
        call)."""
        self.calls += records

    def post(self) -> None:
        if self.done or self.calls:
            done = self.done
            self.q.put(Completion(self.lane.part, done if done else [], 0, 0,
                                  self.now() - self.t0, self.calls))
        self._reset()

    def finish(self, inc: int) -> None:
        """The runner stops early (revoke, stop, abandoned hand-off): report, drop the queue."""
        self.post()
        self.lane.finish(inc)

    def hold(self, inc: int, rest: list[Item]) -> None:
        """The breaker is open: report, and put the records not started back at the head of
        the lane (in order); the poll loop restarts the lane when the breaker admits again."""
        self.post()
        self.lane.hold(inc, rest)
