"""Exactly once: a loop's positions, outputs and hand-offs committed in one Kafka transaction.

The committer of a loop made with ``guarantee="exactly_once"``, in place of ``Committer``. What
a transaction holds: for each partition, the position the offset tracker vouches for (every
record below it completed) and the buffered outputs and hand-offs of exactly the records below
that position (``OutputBuffer.take``), so a transaction never commits an output of a record
whose offset it does not commit: records finished ahead of a slow one wait in the buffer for
it (a crash after such a commit would run them again and duplicate their outputs). The offsets
go in with ``send_offsets_to_transaction`` and the group metadata taken on the poll thread
just before, so the coordinator refuses them from a member that lost its partitions (KIP-447).

One transaction at a time, on a thread of its own: the poll thread builds it and applies its
outcome, and never waits for the broker (a frozen broker costs it nothing but the commit).
What an outcome means:

- committed: the positions are committed, the entries' hooks run (the idempotency store's
  key completions that waited for the outputs);
- aborted (a produce refused, the group moved on, the broker asked for it): nothing of it is
  visible; its entries go back to the buffer and ride in the next transaction (after a wait
  that doubles from 0.1 s to 5 s), which is what rerunning their records would produce,
  without rerunning them. An entry the broker refused for good (too large, not authorised) is
  replaced by its record's dead letter first, or the transaction would abort forever;
- held (an output's topic does not exist): before a transaction produces to a topic it has
  not seen yet, the transaction thread asks the broker for it; a missing one means no
  transaction is begun, its entries go back to the buffer (nothing committed past their
  records) and are tried again with the abort's wait. The hold names the topic and the
  broker's reason once (a log line, ``kworkers_output_topic_missing{topic}``, ``/readyz``),
  and past ``unhealthy_after`` turns the worker unhealthy: a missing topic is a deployment's
  error, and dead-lettering would empty the source into the DLQ until someone creates it;
- uncertain (the producer failed mid-commit: timed out, refused for good): a new producer
  under the same transactional id fences the old one and ends its transaction, then the
  group's committed offsets, read once no transaction is pending on them, say whether it
  committed;
- fenced: a group that moved on refuses the offsets (abortable: aborted as above, and the
  rebalance drops the partitions' buffer); a producer fenced by another one under the same id
  stops the worker (unhealthy), because taking the id back would fence that other worker.

Partitions revoked or lost drop what they buffered: their next owner runs those records again,
and nothing of theirs was ever visible.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from queue import Empty, SimpleQueue

from kworkers.clock import Clock
from kworkers.consumer.buffered import BufferedHandOffs
from kworkers.consumer.commit import CommitOutcome, Run
from kworkers.consumer.committer import Committer
from kworkers.consumer.outputs import Entry
from kworkers.consumer.partition import PartitionState
from kworkers.consumer.ports import TP, ConsumerPort, TransactionPort
from kworkers.errors import TransactionAborted, TransactionFailed
from kworkers.metrics import Metrics
from kworkers.supervision import Supervisor

log = logging.getLogger("kworkers.transactions")

FIRST_WAIT_S = 0.1
MAX_WAIT_S = 5.0


@dataclass(eq=False)
class TxnRun:
    """One transaction's life; built and read on the poll thread, run on the transaction
    thread (which sets ``outcome`` last)."""

    why: str
    targets: list[PartitionState]
    positions: dict[TP, int] = field(default_factory=dict)
    entries: list[tuple[PartitionState, Entry]] = field(default_factory=list)
    metadata: object = None
    outcome: CommitOutcome | None = None
    error: str | None = None
    #: entries a produce refused, with why
    refused: list[tuple[PartitionState, Entry, BaseException]] = field(default_factory=list)
    uncertain: bool = False
    #: the broker said this member or producer is no longer the owner
    fenced: bool = False
    #: output topics that do not exist, with the broker's reason (nothing was begun)
    missing: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def done(self) -> bool:
        return self.outcome is not None


class TransactionalCommitter:
    def __init__(self, consumer: ConsumerPort, port: TransactionPort,
                 hand_offs: BufferedHandOffs, metrics: Metrics, group: str, clock: Clock,
                 timeout_s: float, supervisor: Supervisor,
                 unhealthy_after: float | None = None) -> None:
        self.consumer = consumer
        self.port = port
        self.hand_offs = hand_offs
        self.buffer = hand_offs.buffer
        self.group = group
        self.clock = clock
        self.timeout_s = timeout_s
        self.supervisor = supervisor
        #: plain commits: the fenced member's probe (of committed offsets only)
        self.plain = Committer(consumer, metrics, group, clock, timeout_s)
        self._queue: list[TxnRun] = []
        self._current: TxnRun | None = None
        self._finished: list[TxnRun] = []
        self._jobs: SimpleQueue[TxnRun | None] = SimpleQueue()
        self._results: SimpleQueue[TxnRun] = SimpleQueue()
        self._posted = threading.Event()
        self._ready = threading.Event()
        self._closed = threading.Event()
        self._retry_at = float("-inf")
        self._wait = FIRST_WAIT_S
        #: output topics the broker said exist (the transaction thread's own)
        self._present: set[str] = set()
        #: the hold on outputs to missing topics: topic -> reason, since when (poll thread)
        self._missing: dict[str, str] = {}
        self._missing_since: float | None = None
        self.unhealthy_after = unhealthy_after
        self._m_missing = metrics.output_topic_missing
        #: set by the transaction thread when another producer took the id over: no further
        #: transaction is sent (each would be fenced again)
        self._fenced_out = False
        self._m = {o: metrics.transactions.labels(group, o)
                   for o in ("committed", "aborted", "uncertain", "fenced")}
        self._m_seconds = metrics.transaction_duration.labels(group)
        self._m_outputs = metrics.transaction_outputs.labels(group)
        self._thread = threading.Thread(target=self._serve, name=f"kworkers-txn-{group}",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ Committer's face

    @property
    def runs(self) -> list[TxnRun]:
        return ([self._current] if self._current is not None else []) + self._queue

    @property
    def periodic_in_flight(self) -> bool:
        return any(r.why == "periodic" for r in self.runs) or self.plain.periodic_in_flight

    @property
    def due(self) -> bool:
        """The buffer is half full: a transaction now, not at the interval. Runners wait for
        room once it is full, so a loop that committed only every interval would run at most
        ``limit`` records per interval; taking the buffer's entries into a transaction frees
        their room at once."""
        return self.buffer.count * 2 >= self.hand_offs.limit

    collect_unreported = staticmethod(Committer.collect_unreported)

    def advance_past_markers(self, targets: Sequence[PartitionState]) -> int:
        return self.plain.advance_past_markers(targets)

    def probe(self, targets: Sequence[PartitionState]) -> Run | None:
        """A plain commit of the committed offsets only: a position beyond them has outputs
        not committed yet, which a plain commit would skip for good."""
        return self.plain.probe(targets, committed_only=True)

    def start(self, targets: Sequence[PartitionState], why: str, last_chance: bool = False,
              resendable: bool = True) -> TxnRun | None:
        """Queues a transaction of the targets' positions and outputs (sent once the one in
        flight finished); None when no position moved."""
        del last_chance, resendable  # a transaction is never sent twice: its entries are
        if self._fenced_out:
            return None
        if not any(ps.tracker.committable() is not None for ps in targets):
            return None
        run = TxnRun(why, list(targets))
        self._queue.append(run)
        self._launch()
        return run

    def settle(self, targets: Sequence[PartitionState]) -> None:
        """``targets`` are no longer this member's: what they buffered is never sent."""
        for ps in targets:
            self.buffer.drop(ps)
        self.plain.settle(targets)

    def tick(self, parts: Mapping[TP, PartitionState]) -> list[Run]:
        """Applies the outcomes the transaction thread posted, launches the next queued
        transaction; returns the runs that finished (plain probes included)."""
        finished: list[Run] = list(self.plain.tick(parts))
        while True:
            try:
                run = self._results.get_nowait()
            except Empty:
                break
            self._current = None
            self._apply(run, parts)
            finished.append(run)
        self._launch()
        finished += self._finished
        self._finished = []
        return finished

    def wait(self, run: Run | None, wait_s: float, parts: Mapping[TP, PartitionState]) -> None:
        """Inside a revoke callback: the revoked partitions' transaction must commit while
        they are still this member's, so this waits for it (bounded); what finished meanwhile
        is reported by the next ``tick``."""
        deadline = self.clock.monotonic() + wait_s
        while isinstance(run, TxnRun) and not run.done and self.clock.monotonic() < deadline:
            self._posted.wait(0.02)
            self._posted.clear()
            self._finished += [r for r in self.tick(parts) if isinstance(r, TxnRun)]
        if isinstance(run, TxnRun) and not run.done:
            log.warning("%s: the revoked partitions' transaction did not finish within %.1fs; "
                        "if it does not commit, their next owner runs those records again",
                        self.group, wait_s)

    def close(self) -> None:
        self._closed.set()
        self._jobs.put(None)

    # ------------------------------------------------------------------ the poll thread

    def _launch(self) -> None:
        now = self.clock.monotonic()
        while self._current is None and self._queue and self._ready.is_set():
            run = self._queue[0]
            if run.why == "periodic" and now < self._retry_at:
                return  # an abort's wait
            self._queue.pop(0)
            for ps in run.targets:
                pos = ps.tracker.committable()
                if pos is None or ps.revoking:
                    continue
                run.positions[ps.tp] = pos
                run.entries += [(ps, e) for e in self.buffer.take(ps, pos)]
            if not run.positions:
                run.outcome = CommitOutcome.COMMITTED  # the one before committed it all
                self._finished.append(run)
                continue
            run.metadata = self.consumer.group_metadata()
            self._current = run
            self._jobs.put(run)

    def _apply(self, run: TxnRun, parts: Mapping[TP, PartitionState]) -> None:
        self._m_seconds.observe(run.seconds)
        if run.uncertain:
            self._m["uncertain"].inc()
        if run.fenced:
            self._m["fenced"].inc()
        current = {ps for ps in run.targets if parts.get(ps.tp) is ps and not ps.revoking}
        self._hold_missing(run, current)
        if run.missing:
            for ps in current:
                self.buffer.put_back(ps, [e for p, e in run.entries if p is ps])
            self._retry_at = self.clock.monotonic() + self._wait
            self._wait = min(self._wait * 2, MAX_WAIT_S)
            return
        if run.outcome is CommitOutcome.COMMITTED:
            if not run.uncertain:
                self._m["committed"].inc()
            self._m_outputs.inc(sum(len(e.outputs) for _ps, e in run.entries))
            for ps in current:
                pos = run.positions.get(ps.tp)
                if pos is not None:
                    ps.tracker.mark_committed(pos)
            self._wait = FIRST_WAIT_S
            self._retry_at = float("-inf")
            return
        if not run.uncertain:
            self._m["aborted"].inc()
        log.warning("%s: transaction (%s, %d records) not committed (%s): its outputs go into "
                    "the next one", self.group, run.why, len(run.entries), run.error)
        refused = {(id(ps), e.offset): exc for ps, e, exc in run.refused}
        back: dict[PartitionState, list[Entry]] = {}
        for ps, e in run.entries:
            if ps not in current:
                continue  # no longer ours: the next owner runs the record again
            exc = refused.get((id(ps), e.offset))
            back.setdefault(ps, []).append(e if exc is None else self._refused(ps, e, exc))
        for ps, entries in back.items():
            self.buffer.put_back(ps, entries)
        self._retry_at = self.clock.monotonic() + self._wait
        self._wait = min(self._wait * 2, MAX_WAIT_S)

    def _hold_missing(self, run: TxnRun, current: set[PartitionState]) -> None:
        """The hold on missing output topics, from a finished run: each topic told once when
        it is found missing and once when it is there again; readiness while any is missing,
        health past ``unhealthy_after``."""
        component = f"outputs of {self.group}"
        if not run.missing and run.outcome is not CommitOutcome.COMMITTED:
            return  # an abort says nothing about the topics
        for topic in self._missing.keys() - run.missing.keys():
            log.warning("%s: output topic %s exists now: the outputs that waited for it go "
                        "out", self.group, topic)
            self._m_missing.labels(self.group, topic).set(0)
        if not run.missing:
            if self._missing:
                self.supervisor.recover(component)
            self._missing, self._missing_since = {}, None
            return
        now = self.clock.monotonic()
        waiting = sum(1 for ps, _e in run.entries if ps in current)
        for topic, why in run.missing.items():
            if topic not in self._missing:
                log.error("%s: output topic %s does not exist (%s): %d record(s) wait for it, "
                          "nothing is committed past them; create the topic", self.group,
                          topic, why, waiting)
                self._m_missing.labels(self.group, topic).set(1)
        self._missing = dict(run.missing)
        if self._missing_since is None:
            self._missing_since = now
        names = ", ".join(f"{t} ({w})" for t, w in sorted(self._missing.items()))
        why = (f"output topic(s) missing: {names}; {waiting} record(s) wait, nothing committed "
               "past them")
        self.supervisor.degrade(component, why)
        lasted = now - self._missing_since
        if self.unhealthy_after is not None and lasted >= self.unhealthy_after:
            self.supervisor.fail(component, f"{why}, for {lasted:.0f}s")

    def _refused(self, ps: PartitionState, entry: Entry, exc: BaseException) -> Entry:
        """An entry a produce refused: kept as it is for a transient refusal or a topic gone
        missing (the next transaction's check holds it); replaced by its record's dead letter
        when refused for good."""
        if self.port.classify(exc) != "permanent":
            return entry
        if not entry.falls_back:  # the DLQ's own record: nowhere left to go
            self.supervisor.fail("dead-letter queue", f"{entry.outputs[0].topic} refuses dead "
                                 f"letters ({exc}); {entry.msg.topic}/{entry.msg.partition}@"
                                 f"{entry.msg.offset} stays uncommitted")
            return entry
        return self.hand_offs.dead_letter(entry, exc)

    # ------------------------------------------------------------------ the transaction thread

    def _serve(self) -> None:
        self._retrying("starting the transactional producer",
                       lambda: self.port.init(self.timeout_s))
        self._ready.set()
        while True:
            run = self._jobs.get()
            if run is None:
                break
            self._execute(run)
            self._results.put(run)
            self._posted.set()
        try:
            self.port.close()
        except Exception:
            log.exception("%s: closing the transactional producer failed", self.group)

    def _execute(self, run: TxnRun) -> None:
        port, timeout = self.port, self.timeout_s
        t0 = time.monotonic()
        refused: list[tuple[PartitionState, Entry, BaseException]] = []

        def failed(ps: PartitionState, e: Entry, exc: BaseException) -> None:
            refused.append((ps, e, exc))

        outcome = CommitOutcome.FAILED
        run.missing = self._missing_topics(run)
        if run.missing:
            run.error = "output topics missing"
            run.seconds = time.monotonic() - t0
            run.outcome = outcome
            return
        try:
            port.begin()
            for ps, e in run.entries:
                on_error: Callable[[BaseException], None] = partial(failed, ps, e)
                for out in e.outputs:
                    port.produce(out.topic, out.key, out.value, out.headers, on_error)
            if refused:
                raise TransactionAborted(f"{len(refused)} records refused: {refused[0][2]}")
            port.send_offsets(run.positions, run.metadata, timeout)
            port.commit(timeout)
            outcome = CommitOutcome.COMMITTED
        except TransactionAborted as exc:
            run.error = str(exc)
            run.fenced = exc.fenced
            try:
                port.abort(timeout)
            except Exception as worse:
                run.error = f"{exc}; the abort failed too ({worse})"
                run.uncertain = True
                outcome = self._resolve(run)
        except TransactionFailed as exc:
            run.error = str(exc)
            run.fenced = exc.fenced
            if exc.fenced:  # another producer has this id: taking it back would fence that one
                self._fenced_out = True
                self.supervisor.fail("transactions", f"{self.group}: another producer took this "
                                     f"loop's transactional id over ({exc}): do two workers "
                                     "share a transactional_id?")
            else:
                run.uncertain = True
                outcome = self._resolve(run)
        except Exception as exc:  # a bug or a client surprise: find out what happened
            log.exception("%s: transaction failed unexpectedly", self.group)
            run.error = f"{type(exc).__name__}: {exc}"
            run.uncertain = True
            outcome = self._resolve(run)
        run.refused = refused
        for _ps, e, why in refused:
            if port.classify(why) == "missing":  # deleted since it was seen: ask again
                self._present.difference_update(o.topic for o in e.outputs)
        run.seconds = time.monotonic() - t0
        if outcome is CommitOutcome.COMMITTED:
            for _ps, e in run.entries:
                for hook in e.after or ():
                    try:
                        hook()
                    except Exception:
                        log.exception("%s: completing a record after its transaction failed "
                                      "(its key stays claimed until its lease ends)",
                                      self.group)
        run.outcome = outcome

    def _missing_topics(self, run: TxnRun) -> dict[str, str]:
        """The run's output topics the broker says do not exist, with its reason; a topic
        once seen is not asked for again. A broker that does not answer says nothing here
        (the produce then tells)."""
        topics = {o.topic for _ps, e in run.entries for o in e.outputs} - self._present
        if not topics:
            return {}
        try:
            missing = self.port.missing(sorted(topics), self.timeout_s)
        except Exception as exc:
            log.debug("%s: asking for the output topics failed: %s", self.group, exc)
            return {}
        self._present |= topics - missing.keys()
        return missing

    def _retrying(self, what: str, call: Callable[[], object]) -> bool:
        """``call`` until it returns (waits 0.1 s doubling to 5 s between tries); False when
        the committer closed first."""
        wait = FIRST_WAIT_S
        while not self._closed.is_set():
            try:
                call()
                return True
            except Exception as exc:
                log.warning("%s: %s failed (%s); again in %.1fs", self.group, what, exc, wait)
                self._closed.wait(wait)
                wait = min(wait * 2, MAX_WAIT_S)
        return False

    def _resolve(self, run: TxnRun) -> CommitOutcome:
        """Did the transaction commit? A new producer under the same id ends it either way;
        then the committed offsets say which."""
        if not self._retrying("taking the transactional id over",
                              lambda: self.port.renew(self.timeout_s)):
            return CommitOutcome.FAILED
        tps = list(run.positions)
        read: list[dict[TP, int | None]] = []
        if not self._retrying("reading the committed offsets", lambda: read.append(
                self.port.committed(self.group, tps, self.timeout_s))):
            return CommitOutcome.FAILED
        got = read[0]
        ok = all((got.get(tp) or -1) >= pos for tp, pos in run.positions.items())
        log.warning("%s: the uncertain transaction %s", self.group,
                    "committed" if ok else "did not commit: its outputs go into the next one")
        return CommitOutcome.COMMITTED if ok else CommitOutcome.FAILED
