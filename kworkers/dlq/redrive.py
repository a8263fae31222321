"""Redrive: replay dead letters to their topic, each exactly once, even across a crash.

Why a ledger and a transaction: an operator reruns a redrive that failed half-way (or runs the
same one twice by mistake), and every replay is a new attempt of real work. So each dead letter
that was replayed is written down in a compacted ledger topic, ``<dlq>.redriven``, keyed by
``"<dlq-topic>/<partition>/<offset>"``, and the replay and its ledger marker are produced in
one Kafka transaction:

1. ``init_transactions`` with ``transactional.id = kworkers-redrive-<dlq>``. This fences any
   other redrive of the same DLQ still running and aborts the transaction a crashed one left
   open, so what follows sees a settled ledger.
2. Pin the DLQ's end (``reader.watermarks``), and read the ledger (``read_committed``) to its
   end as one bit per DLQ offset (``replayed.ReplayedOffsets``).
3. Read the DLQ once, in chunks (``sweep``); each selected dead letter not in the ledger goes
   to the ``replayer``, which commits them in batches: begin; produce each replay (the
   original key and value, ``redrive_headers``: attempt 1 and ``kw-redrive-of``) and its
   marker; commit.

A crash before a commit aborts replays and markers together: the workers consume with
``isolation.level=read_committed`` (librdkafka's default), so an aborted replay is never
handled, and the rerun replays those dead letters again. After a commit both are visible, and
the rerun skips them. Two redrives of one DLQ at once cannot both win: the second's
``init_transactions`` fences the first, whose next commit fails.

A replay to its original topic goes to its original partition, not wherever this producer's
partitioner would put the key: librdkafka's default partitioner is not Java's, and the key's
other records (and its order) live on the original partition.

Memory is bounded whatever the DLQ's size (issue #50; before it the DLQ, the ledger's keys
and every replay were held at once): a chunk of 500 records and librdkafka's read-ahead (a
thousand records a partition, at most 8 MiB of values), one bit per DLQ offset for the ledger
(125 KB a million dead letters), one batch of 500 replays, and the summary's counts with a
sample of ``SAMPLE`` (200) replays and refusals (``sweep``).

Every redrive that is not a dry run is also written down for people: who started it, through
what, when, which selection, and how it ended, in ``<dlq>.audit`` (``kworkers.dlq.audit``),
by the same transactional producer, before the first replay and after the last commit.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from kworkers.dlq.audit import (
    Actor,
    AuditRun,
    describe_filter,
    end_entry,
    new_run,
    runs,
    start_entry,
)
from kworkers.dlq.redrive_plan import RedriveFilter, Refused, Replay, check_target, ledger_key
from kworkers.dlq.replayed import read_replayed
from kworkers.dlq.replayer import (
    BATCH_SIZE,
    CRASH_AFTER_ENV,
    CRASH_EXIT_CODE,
    RedriveError,
    Replayer,
)
from kworkers.dlq.sweep import SAMPLE, Progress, Tally, sweep
from kworkers.errors import ConfigError, TransactionAborted, TransactionFailed
from kworkers.kafka import clients
from kworkers.kafka.admin import create_topics
from kworkers.kafka.reader import scan, watermarks
from kworkers.kafka.settings import ClientSettings, as_client
from kworkers.kafka.transactions import Transactions
from kworkers.topic_names import audit_topic, check_dlq, ledger_topic
from kworkers.topic_plan import TopicSpec

__all__ = ["BATCH_SIZE", "CRASH_AFTER_ENV", "CRASH_EXIT_CODE", "SAMPLE", "Progress",
           "RedriveError", "RedriveSummary", "read_audit", "redrive", "transactional_id"]


def transactional_id(dlq: str) -> str:
    return f"kworkers-redrive-{dlq}"


@dataclass(frozen=True)
class RedriveSummary:
    """What a redrive did. ``selected`` = matched the filter; of those, ``skipped_already``
    were in the ledger, ``refused_total`` have no trustworthy default target (see
    ``redrive_plan.redrive_target``) and ``redriven`` were replayed now (or would be, in a
    dry run: ``pending``). ``unreadable`` DLQ records are not kworkers dead letters and were
    left. ``replays`` and ``refusals`` are samples: the first ``SAMPLE`` of each, in DLQ order
    per partition (a redrive of a million keeps counts, not a million items)."""

    dlq: str
    selected: int
    redriven: int
    skipped_already: int
    pending: int
    dry_run: bool
    unreadable: int = 0
    targets: dict[str, int] = field(default_factory=dict)
    #: the first ``SAMPLE`` refused, with the reason
    refusals: tuple[Refused, ...] = ()
    #: the first ``SAMPLE`` replayed (or that would be, in a dry run)
    replays: tuple[Replay, ...] = ()
    refused_total: int = 0
    #: DLQ records read, and the end each partition was read to
    read: int = 0
    ends: tuple[tuple[int, int], ...] = ()

    @property
    def refused(self) -> tuple[tuple[str, str], ...]:
        """(ledger key, reason) of the sampled refusals."""
        return tuple((ledger_key(r.dead), r.reason) for r in self.refusals)

    def line(self) -> str:
        """The summary line the CLI ends with (stable: scripts parse it; ``refused=N`` only
        when some were)."""
        text = (f"redriven={self.redriven} skipped_already={self.skipped_already} "
                f"selected={self.selected}")
        if self.refused_total:
            text += f" refused={self.refused_total}"
        if self.dry_run:
            text += f" would_redrive={self.pending} (dry run: nothing was produced)"
        return text

    @classmethod
    def of(cls, dlq: str, tally: Tally, dry_run: bool, redriven: int,
           ends: Mapping[int, int]) -> RedriveSummary:
        return cls(dlq, tally.selected, redriven, tally.skipped_already,
                   tally.todo if dry_run else tally.todo - redriven, dry_run, tally.unreadable,
                   dict(tally.targets), tuple(tally.refusals), tuple(tally.replays),
                   tally.refused, tally.read, tuple(sorted(ends.items())))


def redrive(
    client: ClientSettings | str,
    dlq: str,
    target: str | None = None,
    filter: RedriveFilter | None = None,
    dry_run: bool = False,
    rate: float | None = None,
    progress: Progress | None = None,
    *,
    batch_size: int = BATCH_SIZE,
    crash_after: int | None = None,
    actor: Actor | None = None,
    selection: str | None = None,
) -> RedriveSummary:
    """Replay the dead letters of ``dlq`` that ``filter`` selects and no redrive replayed yet.

    ``target``: the topic to replay to (default: the source ``dlq`` is the DLQ of; a dead letter
    whose recorded origin disagrees is then refused, see ``redrive_plan.redrive_target``).
    ``rate``: at most this many replays per second. ``crash_after`` (tests only; also read
    from ``KWORKERS_REDRIVE_CRASH_AFTER``): SIGKILL the process after producing that many
    replays inside an open transaction, to prove a crash is harmless. ``actor``:
    who the audit names (default: this process's OS user, through ``api``); ``selection``:
    the selection in the audit's words (default: ``filter`` and ``target`` described).
    """
    flt = filter or RedriveFilter()
    check_dlq(dlq)  # before anything is created: a tier or a source is never "redriven"
    if rate is not None and rate <= 0:
        raise ConfigError(f"rate must be > 0, got {rate}")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if target is not None:
        check_target(target)
    if crash_after is None and os.environ.get(CRASH_AFTER_ENV):
        crash_after = int(os.environ[CRASH_AFTER_ENV])
    settings = as_client(client)
    where = settings.bootstrap_servers
    have = clients.list_topics(settings)
    if dlq not in have:
        raise ConfigError(f"DLQ topic {dlq!r} does not exist on {where}")
    if target is not None and target not in have:
        raise ConfigError(f"redrive target topic {target!r} does not exist on {where}")

    txn: Transactions | None = None
    who = actor or Actor.of_process("api")
    run = new_run()
    if not dry_run:
        # one partition is plenty for each (a key per dead letter ever replayed; two records
        # per redrive); the broker's default replication, as for any topic an operator tool
        # creates in production; compacted with unique keys, so nothing expires
        create_topics(clients.admin(settings), [
            TopicSpec(name, partitions=1, replication_factor=-1,
                      config={"cleanup.policy": "compact"})
            for name in (ledger_topic(dlq), audit_topic(dlq)) if name not in have])
        # its transaction timeout (30 s) is short enough that a crashed redrive nobody reruns
        # does not hold back read_committed consumers for long; a batch takes far less
        txn = Transactions(settings, transactional_id(dlq))
        # before reading the ledger: aborts a crashed run's open transaction and fences a
        # concurrent run, so the ledger we read is final for as long as we hold the id
        try:
            txn.init()
            _audit(txn, dlq, start_entry(run, who, dlq, selection or describe_filter(
                flt, target), target, time.time()))
        except (TransactionAborted, TransactionFailed) as exc:
            raise RedriveError(f"redrive of {dlq} could not start its transaction: {exc}"
                               ) from None

    spans = watermarks(settings, dlq)  # the end is pinned: later dead letters wait
    done = read_replayed(settings, dlq, spans)
    ends = {p: hi for p, (_lo, hi) in spans.items()}
    total = sum(max(0, hi - lo) for lo, hi in spans.values())
    if dry_run:
        tally = sweep(settings, dlq, flt, target, have, spans, done, None, progress)
        if progress is not None:
            progress(total, total)
        return RedriveSummary.of(dlq, tally, True, 0, ends)
    assert txn is not None
    replayer = Replayer(txn, dlq, batch_size, rate, crash_after)
    try:
        tally = sweep(settings, dlq, flt, target, have, spans, done, replayer.add, progress)
        replayer.finish()
    except RedriveError as exc:
        # a fenced producer cannot write it: the audit then shows a run that never ended
        with contextlib.suppress(TransactionAborted, TransactionFailed):
            _audit(txn, dlq, end_entry(run, who, time.time(), None, str(exc)))
        raise
    if progress is not None:
        progress(total, total)
    summary = RedriveSummary.of(dlq, tally, False, replayer.committed, ends)
    try:
        _audit(txn, dlq, end_entry(run, who, time.time(), summary.line()))
    except (TransactionAborted, TransactionFailed) as exc:
        raise RedriveError(f"redrive of {dlq} replayed {summary.redriven} but could not write "
                           f"its audit entry: {exc}") from None
    return summary


def _audit(txn: Transactions, dlq: str, entry: tuple[bytes, bytes]) -> None:
    """One audit entry in a transaction of its own (``kworkers.dlq.audit``)."""
    key, value = entry
    txn.begin()
    txn.produce(audit_topic(dlq), key, value)
    txn.commit()


def read_audit(client: ClientSettings | str, dlq: str) -> list[AuditRun]:
    """Every redrive of ``dlq`` the audit topic records, newest first (none without it)."""
    name = audit_topic(dlq)
    if name not in clients.list_topics(client):
        return []
    return runs((m.key, m.value) for m in scan(client, name).messages)
