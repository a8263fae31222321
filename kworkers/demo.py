"""``kworkers demo flaky``: watch a flaky, SIGKILLed worker pool lose nothing and repeat nothing.

What it does, on a real broker (one it starts itself unless ``--bootstrap`` names one):

1. creates a 6-partition topic with its retry tiers and DLQ, and produces N activities (key
   ``wf-<i>``, value ``wf-<i>/act-<i>``: the idempotency key);
2. runs ``--processes`` worker processes (``python -m kworkers.demo worker``) whose handler
   logs every delivery to a SQLite ledger, applies the effect once per idempotency key, and
   fails at ``--fail-rate`` with a ``RetryableError``; 4 attempts at most, so a few
   activities end in the DLQ;
3. SIGKILLs a random worker ``--kills`` times at random moments, restarting it each time;
4. when every activity is applied or dead-lettered, turns the failures off (a flag file the
   workers check) and redrives the DLQ with ``kworkers.dlq.redrive``;
5. waits until every activity is applied, then checks the ledger: each effect exactly once,
   nothing lost. The exit code is 0 only when that check passes.

Everything is bounded by ``--timeout``: a demo that hangs says so and exits 1.

Why the demo has its own worker module instead of reusing the test apps: a newcomer runs it
from an installed package, where ``tests/`` does not exist.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from kworkers.admin import TopicSpec, admin_client, create_topics
from kworkers.dlq.redrive import redrive
from kworkers.errors import KworkersError, RetryableError
from kworkers.kafka.clients import list_topics as topics
from kworkers.kafka.settings import producer_settings, reader_settings
from kworkers.message import Message
from kworkers.retry_tiers.policy import RetryPolicy
from kworkers.retry_tiers.tiers import TierLadder
from kworkers.testing.ledger import Ledger

PARTITIONS = 6
#: Short tiers and few attempts: retries are visible within seconds, and with a 50% failure
#: rate about one activity in sixteen exhausts its attempts and dead-letters. Backoffs of
#: 0.5, 1 and 2 s (full jitter) spread the retries over all three tiers.
TIERS = TierLadder((0.25, 0.5, 1.0))
RETRY = RetryPolicy(initial=0.5, backoff=2.0, max_interval=2.0, max_attempts=4)
#: Classic protocol with a short session: a SIGKILLed worker's partitions move on after ~6 s
#: on any broker (KIP-848 session timeouts are the broker's, 45 s by default).
CONSUMER_CONFIG: dict[str, str | int | float | bool] = {
    "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
}

_OUTCOMES = """
CREATE TABLE IF NOT EXISTS demo_outcomes (
    key TEXT NOT NULL, topic TEXT NOT NULL, attempt INTEGER NOT NULL, outcome TEXT NOT NULL,
    pid INTEGER NOT NULL, at REAL NOT NULL);
"""


class DemoFailed(KworkersError):
    """The demo could not finish (timeout, a worker that cannot start); exit 1."""


# --- the worker process ----------------------------------------------------------------------


class Outcomes:
    """What each delivery came to (failed, applied, absorbed), beside the effects ledger.

    ``Ledger`` records deliveries and effects; whether a delivery was a *redelivery the
    idempotent receiver absorbed* is only known inside the handler, so it is written here.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._local = threading.local()
        self._conn().executescript(_OUTCOMES)

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            self._local.conn = conn
        return conn

    def record(self, key: str, msg: Message, outcome: str) -> None:
        self._conn().execute("INSERT INTO demo_outcomes VALUES (?,?,?,?,?,?)",
                             (key, msg.topic, msg.attempt, outcome, os.getpid(), time.time()))

    def applied(self, key: str) -> bool:
        row = self._conn().execute("SELECT 1 FROM kworkers_ledger_effects WHERE key = ?",
                                   (key,)).fetchone()
        return row is not None

    def count(self, outcome: str) -> int:
        row = self._conn().execute("SELECT COUNT(*) FROM demo_outcomes WHERE outcome = ?",
                                   (outcome,)).fetchone()
        return int(row[0])


