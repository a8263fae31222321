"""Where runners execute: daemon threads for sync handlers, one asyncio loop for async ones.

Each runtime only *drives* ``Runner.steps`` (the one runner skeleton): it runs the records the
skeleton yields and performs the hand-offs it asks for, with plain calls or with awaits.

Daemon threads on purpose: a handler stuck past its deadline must not keep the process from
exiting after a drain; ``concurrent.futures`` joins its threads at exit.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from queue import SimpleQueue
from typing import Any

from kworkers.consumer.partition import Item, Lane
from kworkers.consumer.runner import HandOffRequest, Runner, current_lane
from kworkers.message import Message

log = logging.getLogger("kworkers.runtime")


class ThreadRuntime:
    """A pool of daemon threads; each runner occupies one thread while its lane has work."""

    is_async = False

    def __init__(self, size: int, name: str = "kworkers-handler") -> None:
        self._q: SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(size)
        ]
        for t in self._threads:
            t.start()

    def run(self, runner: Runner, lane: Lane, items: list[Item], inc: int,
            timed_out: Message | None) -> None:
        self.submit(_drive_sync, runner, lane, items, inc, timed_out)

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        self._q.put((fn, args))

    def _work(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            fn, args = job
            try:
                fn(*args)
            except BaseException:  # a runner bug must not kill the pool thread
                log.exception("handler runner crashed")

    def shutdown(self) -> None:
        for _ in self._threads:
            self._q.put(None)


def _drive_sync(runner: Runner, lane: Lane, items: list[Item], inc: int,
                timed_out: Message | None) -> None:
    current_lane.set(lane)
    steps = runner.steps(lane, items, inc, timed_out)
    send = steps.send
    handler, invoke, hand_off, ps = runner.handler, runner.invoke, runner.hand_off, lane.part
    try:
        req = next(steps)
        while True:
            if isinstance(req, HandOffRequest):
                req = send(hand_off(ps, req.msg, req.exc))
                continue
            try:
                invoke(handler, req)
            except Exception as exc:
                req = send(exc)
            else:
                req = send(None)
    except StopIteration:
        pass


class AsyncRuntime:
    """One event loop in a thread of its own; the poll thread submits runners to it."""

    is_async = True

    def __init__(self, concurrency: int) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kworkers-asyncio", daemon=True)
        self._thread.start()
        self._ready.wait()
        self.semaphore = asyncio.run_coroutine_threadsafe(
            self._make_sem(concurrency), self.loop).result()

    @staticmethod
    async def _make_sem(n: int) -> asyncio.Semaphore:
        return asyncio.Semaphore(n)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def run(self, runner: Runner, lane: Lane, items: list[Item], inc: int,
            timed_out: Message | None) -> None:
        self.submit(self._drive(runner, lane, items, inc, timed_out))

    def submit(self, coro: Coroutine[Any, Any, None]) -> None:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        fut.add_done_callback(_log_crash)

    async def _drive(self, runner: Runner, lane: Lane, items: list[Item], inc: int,
                     timed_out: Message | None) -> None:
        current_lane.set(lane)
        steps = runner.steps(lane, items, inc, timed_out)
        sem = self.semaphore
        timeout = runner.timeout
        handler, invoke, ps = runner.handler, runner.invoke, lane.part
        try:
            req = next(steps)
            while True:
                if isinstance(req, HandOffRequest):
                    # The hand-off waits for the broker: never on the event loop.
                    req = steps.send(await asyncio.to_thread(
                        runner.hand_off, ps, req.msg, req.exc))
                    continue
                result: BaseException | None = None
                try:
                    async with sem:
                        coro = invoke(handler, req)
                        if timeout is not None:
                            await asyncio.wait_for(coro, timeout)
                        else:
                            await coro
                except Exception as exc:
                    result = exc
                    if timeout is not None and isinstance(exc, TimeoutError):
                        result = TimeoutError(f"handler exceeded its {timeout}s deadline")
                req = steps.send(result)
        except StopIteration:
            pass

    def shutdown(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


def _log_crash(fut: Any) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("async runner crashed", exc_info=fut.exception())
