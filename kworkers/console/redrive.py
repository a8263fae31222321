"""The Redrive pages' two steps: a dry-run plan, then the redrive it confirms.

Both call ``kworkers.dlq.redrive``, never a copy of it: the plan is its ``plan`` function on
the DLQ and ledger it reads (``read_dlq``, ``read_ledger``), and the confirmed run is
``redrive`` itself, the same transactional, idempotent replay as ``kworkers dlq redrive``: a
dead letter already in the ledger is skipped, so confirming twice replays nothing twice, and
the redrive's target rules apply as they do on the command line: both plan through
``kworkers.dlq.redrive_plan.plan``, so a replay goes to the source the DLQ is named after
(``<source>.dlq``), or to the operator's explicit ``to``, and a dead letter whose recorded origin
disagrees is refused with the reason (shown on the plan page and the job page), never replayed.

The plan pins the end of the DLQ it read (``ConsoleFilter.upto``), so the confirmed redrive
replays nothing that arrived after the operator read the plan.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from kworkers.console.dlq_filter import ConsoleFilter
from kworkers.dlq.audit import Actor
from kworkers.dlq.ledger import read_ledger
from kworkers.dlq.reader import read_dlq
from kworkers.dlq.record import DeadLetter
from kworkers.dlq.redrive import Progress, RedriveSummary, redrive
from kworkers.dlq.redrive_plan import RedrivePlan, Refused, Replay, plan
from kworkers.kafka import clients
from kworkers.kafka.clients import TopicNotFound
from kworkers.kafka.settings import ClientSettings

#: The plan page lists at most this many replays (the counts cover them all).
PLAN_ROWS = 200


@dataclass(frozen=True)
class Plan:
    """A dry run: what a redrive with ``filter`` (pinned) would select, skip, refuse and
    replay (``chosen``: the redrive's own plan)."""

    dlq: str
    filter: ConsoleFilter
    target: str | None
    read: int
    unreadable: int
    chosen: RedrivePlan

    @property
    def selected(self) -> list[DeadLetter]:
        return self.chosen.selected

    @property
    def todo(self) -> list[Replay]:
        return self.chosen.todo

    @property
    def refused(self) -> list[Refused]:
        return self.chosen.refused

    @property
    def skipped_already(self) -> int:
        return self.chosen.skipped_already

    @property
    def targets(self) -> dict[str, int]:
        return dict(sorted(Counter(r.topic for r in self.todo).items()))


def pinned(flt: ConsoleFilter, ends: dict[int, int]) -> ConsoleFilter:
    """``flt`` limited to what a read saw (a filter that is already pinned stays as it is)."""
    if flt.upto is not None:
        return flt
    return replace(flt, upto=tuple(sorted(ends.items())))


def plan_redrive(client: ClientSettings, dlq: str, flt: ConsoleFilter,
                 target: str | None) -> Plan:
    """The dry run: reads the whole DLQ and its ledger, as the redrive itself does."""
    have = clients.list_topics(client)
    if dlq not in have:
        raise TopicNotFound(dlq, client.bootstrap_servers, "is the DLQ name <topic>.dlq?")
    contents = read_dlq(client, dlq)
    ends: dict[int, int] = {}
    for d in contents.dead_letters:
        ends[d.dlq_partition] = max(ends.get(d.dlq_partition, 0), d.dlq_offset + 1)
    for m, _why in contents.unreadable:
        ends[m.partition] = max(ends.get(m.partition, 0), m.offset + 1)
    flt = pinned(flt, ends)
    chosen = plan(dlq, contents.dead_letters, flt, read_ledger(client, dlq), target, have)
    return Plan(dlq, flt, target, len(contents.dead_letters) + len(contents.unreadable),
                len(contents.unreadable), chosen)


def run_redrive(client: ClientSettings, dlq: str, flt: ConsoleFilter, target: str | None,
                progress: Progress, actor: Actor, selection: str) -> RedriveSummary:
    """The confirmed redrive: ``kworkers.dlq.redrive.redrive``, as ``kworkers dlq redrive``,
    audited in the operator's name (``kworkers.dlq.audit``)."""
    return redrive(client, dlq, target, flt, dry_run=False, progress=progress, actor=actor,
                   selection=selection)
