"""The interpreter's cyclic collector in a ``kworkers run`` process: the CLI owns its process.

A worker keeps every record in flight alive long enough (its ``Message``, and for an async
handler its task, coroutines and contexts, for as long as the handler waits) to be carried
into the collector's older generations. At CPython's default young threshold (a pass after
every 700 tracked objects that outlive their allocation) a busy worker runs young passes every
few hundred records, and full passes, each walking every record in flight while the event loop
and every handler's timer wait, come in proportion. Measured (BENCHMARKS.md, issue #50): at
5,000 async handlers in flight a worker at 20,000 handled 11-32 % more records a second, its
collector's time about a quarter of the default's; a sync no-op worker used 6-16 % less CPU
a record.

Only the CLI sets it: an application that embeds a ``Worker`` owns its process, and a library
that retuned the collector would retune it for everything else that process runs
(docs/CONFIG.md). Set before the application's module is imported, so a module that sets its
own threshold keeps it. The middle and old thresholds stay as they are: what the young one
lets accumulate is at most that many more tracked objects (a few MB of cyclic garbage at most)
before they are collected.
"""

from __future__ import annotations

import gc

#: ``kworkers run``'s young-generation threshold (``--gc-young-threshold``); CPython's is 700
DEFAULT_YOUNG = 20_000


def set_young_threshold(young: int) -> None:
    """The young generation collected after ``young`` tracked objects, the others as they
    are. ``young`` below 1 would turn automatic collection off: refused."""
    if young < 1:
        raise ValueError(f"a young-generation threshold must be at least 1, got {young}: 0 "
                         "turns the collector off and cyclic garbage would never be freed")
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)


def young_threshold() -> int:
    return gc.get_threshold()[0]
