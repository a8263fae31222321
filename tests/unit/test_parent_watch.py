"""A pool's child notices its parent is gone (``kworkers.cli.parent_watch``), no processes:
the parent's pid against a scripted ``getppid``. The integration half (a pool SIGKILLed, its
children read back as gone and out of the group) is ``tests/integration/test_cli_run.py``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from kworkers.cli import parent_watch


def _ppids(*seen: int) -> Callable[[], int]:
    """``getppid`` answering ``seen`` in turn, then the last one for ever."""
    it: Iterator[int] = iter(seen)
    last = [seen[-1]]

    def getppid() -> int:
        last[0] = next(it, last[0])
        return last[0]
    return getppid


def test_orphaned_is_a_changed_parent() -> None:
    assert not parent_watch.orphaned(40, lambda: 40)
    assert parent_watch.orphaned(40, lambda: 1)  # re-parented to init
    assert parent_watch.orphaned(40, lambda: 7)  # or to a subreaper


def test_the_watch_stops_the_worker_once_when_the_parent_goes() -> None:
    stops: list[int] = []
    stopped = threading.Event()
    parent_watch.watch(40, stopped, every=0.0, getppid=_ppids(40, 40, 40, 1, 1),
                       on_orphan=lambda: stops.append(1))
    assert stops == [1]  # returned after the first sign, not once per check


def test_the_watch_leaves_a_child_whose_parent_lives_alone() -> None:
    stops: list[int] = []
    stopped = threading.Event()
    checks = [0]

    def getppid() -> int:
        checks[0] += 1
        if checks[0] == 50:
            stopped.set()  # the worker ended by itself: the watch ends with it
        return 40
    parent_watch.watch(40, stopped, every=0.0, getppid=getppid,
                       on_orphan=lambda: stops.append(1))
    assert stops == [] and checks[0] == 50

