from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from kworkers import Worker

pytestmark = pytest.mark.integration


def wait_for(cond: Callable[[], object], timeout: float = 60.0, what: str = "condition") -> None:
    """Polls a condition; the timeout only bounds a hung test, it is never a pass criterion."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def start(worker: Worker) -> tuple[threading.Thread, list[BaseException]]:
    """Runs ``worker`` on a thread; the list receives what its ``run`` raised."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run(install_signals=False)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, errors


def run_to_end(worker: Worker, timeout: float = 60) -> BaseException | None:
    """Runs ``worker`` until it stops by itself; what it raised (None for a clean end)."""
    t, errors = start(worker)
    t.join(timeout)
    assert not t.is_alive(), "the worker did not stop by itself"
    return errors[0] if errors else None


@contextmanager
def running(worker: Worker) -> Iterator[Worker]:
    """Runs a worker in a thread; stops it (gracefully) and joins on exit."""
    t, errors = start(worker)
    try:
        wait_for(lambda: worker.ready or bool(errors), 60, "worker ready")
        if errors:
            raise errors[0]
        yield worker
    finally:
        worker.stop()
        t.join(90)
        assert not t.is_alive(), "worker did not stop"
        if errors:
            raise errors[0]
