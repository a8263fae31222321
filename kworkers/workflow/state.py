"""Where a run goes next: the workflow state machine, pure.

A run always has at most one pending activity; its state says which::

    start ─▶ running(step 0) ─ok─▶ running(step 1) ─ok─▶ ... ─ok─▶ completed
                 │ fails for good
                 ├── a saga (some step has a compensation):
                 │      compensating(undo of the last completed compensable step)
                 │        ─ok─▶ compensating(the next one down) ─ok─▶ ... ─▶ compensated
                 │        (no completed step to undo: compensated at once)
                 │        └ a compensation fails for good ─▶ failed  (record to the DLQ)
                 └── no compensations at all (a pipeline) ─▶ failed  (record to the DLQ)

    failed(activity a) ─ redrive of a's record succeeds ─▶ as if a had succeeded

Branches and timers are part of the transition, so they are checkpointed with it: a step that
chose its successor (``ctx.goto(step)``, forward only, or ``ctx.finish()``) or asked to sleep
(``ctx.sleep``) passes that to ``on_success``, and the state it returns (the chosen pending
activity, its ``wake_at``) commits with the step's result. A redelivery of that step is then
not pending and is skipped: a replay cannot take the other branch. Only *completed* steps are
compensated (``done``), so a branch not taken is never undone.

"Fails for good" is the retry policy's verdict (non-retryable, or the attempts are used up),
the same one that sends any other handler's record to the DLQ. Only *completed* steps are
compensated, in reverse order; the step that failed did not commit its in-store effect.
A failed run keeps its pending activity, so redriving that activity's dead letter resumes the
run where it stopped (``failed`` is the end of what the engine does on its own, not of the run).

The transitions are pure functions of the definition and the state, so every path is checked
in unit tests without a broker or a database.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Literal

from kworkers.workflow.definition import Definition
from kworkers.workflow.kind import Kind

__all__ = ["ACTIVE", "RunState", "Status", "Transition", "initial", "on_failure", "on_success"]

Status = Literal["running", "completed", "compensating", "compensated", "failed"]
#: states with a pending activity
ACTIVE: tuple[Status, ...] = ("running", "compensating", "failed")
STATUSES: tuple[Status, ...] = ("running", "completed", "compensating", "compensated", "failed")


@dataclass(frozen=True)
class RunState:
    """``activity`` is the pending activity (None once completed or compensated), of ``kind``
    at step ``position``. ``error``: why the run is ``failed``. ``cause``: why it is unwinding
    (the step failure that started the compensations), kept to the end of the run."""

    status: Status
    activity: str | None
    kind: Kind
    position: int
    error: str | None = None
    cause: str | None = None
    #: the pending activity is not to run before this (epoch seconds): a durable timer; with
    #: ``signal``, the wait's deadline (its step then fails with ``SignalTimeout``)
    wake_at: float | None = None
    #: the pending activity waits for the signal of this name (``ctx.wait_for_signal``)
    signal: str | None = None

    def pending(self, activity_id: str) -> bool:
        """True when ``activity_id`` is what this run waits for (a record to act on)."""
        return self.status in ACTIVE and self.activity == activity_id


@dataclass(frozen=True)
class Transition:
    state: RunState
    #: the activity to hand to the next worker (in the checkpoint's transaction), or None
    dispatch: str | None
    #: the failed record goes to the DLQ: the run cannot go on without an operator
    dead_letter: bool = False


def initial(d: Definition) -> RunState:
    return RunState("running", d.activity_id(0), "step", 0)


def _compensating(d: Definition, below: int, cause: str | None,
                  done: Collection[str] | None) -> Transition:
    pos = d.last_compensable(below, done)
    if pos is None:
        return Transition(RunState("compensated", None, "compensation", 0, cause=cause), None)
    cid = d.compensation_id(pos)
    return Transition(RunState("compensating", cid, "compensation", pos, cause=cause), cid)


def on_success(d: Definition, s: RunState, *, goto: str | None = None,
               wake_at: float | None = None, signal: str | None = None,
               done: Collection[str] | None = None) -> Transition:
    """The pending activity of ``s`` completed (also from ``failed``, after a redrive).

    ``goto``: the activity id of a *later* step to run next (``FINISH``: none, the run
    completes), instead of the next in the list. ``wake_at``: the next activity is not to run
    before then; with ``signal``, it waits for that signal, ``wake_at`` its deadline.
    ``done``: the completed activity ids (a compensation's successor is the next
    completed compensable step down; None: every step below counts as completed)."""
    if s.status not in ACTIVE or s.activity is None:
        raise ValueError(f"a {s.status} run has no pending activity to complete")
    if s.kind == "step":
        nxt = s.position + 1 if goto is None else d.goto_position(s.position, goto)
        if nxt >= len(d.steps):
            return Transition(RunState("completed", None, "step", s.position), None)
        aid = d.activity_id(nxt)
        return Transition(RunState("running", aid, "step", nxt, wake_at=wake_at,
                                   signal=signal), aid)
    t = _compensating(d, s.position, s.cause, done)
    if (wake_at is None and signal is None) or t.dispatch is None:
        return t
    return replace(t, state=replace(t.state, wake_at=wake_at, signal=signal))


def on_failure(d: Definition, s: RunState, error: str,
               done: Collection[str] | None = None) -> Transition:
    """The pending activity of ``s`` failed for good with ``error`` (``done``: as for
    ``on_success``; only completed steps are compensated)."""
    if s.status not in ACTIVE or s.activity is None:
        raise ValueError(f"a {s.status} run has no pending activity to fail")
    s = replace(s, wake_at=None, signal=None)
    if s.kind == "step":
        why = f"step {s.activity!r} failed: {error}"
        if d.is_saga:
            return _compensating(d, s.position, why, done)
        return Transition(replace(s, status="failed", error=why), None, dead_letter=True)
    why = f"compensation {s.activity!r} failed: {error}"
    return Transition(replace(s, status="failed", error=why), None, dead_letter=True)
