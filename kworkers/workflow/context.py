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

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kworkers.idempotency.store import SqlConnection
from kworkers.workflow.codec import decode_json
from kworkers.workflow.definition import Kind

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

    __slots__ = ("_effects", "activity_id", "attempt", "cause", "input", "kind", "results",
                 "traceparent", "workflow", "workflow_id")

    def __init__(self, *, workflow_id: str, workflow: str, activity_id: str, kind: Kind,
                 attempt: int, input: Any, results: Results, cause: str | None,
                 traceparent: str | None) -> None:
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
