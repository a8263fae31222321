"""The runtimes' one interpreter (``kworkers.consumer.answers``): each request answered the
same whether its waits are calls (a runner's thread) or awaits (the event loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import pytest

from kworkers.consumer.answers import aresolve, resolve
from kworkers.consumer.partition import Partition
from kworkers.consumer.steps import (
    DecodeRequest,
    EmitRequest,
    HandOffRequest,
    Job,
    LeaseWait,
    PaceRequest,
    Wait,
)
from kworkers.message import Message

MSG = Message("t", 0, 7, None, b"v")


class _Job:
    """What an answer asks of a runner, recorded."""

    def __init__(self, room: bool = True) -> None:
        self.room = room
        self.asked: list[str] = []
        self.hand_offs = self
        self.decoder = self
        self.pacer = self

    def has_room(self) -> bool:
        return self.room

    def wait_room(self, ps: Partition) -> bool:
        self.asked.append("wait_room")
        self.room = True
        return True

    def hand_off(self, ps: Partition, msg: Message, exc: BaseException) -> bool:
        self.asked.append(f"hand_off {msg.offset} {exc}")
        return True

    def emit(self, ps: Partition, req: EmitRequest) -> bool:
        self.asked.append(f"emit {len(req.emitted)}")
        return True

    def decode(self, msg: Message, halted: Callable[[], bool]) -> Message:
        self.asked.append("decode")
        return msg._replace(value=b"decoded")

    async def adecode(self, msg: Message, halted: Callable[[], bool]) -> Message:
        self.asked.append("decode")
        return msg._replace(value=b"decoded")

    def acquire(self, tp: Any, name: str, want: int, halted: Callable[[], bool]) -> str:
        self.asked.append(f"acquire {name} {want}")
        return "tokens"

    async def aacquire(self, tp: Any, name: str, want: int,
                       halted: Callable[[], bool]) -> str:
        self.asked.append(f"acquire {name} {want}")
        return "tokens"


def _both(req: object, room: bool = True, ps: Partition | None = None
          ) -> list[tuple[Any, list[str]]]:
    """(answer, what was asked) with calls, then with awaits."""
    out = []
    for mode in ("sync", "async"):
        job = _Job(room)
        part = ps if ps is not None else Partition("t", 0)
        value = (resolve(cast(Job, job), part, req) if mode == "sync" else
                 asyncio.run(aresolve(cast(Job, job), part, req)))
        out.append((value, job.asked))
    return out


@pytest.mark.parametrize(("req", "room", "want"), [
    (HandOffRequest(MSG, ValueError("x")), True, (True, ["hand_off 7 x"])),
    (HandOffRequest(MSG, ValueError("x")), False, (True, ["wait_room", "hand_off 7 x"])),
    (EmitRequest([], []), False, (True, ["wait_room", "emit 0"])),
    (Wait(), True, (None, [])),
    (DecodeRequest(MSG), True, (MSG._replace(value=b"decoded"), ["decode"])),
    (PaceRequest(("t", 0), "b", 3), True, ("tokens", ["acquire b 3"])),
    (LeaseWait(0.01), True, (True, [])),
])
def test_each_request_is_answered_alike_by_calls_and_by_awaits(
        req: object, room: bool, want: tuple[Any, list[str]]) -> None:
    sync, aio = _both(req, room)
    assert sync == aio == want


def test_a_lease_wait_on_a_halted_partition_says_it_did_not_wait() -> None:
    ps = Partition("t", 0)
    ps.mark_halted()
    assert _both(LeaseWait(30.0), ps=ps) == [(False, []), (False, [])]


def test_an_unknown_request_is_refused_by_both() -> None:
    with pytest.raises(TypeError, match="a runner asked for"):
        resolve(cast(Job, _Job()), Partition("t", 0), object())
    with pytest.raises(TypeError, match="a runner asked for"):
        asyncio.run(aresolve(cast(Job, _Job()), Partition("t", 0), object()))
