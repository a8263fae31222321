"""A workflow definition: an ordered list of steps, each with an optional compensation.

Why a list and not replayed code: Temporal re-runs workflow code against its history, which asks
the code to be deterministic. Here the "code" is the step list itself, so the only thing that
must not change under a running workflow is that list. Each definition has a *version*: given
(``Workflow(version=...)``) or a fingerprint of the step list (activity ids and the functions'
qualified names, not their modules). A run records the version it started under and is only
ever advanced by a definition of that version; a worker without it refuses the run's records
(DLQ, with the reason) instead of guessing (see ``docs/WORKFLOWS.md``, "Changing a workflow").

Activity ids: a step's name, and for a step that appears again, ``name.2``, ``name.3``...; the
compensation of activity ``a`` is ``compensate.a``. Names are plain identifiers, so the two
forms never collide and neither contains ``/`` (the idempotency key is ``<workflow_id>/<id>``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

from kworkers.errors import ConfigError, NonRetryableError
from kworkers.workflow.kind import Kind

if TYPE_CHECKING:
    from kworkers.workflow.context import StepContext

__all__ = ["Activity", "Definition", "Step", "StepFn", "Workflow"]

#: a step or a compensation: ``fn(ctx) -> JSON value``, plain or ``async def``
StepFn = Callable[["StepContext"], Any]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,99}")
COMPENSATE = "compensate."
#: the branch target that ends the run (``StepContext.finish``, ``on_success(goto=FINISH)``)
FINISH = ""


def check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"{what} {name!r} must be an identifier (letters, digits, _ or -, "
                          "not starting with a digit, at most 100 characters)")
    return name


def _name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__name__", type(fn).__name__))


def _qualname(fn: Callable[..., Any]) -> str:
    """The function's qualified name *without* its module: a module run as a script is
    ``__main__`` there and ``app`` where it is imported (the CLI, another replica), and a
    fingerprint that changed with that would refuse every run."""
    return str(getattr(fn, "__qualname__", _name(fn)))


@dataclass(frozen=True)
class Step:
    name: str
    fn: StepFn
    compensate: StepFn | None = None


@dataclass(frozen=True)
class Activity:
    """One thing a worker can run for a run: step ``position``, or its compensation."""

    id: str
    kind: Kind
    position: int
    #: the function's name, shown in the history
    name: str
    fn: StepFn


@dataclass(frozen=True)
class Definition:
    """A frozen workflow: what a run of ``name`` at ``version`` does."""

    name: str
    version: str
    steps: tuple[Step, ...]
    _ids: tuple[str, ...] = field(repr=False, compare=False, default=())
    _by_id: dict[str, Activity] = field(repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        check_name(self.name, "workflow name")
        if not self.steps:
            raise ConfigError(f"workflow {self.name!r} has no steps")
        if not self.version or "/" in self.version or len(self.version) > 100:
            raise ConfigError(f"workflow {self.name!r}: version must be 1-100 characters "
                              f"without '/', got {self.version!r}")
        seen: dict[str, int] = {}
        ids = []
        by_id: dict[str, Activity] = {}
        for pos, step in enumerate(self.steps):
            check_name(step.name, "step name")
            n = seen[step.name] = seen.get(step.name, 0) + 1
            aid = step.name if n == 1 else f"{step.name}.{n}"
            ids.append(aid)
            by_id[aid] = Activity(aid, "step", pos, _name(step.fn), step.fn)
            if step.compensate is not None:
                cid = COMPENSATE + aid
                by_id[cid] = Activity(cid, "compensation", pos, _name(step.compensate),
                                      step.compensate)
        object.__setattr__(self, "_ids", tuple(ids))
        object.__setattr__(self, "_by_id", by_id)

    def activity_id(self, position: int) -> str:
        return self._ids[position]

    def compensation_id(self, position: int) -> str:
        return COMPENSATE + self._ids[position]

    def activity(self, activity_id: str) -> Activity | None:
        return self._by_id.get(activity_id)

    @property
    def is_saga(self) -> bool:
        """A workflow with any compensation unwinds on failure; one without stops and waits
        for an operator (its failed record in the DLQ)."""
        return any(s.compensate is not None for s in self.steps)

    def last_compensable(self, below: int, done: Collection[str] | None = None) -> int | None:
        """The highest step position under ``below`` that has a compensation and (when
        ``done``, the completed activity ids, is given) completed; None: none. A branch not
        taken did not complete, so it is not undone."""
        for pos in range(min(below, len(self.steps)) - 1, -1, -1):
            if self.steps[pos].compensate is not None and (
                    done is None or self._ids[pos] in done):
                return pos
        return None

    def goto_position(self, current: int, target: str) -> int:
        """The position a step at ``current`` branches to: ``target`` is a later step's
        activity id, or ``""`` (finish: past the last step). Forward only, so a run's path is
        a subsequence of the list: each step runs at most once and its idempotency key stays
        one activity's."""
        if target == FINISH:
            return len(self.steps)
        if target not in self._ids:
            raise NonRetryableError(
                "UnknownBranch", f"workflow {self.name!r} has no step {target!r} to go to "
                f"(steps: {', '.join(self._ids)})")
        pos = self._ids.index(target)
        if pos <= current:
            raise NonRetryableError(
                "BackwardBranch", f"step {self._ids[current]!r} of workflow {self.name!r} "
                f"cannot go to {target!r}: a branch goes forward, to a later step")
        return pos


