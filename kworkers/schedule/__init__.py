"""Scheduled records: deliver a record to a configured topic at its due time (docs/SCHEDULING.md).

- ``ladder``: ``ScheduleLadder``, the rungs of coarse delay topics a record climbs down.
- ``headers``: the ``kw-scheduled-*`` headers, written and parsed.
- ``rules``: ``ScheduleRules``, what a rung record must be before it is held or moved.
- ``state``: an id's state in the store (one delivery per id, cancellation).
- ``scheduler``: ``Scheduler``: ``schedule``, ``cancel`` and the scheduler worker.
"""

from kworkers.schedule.ladder import Hop, ScheduleLadder
from kworkers.schedule.rules import ScheduleRules
from kworkers.schedule.scheduler import Scheduled, Scheduler, due_time
from kworkers.schedule.state import ScheduleState, Verdict

__all__ = ["Hop", "ScheduleLadder", "ScheduleRules", "ScheduleState", "Scheduled",
           "Scheduler", "Verdict", "due_time"]