def worker_main(argv: list[str]) -> int:
    """``python -m kworkers.demo worker ...``: one flaky worker of the demo pool."""
    from kworkers.worker import Worker

    ap = argparse.ArgumentParser(prog="python -m kworkers.demo worker")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--flag", required=True, help="failures stop once this file exists")
    ap.add_argument("--fail-rate", type=float, default=0.5)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(name)s %(message)s")
    ledger = Ledger(args.ledger)
    outcomes = Outcomes(args.ledger)
    flag = Path(args.flag)
    rnd = random.Random()
    worker = Worker(topics=[args.topic], group_id=args.group, bootstrap_servers=args.bootstrap,
                    retry=RETRY, tiers=TIERS, consumer_config=CONSUMER_CONFIG,
                    drain_timeout=10.0)

    @worker.handler
    def handle(msg: Message) -> None:
        key = (msg.value or b"").decode("utf-8", "replace")
        ledger.delivered(key, msg)
        if outcomes.applied(key):
            # the idempotent receiver: a redelivery of applied work is acknowledged, not redone
            outcomes.record(key, msg, "absorbed")
            return
        if not flag.exists() and rnd.random() < args.fail_rate:
            outcomes.record(key, msg, "failed")
            raise RetryableError("FlakyDownstream", f"injected failure, attempt {msg.attempt}")
        ledger.apply(key, msg)
        outcomes.record(key, msg, "applied")

    print("worker ready", flush=True)
    worker.run()
    print("worker stopped cleanly", flush=True)
    return 0


# --- the orchestrator ------------------------------------------------------------------------


@dataclass(frozen=True)
class FlakyOptions:
    activities: int = 200
    fail_rate: float = 0.5
    kills: int = 3
    processes: int = 2
    bootstrap: str | None = None
    timeout: float = 300.0
    seed: int | None = None


