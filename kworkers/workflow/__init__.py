"""Durable workflows on Kafka: chained activities that resume after a crash, and sagas.

A workflow is an ordered list of steps (plain or ``async def`` functions of a ``StepContext``),
each run as an activity delivered over Kafka with the key ``<workflow_id>/<activity_id>`` by an
ordinary ``Worker``. A step's result is checkpointed in the idempotency store together with the
next activity's outbox record, so a crash between steps neither loses nor repeats a step. A
step may declare a compensation; when a later step fails for good, the compensations of the
completed steps run in reverse order, each a retried activity of its own.

    from kworkers.workflow import Engine, StepContext, Workflow

See ``docs/WORKFLOWS.md`` for the guarantees and what this does not do compared with Temporal.
"""

from kworkers.workflow.context import StepContext
from kworkers.workflow.definition import Definition, Step, Workflow
from kworkers.workflow.engine import Engine, Started
from kworkers.workflow.errors import ResultError, SignalTimeout, UnknownRun, VersionMismatch
from kworkers.workflow.state import RunState, Status
from kworkers.workflow.tables import RunRow, RunTables, StepRow

__all__ = [
    "Definition",
    "Engine",
    "ResultError",
    "RunRow",
    "RunState",
    "RunTables",
    "SignalTimeout",
    "Started",
    "Status",
    "Step",
    "StepContext",
    "StepRow",
    "UnknownRun",
    "VersionMismatch",
    "Workflow",
]
