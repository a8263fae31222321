"""The redrive's writes: replays and their ledger markers, a batch per Kafka transaction.

Why batches: a transaction's commit is a round trip to the broker, so one per replay would set
the redrive's pace; a batch amortises it, and a crash costs at most one batch to redo (its
replays and markers abort together, ``kworkers.dlq.redrive``). The replayer holds one batch,
never more: the redrive hands it each replay as it reads the DLQ.
"""

from __future__ import annotations

import json
import os
import signal
import time

from kworkers.dlq.redrive_plan import Replay, ledger_key
from kworkers.errors import KworkersError, TransactionAborted, TransactionFailed
from kworkers.kafka.transactions import Transactions
from kworkers.message import Message
from kworkers.retry_tiers.headers import redrive_headers
from kworkers.topic_names import ledger_topic

#: Dead letters per transaction: large enough to amortise the commit round trip, small enough
#: that a crash costs little to redo (and the batch held in memory stays small). 500, not the
#: 100 it was: measured on 100,000 dead letters (2 cores, loaded), 6.3 s against 15-19 s, the
#: same RSS; 1,000 gained nothing more.
BATCH_SIZE = 500
#: Env variable behind the hidden ``--crash-after``: SIGKILL this process after N replays,
#: mid-transaction (the replays flushed to the log, uncommitted).
CRASH_AFTER_ENV = "KWORKERS_REDRIVE_CRASH_AFTER"
#: The status ``subprocess`` reports for a redrive the hook killed (a shell says 137).
CRASH_EXIT_CODE = -signal.SIGKILL


class RedriveError(KworkersError):
    """The redrive stopped: a transaction failed for good (fenced, or the broker refused)."""


class Replayer:
    """Commits replays in batches of ``size``: ``add`` each, then ``finish``.

    ``rate``: at most this many replays per second. ``crash_after`` (tests only): SIGKILL the
    process after producing that many replays, inside an open transaction.
    """

    def __init__(self, txn: Transactions, dlq: str, size: int, rate: float | None = None,
                 crash_after: int | None = None) -> None:
        self._txn, self._dlq, self._ledger = txn, dlq, ledger_topic(dlq)
        self._size = size if rate is None else max(1, min(size, int(rate)))
        self._rate, self._crash_after = rate, crash_after
        self._batch: list[Replay] = []
        self._produced = 0
        self._started = time.monotonic()
        #: replays committed so far
        self.committed = 0

    def add(self, r: Replay) -> None:
        self._batch.append(r)
        if len(self._batch) >= self._size:
            self._commit()

    def finish(self) -> int:
        """Commits what is left; the number of replays committed in all."""
        if self._batch:
            self._commit()
        return self.committed

    def _commit(self) -> None:
        batch, self._batch = self._batch, []
        for attempt in range(3):
            try:
                self._txn.begin()
                for r in batch:
                    self._pace()
                    _produce(self._txn, r)
                    self._produced += 1
                    if self._crash_after is not None and self._produced >= self._crash_after:
                        self._txn.flush(30)  # the replays are in the log, uncommitted
                        os.kill(os.getpid(), signal.SIGKILL)
                    _produce_marker(self._txn, self._ledger, r)
                self._txn.commit()
                break
            except TransactionAborted as exc:
                self._produced -= len(batch)  # nothing of this batch is visible: send it again
                if attempt < 2:
                    continue
                raise RedriveError(f"redrive of {self._dlq} stopped after {self.committed} "
                                   f"replays: {exc}") from None
            except TransactionFailed as exc:
                raise RedriveError(f"redrive of {self._dlq} stopped after {self.committed} "
                                   f"replays: {exc}") from None
        self.committed += len(batch)

    def _pace(self) -> None:
        if self._rate is None:
            return
        # replays so far at the rate asked for, never faster
        ahead = self._produced / self._rate - (time.monotonic() - self._started)
        if ahead > 0:
            time.sleep(ahead)


def _produce(txn: Transactions, r: Replay) -> None:
    d = r.dead
    dead_msg = Message(d.dlq_topic, d.dlq_partition, d.dlq_offset, d.key, d.value, d.headers)
    txn.produce(r.topic, d.key, d.value, list(redrive_headers(dead_msg)), r.partition)


def _produce_marker(txn: Transactions, ledger: str, r: Replay) -> None:
    d = r.dead
    marker = {"target": r.topic, "partition": r.partition, "at_ms": round(time.time() * 1000),
              "original": f"{d.original_topic}/{d.original_partition}/{d.original_offset}"}
    txn.produce(ledger, ledger_key(d).encode(), json.dumps(marker).encode())
