"""The Redrive pages' two steps: a dry-run plan, then the redrive it confirms.

Both are ``kworkers.dlq.redrive.redrive``, never a copy of it: the plan is its dry run (one
pass over the DLQ, ``kworkers.dlq.sweep``, in the same bounded memory, keeping counts and the
first rows), and the confirmed run is ``redrive`` itself, the same transactional, idempotent
replay as ``kworkers dlq redrive``: a dead letter already in the ledger is skipped, so
confirming twice replays nothing twice, and the redrive's target rules apply as they do on the
command line: both decide through ``kworkers.dlq.redrive_plan.decide``, so a replay goes to
the source the DLQ is named after (``<source>.dlq``), or to the operator's explicit ``to``, and
a dead letter whose recorded origin disagrees is refused with the reason (shown on the plan page
and the job page), never replayed.

The plan pins the end of the DLQ it read (``ConsoleFilter.upto``), so the confirmed redrive
replays nothing that arrived after the operator read the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kworkers.console.dlq_filter import ConsoleFilter
from kworkers.dlq.audit import Actor
from kworkers.dlq.redrive import SAMPLE, Progress, RedriveSummary, redrive
from kworkers.dlq.redrive_plan import Refused, Replay
from kworkers.kafka import clients
from kworkers.kafka.clients import TopicNotFound
from kworkers.kafka.settings import ClientSettings

#: The plan page lists at most this many replays (the counts cover them all): the dry run's
#: sample.
PLAN_ROWS = SAMPLE


@dataclass(frozen=True)
class Plan:
    """A dry run: what a redrive with ``filter`` (pinned) would select, skip, refuse and
    replay (``summary``: the redrive's own dry run)."""

    dlq: str
    filter: ConsoleFilter
    target: str | None
    summary: RedriveSummary

    @property
    def read(self) -> int:
        return self.summary.read

    @property
    def unreadable(self) -> int:
        return self.summary.unreadable

    @property
    def selected(self) -> int:
        return self.summary.selected

    @property
    def pending(self) -> int:
        return self.summary.pending

    @property
    def rows(self) -> tuple[Replay, ...]:
        """The first ``PLAN_ROWS`` replays."""
        return self.summary.replays

    @property
    def refused(self) -> tuple[Refused, ...]:
        """The first ``PLAN_ROWS`` refused (``refused_total`` counts them all)."""
        return self.summary.refusals

    @property
    def refused_total(self) -> int:
        return self.summary.refused_total

    @property
    def skipped_already(self) -> int:
        return self.summary.skipped_already

    @property
    def targets(self) -> dict[str, int]:
        return dict(sorted(self.summary.targets.items()))


def pinned(flt: ConsoleFilter, ends: dict[int, int]) -> ConsoleFilter:
    """``flt`` limited to what a read saw (a filter that is already pinned stays as it is)."""
    if flt.upto is not None:
        return flt
    return replace(flt, upto=tuple(sorted(ends.items())))


def plan_redrive(client: ClientSettings, dlq: str, flt: ConsoleFilter,
                 target: str | None) -> Plan:
    """The dry run: one pass over the DLQ and its ledger, as the redrive itself makes."""
    if dlq not in clients.list_topics(client):
        raise TopicNotFound(dlq, client.bootstrap_servers, "is the DLQ name <topic>.dlq?")
    got = redrive(client, dlq, target, flt, dry_run=True)
    return Plan(dlq, pinned(flt, dict(got.ends)), target, got)


def run_redrive(client: ClientSettings, dlq: str, flt: ConsoleFilter, target: str | None,
                progress: Progress, actor: Actor, selection: str) -> RedriveSummary:
    """The confirmed redrive: ``kworkers.dlq.redrive.redrive``, as ``kworkers dlq redrive``,
    audited in the operator's name (``kworkers.dlq.audit``)."""
    return redrive(client, dlq, target, flt, dry_run=False, progress=progress, actor=actor,
                   selection=selection)
