"""What a step function is given: its run, its earlier results, and the way to write once.

    def index(ctx: StepContext) -> dict:
        vector = ctx.result("embed")["vector"]            # an earlier step's result
        ctx.apply_once(lambda conn: conn.execute(          # in the checkpoint's transaction
            "INSERT INTO search_index (doc, vector) VALUES (?, ?)", (ctx.input["doc"], ...)))
        charge_api.charge(..., idempotency_key=ctx.idempotency_key)  # external: pass the key
        return {"indexed": True}                            # this step's result (JSON)

Two kinds of effect, two guarantees. An effect written with ``apply_once`` runs inside the
transaction that checkpoints the step (result, done-mark, next activity), so it commits exactly
once or not at all. Anything else the step does (an HTTP call, a payment API) happens at least
once: a worker may die after it and before the checkpoint, and the step runs again. Pass
``ctx.idempotency_key`` (``<workflow_id>/<activity_id>``, the same on every attempt) to such a
service, so it can recognise the repeat.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any

from kworkers.idempotency.store import SqlConnection
from kworkers.workflow.codec import decode_json
from kworkers.workflow.definition import FINISH
from kworkers.workflow.kind import Kind

__all__ = ["Results", "StepContext"]

Effect = Callable[[SqlConnection], object]


class Results(Mapping[str, Any]):
    """The run's completed step results by activity id, decoded on first access (a corrupt
    row fails the step that reads it, not every step of the run)."""

    def __init__(self, raw: Mapping[str, str | None], workflow_id: str) -> None:
        self._raw = dict(raw)
        self._decoded: dict[str, Any] = {}
        self._workflow_id = workflow_id

    def __getitem__(self, activity_id: str) -> Any:
        if activity_id not in self._decoded:
            if activity_id not in self._raw:
                done = ", ".join(sorted(self._raw)) or "none"
                raise KeyError(f"run {self._workflow_id!r} has no completed step "
                               f"{activity_id!r} (completed: {done})")
            self._decoded[activity_id] = decode_json(
                self._raw[activity_id], f"result of step {activity_id!r} of run "
                f"{self._workflow_id!r}")
        return self._decoded[activity_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


class StepContext:
    """One attempt of one activity (a step, or a compensation) of one run."""

    __slots__ = ("_effects", "_now", "activity_id", "attempt", "cause", "goto_step", "input",
                 "kind", "results", "signal", "traceparent", "wait_signal", "wake_at",
                 "workflow", "workflow_id")

    def __init__(self, *, workflow_id: str, workflow: str, activity_id: str, kind: Kind,
                 attempt: int, input: Any, results: Results, cause: str | None,
                 traceparent: str | None, now: Callable[[], float] = time.time,
                 signal: Any = None) -> None:
        self.workflow_id = workflow_id
        self.workflow = workflow
        self.activity_id = activity_id
        self.kind = kind
        #: the record's attempt (1 on first delivery; +1 per retry)
        self.attempt = attempt
        self.input = input
        self.results = results
        #: for a compensation: why the run is unwinding (the step failure)
        self.cause = cause
        self.traceparent = traceparent
        self._effects: list[Effect] = []
        self._now = now
        #: what this attempt asked for, applied only if it checkpoints (see ``sleep``, ``goto``)
        self.wake_at: float | None = None
        self.goto_step: str | None = None
        self.wait_signal: str | None = None
        #: the payload of the signal this step waited for (``wait_for_signal`` in the step
        #: before), None when it waited for none
        self.signal = signal

    @property
    def idempotency_key(self) -> str:
        """``<workflow_id>/<activity_id>``: stable across attempts; give it to external
        services so a repeated call is recognised as one."""
        return f"{self.workflow_id}/{self.activity_id}"

    def result(self, step: str) -> Any:
        """The result of the completed step ``step`` (its activity id)."""
        return self.results[step]

    def apply_once(self, effect: Effect) -> None:
        """Run ``effect(conn)`` in the transaction that checkpoints this activity: it commits
        exactly once with the step's result, or not at all (the step raised, or the worker
        died first). Effects run in the order given, after the step function returned."""
        if not callable(effect):
            raise TypeError("apply_once takes a function of one SQL connection")
        self._effects.append(effect)

    def effects(self) -> tuple[Effect, ...]:
        return tuple(self._effects)

    # -- what comes next: timers and branches, checkpointed with the step ----------------------

    def sleep(self, seconds: float) -> None:
        """Make the next activity due ``seconds`` from now: a durable timer.

        The step still returns and checkpoints as usual; its successor's record waits in the
        outbox table (``not_before``) until it is due, and the run's ``wake_at`` says until
        when. Nothing waits in memory: no thread, lease or connection is held, and a crash or a
        restart during the wait changes nothing. Never early: no relay claims the row before
        its time, and a record that arrives before ``wake_at`` anyway is put back, not run.
        The last call wins; in the last step (no successor) it delays nothing."""
        if not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"sleep takes a finite number of seconds >= 0, got {seconds!r}")
        self.wake_at = self._now() + float(seconds)

    def sleep_until(self, when: float | datetime) -> None:
        """``sleep`` until ``when``: epoch seconds, or a timezone-aware ``datetime``. A time
        already past makes the next activity due at once."""
        if isinstance(when, datetime):
            if when.tzinfo is None:
                raise ValueError("sleep_until takes a timezone-aware datetime (or epoch "
                                 f"seconds), got the naive {when.isoformat()}")
            t = when.timestamp()
        elif isinstance(when, int | float) and math.isfinite(when):
            t = float(when)
        else:
            raise ValueError(f"sleep_until takes epoch seconds or a datetime, got {when!r}")
        self.wake_at = max(t, self._now())

    def wait_for_signal(self, name: str, *, timeout: float) -> None:
        """Make the next activity wait for the signal ``name`` (``Engine.signal``,
        ``kworkers workflow signal``), at most ``timeout`` seconds; it reads the payload as
        ``ctx.signal``.

        Like ``sleep``, the wait is rows, not a thread: a signal is kept in the store whenever
        it is sent (before the wait too), and sending one writes the waiting step's record to
        the outbox in the same transaction. A timeout is a failure of the waiting step
        (``SignalTimeout``, retryable: the worker's retry policy decides, then the
        compensations of the completed steps run)."""
        from kworkers.workflow.definition import check_name

        check_name(name, "signal name")
        self.sleep(timeout)
        self.wait_signal = name

    def goto(self, step: str) -> None:
        """Branch: run the step with activity id ``step`` (a *later* one) after this one,
        instead of the next in the list. The choice commits with this step's checkpoint, so a
        redelivery or a crash cannot make the run take another path. Steps jumped over do not
        run and are not compensated. An unknown or earlier step fails this step for good."""
        if not isinstance(step, str) or not step:
            raise ValueError(f"goto takes a step's activity id, got {step!r}")
        self.goto_step = step

    def finish(self) -> None:
        """Branch to the end: the run completes after this step."""
        self.goto_step = FINISH
