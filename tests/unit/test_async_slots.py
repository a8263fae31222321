"""The async runtime's call limit (``runtime._Slots``): never more than ``n`` calls at once,
first come first served, and a waiter cancelled after it was handed a slot passes it on (a
slot lost that way would shrink the pool for good; one counted twice would break the bound)."""

from __future__ import annotations

import asyncio

from kworkers.consumer.runtime import _Slots


async def _waiting(slots: _Slots) -> None:
    """Queues for a slot as the runtime's driver does (cancelled: ``cancelled`` told)."""
    fut = slots.wait()
    try:
        await fut
    except asyncio.CancelledError:
        slots.cancelled(fut)
        raise


async def _call(slots: _Slots, name: str, log: list[str], running: list[int],
                gate: asyncio.Event) -> None:
    if not slots.take():
        await _waiting(slots)
    try:
        running[0] += 1
        running[1] = max(running[1], running[0])
        log.append(name)
        await gate.wait()
    finally:
        running[0] -= 1
        slots.release()


def test_at_most_n_at_once_and_in_arrival_order() -> None:
    async def main() -> tuple[list[str], int, int]:
        slots = _Slots(2, asyncio.get_running_loop())
        log: list[str] = []
        running = [0, 0]
        gate = asyncio.Event()
        tasks = [asyncio.create_task(_call(slots, f"c{i}", log, running, gate))
                 for i in range(6)]
        for _ in range(5):
            await asyncio.sleep(0)
        started_before_release = len(log)
        gate.set()
        await asyncio.gather(*tasks)
        assert slots.free == 2  # every slot came back
        return log, running[1], started_before_release

    log, most, early = asyncio.run(main())
    assert early == 2  # the bound held while the first two ran
    assert most == 2
    assert log == [f"c{i}" for i in range(6)]


def test_a_waiter_cancelled_after_the_hand_over_passes_its_slot_on() -> None:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        slots = _Slots(1, loop)
        assert slots.take()
        first = asyncio.create_task(_waiting(slots))
        second = asyncio.create_task(_waiting(slots))
        await asyncio.sleep(0)
        slots.release()  # handed to ``first`` ...
        first.cancel()   # ... which is cancelled before it runs: ``second`` gets the slot
        await asyncio.sleep(0)
        await asyncio.wait_for(second, 1)
        slots.release()
        return slots.free

    assert asyncio.run(main()) == 1


def test_a_waiter_cancelled_while_queued_is_skipped() -> None:
    async def main() -> int:
        slots = _Slots(1, asyncio.get_running_loop())
        assert slots.take()
        gone = asyncio.create_task(_waiting(slots))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        slots.release()  # nobody live waits: the slot is free again
        assert not slots.waiters
        return slots.free

    assert asyncio.run(main()) == 1


def test_canary_a_limit_that_never_queues_breaks_the_bound() -> None:
    """The first test has teeth: with a ``take`` that always grants, more than two run."""
    class Leaky(_Slots):
        def take(self) -> bool:
            self.free -= 1
            return True

    async def main() -> int:
        slots = Leaky(2, asyncio.get_running_loop())
        running = [0, 0]
        gate = asyncio.Event()
        tasks = [asyncio.create_task(_call(slots, f"c{i}", [], running, gate))
                 for i in range(6)]
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(*tasks)
        return running[1]

    assert asyncio.run(main()) > 2
