"""The ``kworkers`` command with a broken durable timer: the canary of
``tests/faults/test_workflow_waits_faults.py``. ``StepContext.sleep`` makes the next activity
due after a tenth of the time asked (the run's ``wake_at`` and the outbox row's ``not_before``
alike), so a live worker runs it early.

    python -m tests.apps.early_timer run examples.approval.app:worker -b HOST:PORT
"""

from __future__ import annotations

from kworkers.cli.main import main
from kworkers.workflow.context import StepContext


def _early() -> None:
    real = StepContext.sleep

    def early(self: StepContext, seconds: float) -> None:
        real(self, seconds / 10)

    StepContext.sleep = early  # type: ignore[method-assign]


if __name__ == "__main__":
    _early()
    main()
