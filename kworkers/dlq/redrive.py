"""Redrive: replay dead letters to their topic, each exactly once, even across a crash.

Why a ledger and a transaction: an operator reruns a redrive that failed half-way (or runs the
same one twice by mistake), and every replay is a new attempt of real work. So each dead letter
that was replayed is written down in a compacted ledger topic, ``<dlq>.redriven``, keyed by
``"<dlq-topic>/<partition>/<offset>"``, and the replay and its ledger marker are produced in
one Kafka transaction:

1. ``init_transactions`` with ``transactional.id = kworkers-redrive-<dlq>``. This fences any
   other redrive of the same DLQ still running and aborts the transaction a crashed one left
   open, so what follows sees a settled ledger.
2. Read the ledger (``read_committed``) to its end into a set.
3. For each selected dead letter not in the set, in batches: begin; produce the replay (the
   original key and value, ``redrive_headers``: attempt 1 and ``kw-redrive-of``) and the
   marker; commit.

A crash before a commit aborts replays and markers together: the workers consume with
``isolation.level=read_committed`` (librdkafka's default), so an aborted replay is never
handled, and the rerun replays those dead letters again. After a commit both are visible, and
the rerun skips them. Two redrives of one DLQ at once cannot both win: the second's
``init_transactions`` fences the first, whose next commit fails.

A replay to its original topic goes to its original partition, not wherever this producer's
partitioner would put the key: librdkafka's default partitioner is not Java's, and the key's
other records (and its order) live on the original partition.

Every redrive that is not a dry run is also written down for people: who started it, through
what, when, which selection, and how it ended, in ``<dlq>.audit`` (``kworkers.dlq.audit``),
by the same transactional producer, before the first replay and after the last commit.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from kworkers.dlq.audit import (
    Actor,
    AuditRun,
    describe_filter,
    end_entry,
    new_run,
    runs,
    start_entry,
)
from kworkers.dlq.ledger import read_ledger
from kworkers.dlq.reader import read_dlq
from kworkers.dlq.redrive_plan import RedriveFilter, Replay, check_target, ledger_key, plan
from kworkers.errors import ConfigError, KworkersError, TransactionAborted, TransactionFailed
from kworkers.kafka import clients
from kworkers.kafka.admin import create_topics
from kworkers.kafka.reader import scan
from kworkers.kafka.settings import ClientSettings, as_client
from kworkers.kafka.transactions import Transactions
from kworkers.message import Message
from kworkers.retry_tiers.headers import redrive_headers
from kworkers.topic_names import audit_topic, check_dlq, ledger_topic
from kworkers.topic_plan import TopicSpec

#: Dead letters per transaction: large enough to amortise the commit round trip, small enough
#: that a crash costs little to redo.
BATCH_SIZE = 100
#: Env variable behind the hidden ``--crash-after``: exit hard after N replays, mid-transaction.
CRASH_AFTER_ENV = "KWORKERS_REDRIVE_CRASH_AFTER"
CRASH_EXIT_CODE = 3

Progress = Callable[[int, int], None]
"""``progress(done, total)``: called as replays are committed (and once at the start)."""


class RedriveError(KworkersError):
    """The redrive stopped: a transaction failed for good (fenced, or the broker refused)."""


def transactional_id(dlq: str) -> str:
    return f"kworkers-redrive-{dlq}"


@dataclass(frozen=True)
class RedriveSummary:
    """What a redrive did. ``selected`` = matched the filter; of those, ``skipped_already``
    were in the ledger, ``refused`` (ledger key, reason) have no trustworthy default target
    (see ``redrive_plan.redrive_target``) and ``redriven`` were replayed now (or would be, in a
    dry run: ``pending``). ``unreadable`` DLQ records are not kworkers dead letters and were
    left."""

    dlq: str
    selected: int
    redriven: int
    skipped_already: int
    pending: int
    dry_run: bool
    unreadable: int = 0
    targets: dict[str, int] = field(default_factory=dict)
    refused: tuple[tuple[str, str], ...] = ()
    #: what was replayed (or would be, in a dry run), in DLQ order
    replays: tuple[Replay, ...] = ()

    def line(self) -> str:
        """The summary line the CLI ends with (stable: scripts parse it; ``refused=N`` only
        when some were)."""
        text = (f"redriven={self.redriven} skipped_already={self.skipped_already} "
                f"selected={self.selected}")
        if self.refused:
            text += f" refused={len(self.refused)}"
        if self.dry_run:
            text += f" would_redrive={self.pending} (dry run: nothing was produced)"
        return text


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
    from ``KWORKERS_REDRIVE_CRASH_AFTER``): exit the process with status 3 after producing
    that many replays inside an open transaction, to prove a crash is harmless. ``actor``:
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

    contents = read_dlq(settings, dlq)
    done = read_ledger(settings, dlq)
    p = plan(dlq, contents.dead_letters, flt, done, target, have)
    todo = p.todo
    if progress is not None:
        progress(0, len(todo))
    refused = tuple((ledger_key(r.dead), r.reason) for r in p.refused)
    summary = RedriveSummary(dlq, len(p.selected), 0, p.skipped_already, len(todo), dry_run,
                             len(contents.unreadable), dict(Counter(r.topic for r in todo)),
                             refused, tuple(todo))
    if dry_run:
        return summary
    assert txn is not None
    if todo:
        size = batch_size if rate is None else max(1, min(batch_size, int(rate)))
        try:
            sent = _replay(txn, dlq, todo, size, rate, progress, crash_after)
        except RedriveError as exc:
            # a fenced producer cannot write it: the audit then shows a run that never ended
            with contextlib.suppress(TransactionAborted, TransactionFailed):
                _audit(txn, dlq, end_entry(run, who, time.time(), None, str(exc)))
            raise
        summary = replace(summary, redriven=sent, pending=0)
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


def _replay(txn: Transactions, dlq: str, todo: Sequence[Replay], size: int,
            rate: float | None, progress: Progress | None, crash_after: int | None) -> int:
    ledger = ledger_topic(dlq)
    produced = committed = 0
    started = time.monotonic()
    for i in range(0, len(todo), size):
        batch = todo[i:i + size]
        for attempt in range(3):
            try:
                txn.begin()
                for r in batch:
                    if rate is not None:
                        # replays so far at the rate asked for, never faster
                        ahead = produced / rate - (time.monotonic() - started)
                        if ahead > 0:
                            time.sleep(ahead)
                    _produce(txn, r)
                    produced += 1
                    if crash_after is not None and produced >= crash_after:
                        txn.flush(30)  # the replays are in the log, uncommitted
                        os._exit(CRASH_EXIT_CODE)
                    _produce_marker(txn, ledger, r)
                txn.commit()
                break
            except TransactionAborted as exc:
                produced -= len(batch)  # nothing of this batch is visible: send it again
                if attempt < 2:
                    continue
                raise RedriveError(f"redrive of {dlq} stopped after {committed} replays: "
                                   f"{exc}") from None
            except TransactionFailed as exc:
                raise RedriveError(f"redrive of {dlq} stopped after {committed} replays: "
                                   f"{exc}") from None
        committed += len(batch)
        if progress is not None:
            progress(committed, len(todo))
    return committed


def _produce(txn: Transactions, r: Replay) -> None:
    d = r.dead
    dead_msg = Message(d.dlq_topic, d.dlq_partition, d.dlq_offset, d.key, d.value, d.headers)
    txn.produce(r.topic, d.key, d.value, list(redrive_headers(dead_msg)), r.partition)


def _produce_marker(txn: Transactions, ledger: str, r: Replay) -> None:
    d = r.dead
    marker = {"target": r.topic, "partition": r.partition, "at_ms": round(time.time() * 1000),
              "original": f"{d.original_topic}/{d.original_partition}/{d.original_offset}"}
    txn.produce(ledger, ledger_key(d).encode(), json.dumps(marker).encode())
