"""Dead letters: reading DLQ records back and choosing which to redrive (pure logic)."""

from kworkers.dlq.record import DeadLetter
from kworkers.dlq.redrive_plan import RedriveFilter

__all__ = ["DeadLetter", "RedriveFilter"]
