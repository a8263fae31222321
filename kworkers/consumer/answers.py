"""How a runtime answers what a runner asks, apart from running a record: written once.

``Runner.steps`` yields requests (``kworkers.consumer.steps``); a record or a batch to run is
the runtime's own business (a thread call, an await under a slot, a deadline), everything else
is answered here. The sync and the async runtime differ only in how they *wait* (sleep or
await, call or ``adecode``): so ``answer`` is a generator that yields each wait as a
``Blocking`` value and returns the answer, and each runtime resolves the waits its way
(``resolve`` with plain calls, ``aresolve`` with awaits). Before this, both runtimes spelled the
six answers out, and a change to one (the lease wait's halt check) had to be made twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator
from typing import Any, Protocol

from kworkers.consumer.partition import Partition
from kworkers.consumer.ports import TP
from kworkers.consumer.steps import (
    Decoder,
    DecodeRequest,
    EmitRequest,
    HandOffRequest,
    HandOffs,
    Job,
    LeaseWait,
    Pacer,
    PaceRequest,
    Wait,
)
from kworkers.message import Message

#: a lease wait looks for a revoke, a stop or a fence at least this often
LEASE_STEP_S = 0.1


class Blocking(Protocol):
    """A wait inside an answer, done by the runtime's own means."""

    def run(self) -> Any:
        """On a runner's thread: block."""
        ...

    async def arun(self) -> Any:
        """On the event loop: never block it."""
        ...


class _Sleep:
    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def run(self) -> None:
        time.sleep(self.seconds)

    async def arun(self) -> None:
        await asyncio.sleep(self.seconds)


class _Room:
    """Room among the hand-offs waiting for their acknowledgement (only the wait for it may
    block: on the event loop it goes to a thread)."""

    __slots__ = ("hand_offs", "ps")

    def __init__(self, hand_offs: HandOffs, ps: Partition) -> None:
        self.hand_offs = hand_offs
        self.ps = ps

    def run(self) -> bool:
        return self.hand_offs.wait_room(self.ps)

    async def arun(self) -> bool:
        return await asyncio.to_thread(self.hand_offs.wait_room, self.ps)


class _Decode:
    __slots__ = ("decoder", "halted", "msg")

    def __init__(self, decoder: Decoder, msg: Message, halted: Callable[[], bool]) -> None:
        self.decoder = decoder
        self.msg = msg
        self.halted = halted

    def run(self) -> Message | BaseException | None:
        return self.decoder.decode(self.msg, self.halted)

    async def arun(self) -> Message | BaseException | None:
        return await self.decoder.adecode(self.msg, self.halted)


class _Pace:
    __slots__ = ("halted", "name", "pacer", "tp", "want")

    def __init__(self, pacer: Pacer, req: PaceRequest, halted: Callable[[], bool]) -> None:
        self.pacer = pacer
        self.tp: TP = req.tp
        self.name = req.name
        self.want = req.want
        self.halted = halted

    def run(self) -> Any:
        return self.pacer.acquire(self.tp, self.name, self.want, self.halted)

    async def arun(self) -> Any:
        return await self.pacer.aacquire(self.tp, self.name, self.want, self.halted)


Answer = Generator[Blocking, Any, Any]


def answer(runner: Job, ps: Partition, req: object) -> Answer:
    """The answer to ``req`` (anything but a record or a batch to run), its waits yielded."""
    if isinstance(req, HandOffRequest):
        # pipelined: the send never waits for its acknowledgement, only for room
        if not runner.hand_offs.has_room():
            yield _Room(runner.hand_offs, ps)
        return runner.hand_off(ps, req.msg, req.exc)
    if isinstance(req, EmitRequest):
        if not runner.hand_offs.has_room():
            yield _Room(runner.hand_offs, ps)
        return runner.emit(ps, req)
    if isinstance(req, Wait):
        yield _Sleep(Wait.SECONDS)
        return None
    if isinstance(req, DecodeRequest):
        assert runner.decoder is not None
        return (yield _Decode(runner.decoder, req.msg, lambda: ps.halted))
    if isinstance(req, PaceRequest):
        assert runner.pacer is not None
        return (yield _Pace(runner.pacer, req, lambda: ps.halted or ps.fenced))
    if isinstance(req, LeaseWait):  # a real sleep, whatever the clock, in short steps
        end = time.monotonic() + req.seconds
        while not (ps.halted or ps.fenced) and time.monotonic() < end:
            yield _Sleep(min(LEASE_STEP_S, max(0.0, end - time.monotonic())))
        return not (ps.halted or ps.fenced)
    raise TypeError(f"a runner asked for {req!r}")


def resolve(runner: Job, ps: Partition, req: object) -> Any:
    """The answer to ``req``, its waits done with plain calls (a runner's thread)."""
    if type(req) is HandOffRequest and runner.hand_offs.has_room():
        # a failure with room to send it: no wait, by far the most frequent request here (in
        # a storm, every record): answered without the generator (0.3 us a record)
        return runner.hand_off(ps, req.msg, req.exc)
    got = answer(runner, ps, req)
    try:
        wait = next(got)
        while True:
            wait = got.send(wait.run())
    except StopIteration as done:
        return done.value


async def aresolve(runner: Job, ps: Partition, req: object) -> Any:
    """The answer to ``req``, its waits awaited (the event loop)."""
    if type(req) is HandOffRequest and runner.hand_offs.has_room():
        return runner.hand_off(ps, req.msg, req.exc)  # as ``resolve``
    got = answer(runner, ps, req)
    try:
        wait = next(got)
        while True:
            wait = got.send(await wait.arun())
    except StopIteration as done:
        return done.value