class WorkerProc:
    """One slot of the pool: a worker process that can be SIGKILLed and started again."""

    def __init__(self, index: int, args: list[str], log_dir: Path) -> None:
        self.index = index
        self.args = args
        self.log_path = log_dir / f"worker-{index}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [_package_root(),
                                                           os.environ.get("PYTHONPATH")]))}
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {self.starts}\n".encode())
            log.flush()
            self.proc = subprocess.Popen([sys.executable, "-m", "kworkers.demo", "worker",
                                          *self.args], stdout=log, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def terminate(self, timeout: float) -> int:
        """SIGTERM (drain, commit, leave); SIGKILL if it does not stop in time."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def log_tail(self, lines: int = 15) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text("utf-8", "replace").splitlines()[-lines:])


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[1])


class DlqTail:
    """Follows the DLQ from its beginning: which activities were dead-lettered so far."""

    def __init__(self, bootstrap: str, dlq: str) -> None:
        self._c = Consumer(reader_settings(bootstrap, "kworkers-demo-observer"))
        self._c.assign([TopicPartition(dlq, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        self.records = 0
        self.keys: set[str] = set()

    def poll(self) -> None:
        for m in self._c.consume(500, 0.05):
            if m.error() is None:
                self.records += 1
                self.keys.add((m.value() or b"").decode("utf-8", "replace"))

    def close(self) -> None:
        self._c.close()


@dataclass
class DemoReport:
    activities: int
    effects: int
    distinct_effects: int
    deliveries: int
    failed_attempts: int
    applied: int
    absorbed: int
    retries_per_tier: dict[str, int]
    dead_letters: int
    dead_activities: int
    redriven: int
    lost: list[str]
    unexpected: list[str]
    kills: int
    crashes: int
    elapsed: float
    notes: list[str] = field(default_factory=list)

    @property
    def duplicates(self) -> int:
        return self.effects - self.distinct_effects

    @property
    def ok(self) -> bool:
        return (not self.lost and not self.unexpected and self.duplicates == 0
                and self.effects == self.activities == self.distinct_effects)

    def table(self) -> Table:
        t = Table(title="kworkers demo flaky: report", show_header=False, title_justify="left")
        t.add_column("what", style="bold")
        t.add_column("value")
        tiers = ", ".join(f"{k}: {v}" for k, v in self.retries_per_tier.items()) or "0"
        cut = self.deliveries - self.failed_attempts - self.applied - self.absorbed
        rows = [
            ("activities", str(self.activities)),
            ("effects applied", f"{self.effects} ({self.distinct_effects} distinct keys: "
                                f"each exactly once)" if self.duplicates == 0 else
             f"{self.effects} ({self.distinct_effects} distinct keys)"),
            ("duplicate effects", str(self.duplicates)),
            ("deliveries", f"{self.deliveries} ({self.failed_attempts} failed, {self.applied} "
                           f"applied, {self.absorbed} absorbed, {cut} cut short by SIGKILL)"),
            ("redeliveries absorbed", str(self.absorbed)),
            ("retries per tier", tiers),
            ("dead letters", f"{self.dead_letters} ({self.dead_activities} activities)"),
            ("redriven", str(self.redriven)),
            ("lost", str(len(self.lost))),
            ("SIGKILLs", str(self.kills)),
            ("elapsed", f"{self.elapsed:.1f}s"),
        ]
        if self.crashes:
            rows.append(("unexpected worker exits", str(self.crashes)))
        for k, v in rows:
            t.add_row(k, v)
        return t

    def verdict(self) -> str:
        if self.ok:
            return (f"verified: {self.activities} activities, {self.effects} effects, each "
                    f"exactly once; lost=0 duplicate_effects=0 after {self.kills} SIGKILLs")
        return (f"NOT verified: effects={self.effects} distinct={self.distinct_effects} "
                f"expected={self.activities} lost={len(self.lost)} "
                f"duplicate_effects={self.duplicates} unexpected={len(self.unexpected)}")


class FlakyDemo:
    def __init__(self, opts: FlakyOptions, console: Console) -> None:
        if opts.activities < 1:
            raise KworkersError("--activities must be >= 1")
        self.o = opts
        self.console = console
        self.rng = random.Random(opts.seed)
        self.deadline = time.monotonic() + opts.timeout
        self.started = time.monotonic()
        self.kills = 0
        self._last_kill = float("-inf")
        self.crashes = 0
        self.workers: list[WorkerProc] = []
        self.expected = {f"wf-{i}/act-{i}" for i in range(opts.activities)}

    # -- steps

    def run(self, bootstrap: str, tmp: Path) -> DemoReport:
        c = self.console
        self.started = time.monotonic()
        run_id = uuid.uuid4().hex[:8]
        topic, group = f"demo-flaky-{run_id}", f"demo-flaky-{run_id}"
        dlq = TIERS.dlq_topic(topic)
        topics(bootstrap)
        specs = [TopicSpec(topic, PARTITIONS), *(TopicSpec(t, PARTITIONS)
                                                for t in TIERS.all_topics(topic))]
        create_topics(admin_client(bootstrap), specs)
        c.print(f"topic [bold]{topic}[/] ({PARTITIONS} partitions), tiers "
                f"{', '.join(t.label for t in TIERS.tiers(topic))}, DLQ {dlq}")
        self._produce(bootstrap, topic)
        c.print(f"produced {self.o.activities} activities (key wf-<i>, value wf-<i>/act-<i>)")

        ledger_path = tmp / "ledger.db"
        ledger = Ledger(ledger_path)
        outcomes = Outcomes(ledger_path)
        flag = tmp / "failures-off"
        args = ["--bootstrap", bootstrap, "--topic", topic, "--group", group,
                "--ledger", str(ledger_path), "--flag", str(flag),
                "--fail-rate", str(self.o.fail_rate)]
        self.workers = [WorkerProc(i, args, tmp) for i in range(self.o.processes)]
        for w in self.workers:
            w.start()
        c.print(f"started {self.o.processes} worker processes (fail rate "
                f"{self.o.fail_rate:.0%}, {RETRY.max_attempts} attempts, then the DLQ)")

        tail = DlqTail(bootstrap, dlq)
        try:
            thresholds = sorted(self.rng.uniform(0.1, 0.8) for _ in range(self.o.kills))
            with self._progress() as progress:
                settled = progress.add_task("applied or dead-lettered", total=len(self.expected),
                                            info="")

                def phase1() -> bool:
                    tail.poll()
                    applied = set(ledger.effect_values())
                    done = (applied | tail.keys) & self.expected
                    progress.update(settled, completed=len(done),
                                    info=f"applied {len(applied)}  dead {len(tail.keys)}  "
                                         f"kills {self.kills}/{self.o.kills}")
                    frac = len(done) / len(self.expected)
                    if thresholds and frac >= thresholds[0] and self._may_kill():
                        thresholds.pop(0)
                        self._kill_one(progress.console)
                    return done == self.expected

                self._until(phase1, "every activity applied or dead-lettered")
            applied_now = set(ledger.effect_values())
            c.print(f"phase 1 done: {len(applied_now)} applied, {len(tail.keys)} "
                    f"dead-lettered ({tail.records} DLQ records)")
            both = len(applied_now & tail.keys)
            if both or tail.records > len(tail.keys):
                c.print(f"  {both} activities were applied and also dead-lettered, and "
                        f"{tail.records - len(tail.keys)} dead-lettered twice: a SIGKILL "
                        "between a hand-off and its offset commit redelivers the record, "
                        "which then runs again; the redrive's replays of those are absorbed")

            flag.touch()
            c.print("failures off; redriving the DLQ (transactional, idempotent)")
            summary = redrive(bootstrap, dlq)
            c.print(f"redrive: {summary.line()}")
            while thresholds:  # kills the run was too quick for: during the replays
                thresholds.pop(0)
                self._kill_one(c)

            with self._progress() as progress:
                applied_task = progress.add_task("applied", total=len(self.expected), info="")

                def phase2() -> bool:
                    applied = set(ledger.effect_values()) & self.expected
                    progress.update(applied_task, completed=len(applied))
                    self._restart_crashed(progress.console)
                    return applied == self.expected

                self._until(phase2, "every activity applied after the redrive")
            tail.poll()
        finally:
            tail.close()
        codes = [w.terminate(30) for w in self.workers]
        if any(code != 0 for code in codes):
            c.print(f"[yellow]worker exit codes on SIGTERM: {codes}[/]")
        return self._report(ledger, outcomes, tail, summary.redriven)

    def _progress(self) -> Progress:
        return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                        console=self.console, transient=False)

    def _until(self, step: Callable[[], bool], what: str) -> None:
        while not step():
            if time.monotonic() > self.deadline:
                raise DemoFailed(f"timed out after {self.o.timeout:.0f}s waiting for {what}")
            self._restart_crashed(self.console)
            time.sleep(0.2)

    def _may_kill(self) -> bool:
        # a kill right after another would mostly hit a worker still joining the group
        return time.monotonic() - self._last_kill >= 2.0

    def _kill_one(self, out: Console) -> None:
        w = self.rng.choice(self.workers)
        old = w.pid
        w.kill()
        self.kills += 1
        self._last_kill = time.monotonic()
        w.start()
        out.print(f"SIGKILL worker {w.index} (pid {old}); restarted as pid {w.pid}")

    def _restart_crashed(self, out: Console) -> None:
        for w in self.workers:
            code = w.exited()
            if code is not None:
                self.crashes += 1
                out.print(f"[yellow]worker {w.index} exited by itself ({code}); restarting. "
                          f"Its log:[/]\n{w.log_tail()}")
                if self.crashes > 5:
                    raise DemoFailed("workers keep exiting; see their logs above")
                w.start()

    def _produce(self, bootstrap: str, topic: str) -> None:
        p = Producer(producer_settings(bootstrap))
        for i in range(self.o.activities):
            headers: list[tuple[str, str | bytes | None]] = [
                ("kw-workflow-id", f"wf-{i}".encode()), ("kw-activity-id", f"act-{i}".encode())]
            while True:
                try:
                    p.produce(topic, key=f"wf-{i}".encode(), value=f"wf-{i}/act-{i}".encode(),
                              headers=headers)
                    break
                except BufferError:
                    p.poll(0.1)
        if p.flush(30):
            raise DemoFailed(f"could not produce the activities to {topic}")

    def _report(self, ledger: Ledger, outcomes: Outcomes, tail: DlqTail,
                redriven: int) -> DemoReport:
        values = ledger.effect_values()
        got = set(values)
        deliveries = ledger.deliveries()
        # attempt > 1 runs only from a tier topic; keyed by tier label, shortest tier first
        per_tier = {t.label: 0 for t in TIERS.tiers("demo")}
        for d in deliveries:
            if d.attempt > 1:
                label = d.topic.rpartition(".retry.")[2]
                per_tier[label] = per_tier.get(label, 0) + 1
        return DemoReport(
            activities=len(self.expected), effects=len(values), distinct_effects=len(got),
            deliveries=len(deliveries), failed_attempts=outcomes.count("failed"),
            applied=outcomes.count("applied"), absorbed=outcomes.count("absorbed"),
            retries_per_tier=per_tier,
            dead_letters=tail.records, dead_activities=len(tail.keys), redriven=redriven,
            lost=sorted(self.expected - got), unexpected=sorted(got - self.expected),
            kills=self.kills, crashes=self.crashes,
            elapsed=time.monotonic() - self.started)

    def close(self) -> None:
        for w in self.workers:
            with contextlib.suppress(Exception):
                w.kill()


def _start_broker() -> Any:
    """A broker of the demo's own (``kworkers.testing``: a container, or Kafka's jars)."""
    try:
        from kworkers.testing import broker_from_env

        broker = broker_from_env()
    except ImportError as exc:
        raise DemoFailed(f"starting a broker needs the test extras ({exc}); install "
                         "kworkers[test], run scripts/demo, or pass --bootstrap") from None
    try:
        broker.start()
    except Exception as exc:
        with contextlib.suppress(Exception):
            broker.close()
        raise DemoFailed(f"could not start a Kafka broker: {type(exc).__name__}: {exc}; "
                         "scripts/demo sets one up, or pass --bootstrap") from None
    return broker


def run_flaky(opts: FlakyOptions, console: Console) -> int:
    """The whole demo; 0 only when the report verifies."""
    broker: Any = None
    bootstrap = opts.bootstrap
    if bootstrap is not None:
        topics(bootstrap)  # an unreachable broker is one line, before anything starts
    tmp = Path(tempfile.mkdtemp(prefix="kworkers-demo-"))
    demo = FlakyDemo(opts, console)
    ok = False
    try:
        if bootstrap is None:
            console.print("starting a Kafka broker for the demo (about 30 s; pass --bootstrap "
                          "to use yours)")
            broker = _start_broker()
            bootstrap = str(broker.bootstrap_servers)
            console.print(f"broker ready at {bootstrap}")
        report = demo.run(bootstrap, tmp)
        console.print(report.table())
        console.print(report.verdict(), style="bold green" if report.ok else "bold red")
        if report.lost:
            console.print(f"lost: {', '.join(report.lost[:20])}")
        ok = report.ok
        return 0 if ok else 1
    except DemoFailed as exc:
        console.print(f"[bold red]demo failed:[/] {exc}")
        for w in demo.workers:
            console.print(f"--- worker {w.index} log ({w.log_path}):\n{w.log_tail()}")
        return 1
    finally:
        demo.close()
        if broker is not None:
            with contextlib.suppress(Exception):
                broker.close()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            console.print(f"logs and ledger kept in {tmp}")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "worker":
        sys.exit(worker_main(sys.argv[2:]))
    print("usage: python -m kworkers.demo worker --bootstrap B --topic T --group G "
          "--ledger PATH --flag PATH [--fail-rate R]  (or: kworkers demo flaky)",
          file=sys.stderr)
    sys.exit(2)
