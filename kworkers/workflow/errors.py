"""What the workflow engine raises, placed in kworkers' error tree.

Why these bases: an error in a *record* (it names a run the store does not know, a definition
this worker lacks, or its value is not an activity record) can never succeed on a retry, so it
is non-retryable and goes to the DLQ at once with its reason; an error in a *call* (a bad
definition, starting a run with an id that names another run) is a ``ConfigError`` raised to
the caller before anything is written::

    KworkersError
    ├── ConfigError                 bad definition, start conflict, unknown workflow name
    └── ActivityFailure
        └── NonRetryableError
            ├── DecodeError         a record or a stored result that cannot be decoded
            ├── UnknownRun          a record names a workflow id the store does not know
            ├── VersionMismatch     the run started under a definition this worker lacks
            └── ResultError         a step result that cannot be checkpointed (not JSON,
                                    over the size limit): the step fails for good
"""

from __future__ import annotations

from kworkers.errors import NonRetryableError, RetryableError


class UnknownRun(NonRetryableError):
    def __init__(self, workflow_id: str) -> None:
        super().__init__("UnknownWorkflow", f"no workflow run {workflow_id!r} in the store "
                         "(started against another store or tables, or deleted)")
        self.workflow_id = workflow_id


class VersionMismatch(NonRetryableError):
    def __init__(self, workflow_id: str, workflow: str, version: str,
                 known: tuple[str, ...]) -> None:
        have = ", ".join(known) if known else "none"
        super().__init__(
            "WorkflowVersionMismatch",
            f"run {workflow_id!r} started under {workflow!r} version {version!r}; this worker "
            f"has version(s) {have}: deploy a worker that still registers version {version!r} "
            "and redrive this record")
        self.workflow_id = workflow_id
        self.version = version


class ResultError(NonRetryableError):
    """``type`` is ``ResultTooLarge`` or ``ResultNotSerializable``."""


class SignalTimeout(RetryableError):
    """The signal a step waited for did not come in time (``ctx.wait_for_signal``)."""

    def __init__(self, workflow_id: str, activity_id: str, name: str, waited_s: float) -> None:
        super().__init__("SignalTimeout", f"run {workflow_id!r}: step {activity_id!r} waited "
                         f"{waited_s:.1f}s for signal {name!r}, none came")


class StepOverran(TimeoutError):
    """A step returned after the worker's ``message_timeout``: the loop has routed its record
    as a ``TimeoutError`` already, so the engine records the attempt as failed (and does not
    checkpoint it) to stay in step with the loop."""

    def __init__(self, workflow_id: str, activity_id: str, took_s: float,
                 deadline_s: float) -> None:
        super().__init__(f"run {workflow_id!r}: step {activity_id!r} took {took_s:.2f}s, past "
                         f"the worker's message_timeout of {deadline_s:g}s")
