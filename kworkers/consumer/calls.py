"""Handler calls that never return: the worker turns unready, then unhealthy, and says which.

Why: Python cannot stop a thread, and a handler blocked for good (a socket read with no
timeout) holds its record, and behind it its partition, with nothing to show: the stall
detector skips a partition with a call running, and with no ``message_timeout`` there was no
deadline to pass. Tried as a user would (issue #43): none of the 100 records behind the hung
one ran in 200 s while ``/healthz`` and ``/readyz`` answered 200 and nothing was logged.

So a bound applies with or without a deadline (``LoopSettings.slow_call_bound`` and
``hung_call_bound``), measured from the call's start or its last heartbeat (a long job that
checkpoints with ``activity.record_heartbeat`` is alive): past the first, ``/readyz`` answers
503 naming the record and how long it has run, and one log line says so; past the second the
worker is unhealthy (``/healthz`` 503) and stops, committing what finished, so the
orchestrator restarts it. The record's next run then counts as an attempt (a takeover of the
lease its dead attempt held, ``kworkers.activity``), so a record that hangs every time ends in
the DLQ instead of holding its partition forever.

The runtimes say what runs and since when (``Runtime.stalled``); this only judges, on the poll
threads, at most every ``CHECK_S``.
"""

from __future__ import annotations

import logging
from typing import Protocol

from kworkers.clock import Clock
from kworkers.supervision import Supervisor

log = logging.getLogger("kworkers.consumer")

#: how often the calls under way are judged (a bound is a minute or more at the defaults)
CHECK_S = 0.5
#: the readiness component a slow call degrades
COMPONENT = "handler calls"


class Calls(Protocol):
    """What a runtime tells of its calls (``Runtime.stalled``)."""

    def stalled(self, bound: float) -> str | None: ...


class CallWatch:
    """Judges one runtime's calls against ``slow`` (readiness) and ``hung`` (health)."""

    def __init__(self, calls: Calls, supervisor: Supervisor, slow: float | None,
                 hung: float | None, clock: Clock, every: float = CHECK_S,
                 what: str = "handler") -> None:
        self.calls = calls
        self.supervisor = supervisor
        self.slow = slow
        self.hung = hung
        self.clock = clock
        self.every = every
        #: the component a hung call fails (the poll thread itself, for inline handlers)
        self.what = what
        self._last = float("-inf")

    def check(self) -> None:
        now = self.clock.monotonic()
        if now - self._last < self.every:
            return
        self._last = now
        sup, hung, slow = self.supervisor, self.hung, self.slow
        if hung is not None:
            stuck = self.calls.stalled(hung)
            if stuck is not None:
                sup.fail(self.what, f"{stuck} (bound {hung:.0f}s)")
                return
        found = self.calls.stalled(slow) if slow is not None else None
        if found is None:
            if COMPONENT in sup.degraded:
                sup.recover(COMPONENT)
            return
        why = found if hung is None else f"{found}; the worker stops past {hung:.0f}s"
        # one line per slow call: both poll loops judge the one runtime, on their own threads,
        # so the test and the set are one step (checked apart, both logged once under load)
        if sup.degrade(COMPONENT, why):
            log.error("a handler call runs on: %s", why)
