"""Where handlers run: a pool of daemon threads for sync handlers, an asyncio loop for async.

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

log = logging.getLogger("kworkers.runtime")


class DaemonPool:
    def __init__(self, size: int, name: str = "kworkers-handler") -> None:
        self._q: SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(size)
        ]
        for t in self._threads:
            t.start()

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


class AsyncRuntime:
    """One event loop in a thread of its own; the poll thread submits coroutines to it."""

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

    def submit(self, coro: Coroutine[Any, Any, None]) -> None:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        fut.add_done_callback(_log_crash)

    def shutdown(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


def _log_crash(fut: Any) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("async runner crashed", exc_info=fut.exception())