def fingerprint(name: str, steps: tuple[Step, ...]) -> str:
    """A version that changes whenever the step list does (ids, functions, compensations)."""
    shape = [name] + [[s.name, _qualname(s.fn), None if s.compensate is None
                       else _qualname(s.compensate)] for s in steps]
    digest = hashlib.sha256(json.dumps(shape).encode("utf-8")).hexdigest()
    return f"sha-{digest[:12]}"


class Workflow:
    """Builds a definition step by step::

        pipeline = Workflow("pipeline")

        @pipeline.step
        def download(ctx): ...

        @pipeline.step(compensate=refund)
        def charge(ctx): ...

        pipeline.add(process)   # a function used as a step again: activity id "process.2"

    The definition freezes when an ``Engine`` registers it; adding a step after that is an
    error (the engine would run another list than the one its runs were started with).
    """

    def __init__(self, name: str, *, version: str | None = None) -> None:
        self.name = check_name(name, "workflow name")
        self._version = version
        self._steps: list[Step] = []
        self._frozen: Definition | None = None

    @overload
    def step(self, fn: StepFn, /, *, name: str | None = None,
             compensate: StepFn | None = None) -> StepFn: ...

    @overload
    def step(self, fn: None = None, /, *, name: str | None = None,
             compensate: StepFn | None = None) -> Callable[[StepFn], StepFn]: ...

    def step(self, fn: StepFn | None = None, /, *, name: str | None = None,
             compensate: StepFn | None = None) -> StepFn | Callable[[StepFn], StepFn]:
        """Decorator: append ``fn`` as the next step (``compensate``: its undo)."""
        if fn is not None:
            self.add(fn, name=name, compensate=compensate)
            return fn

        def deco(f: StepFn) -> StepFn:
            self.add(f, name=name, compensate=compensate)
            return f

        return deco

    def add(self, fn: StepFn, *, name: str | None = None,
            compensate: StepFn | None = None) -> Workflow:
        if self._frozen is not None:
            raise ConfigError(f"workflow {self.name!r} is registered with an engine; its steps "
                              "can no longer change (define a new version instead)")
        if not callable(fn) or (compensate is not None and not callable(compensate)):
            raise ConfigError(f"workflow {self.name!r}: a step and its compensation must be "
                              "functions of one StepContext")
        step_name = check_name(name or _name(fn), "step name")
        self._steps.append(Step(step_name, fn, compensate))
        return self

    def freeze(self) -> Definition:
        if self._frozen is None:
            steps = tuple(self._steps)
            version = self._version or fingerprint(self.name, steps)
            self._frozen = Definition(self.name, version, steps)
        return self._frozen
