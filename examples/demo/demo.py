"""``scripts/demo``: a flaky, SIGKILLed worker pool charges every order exactly once.

What it does, on a real broker (one it starts itself unless ``--bootstrap`` names one):

1. creates a 6-partition topic with its retry tiers and DLQ, and produces N orders, each an
   activity ``order-<i>/charge`` (the ``kw-workflow-id`` / ``kw-activity-id`` headers);
2. runs ``--processes`` workers (``charge_worker.py``) under ``Worker(idempotency=store)``: each
   charge is a row appended to a ``charges`` table through ``store.apply_once``, so the row and
   the key's done-mark commit together; attempts fail at ``--fail-rate`` (retry tiers, 4
   attempts, then the DLQ);
3. one worker SIGKILLs itself right after charging one chosen order and before its offset is
   committed (a certain redelivery), and the demo SIGKILLs random workers ``--kills`` times;
4. once every order is charged or dead-lettered, turns the failures off and redrives the DLQ;
5. waits until every order is charged and every offset committed, then counts the charges per
   order **from the charges table**: exit 0 only when every order was charged exactly once.

``--without-receiver`` runs the same pool without the idempotent receiver (seed 003's first
version): the chosen order is charged again after the kill, the demo reports the double charge
and exits 1. Everything is bounded by ``--timeout``.

    python examples/demo/demo.py [--orders N] [--fail-rate R] [--kills K] [--processes P]
                                 [--bootstrap HOST:PORT [--config FILE]] [--without-receiver]
                                 [--timeout S]
                                 [--workdir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from rich.console import Console
from rich.table import Table

from kworkers import settings
from kworkers.dlq.redrive import redrive
from kworkers.errors import ConfigError
from kworkers.kafka.admin import admin_client, create_topics
from kworkers.kafka.consumer import headers_of
from kworkers.kafka.settings import ClientSettings
from kworkers.testing.broker import broker_from_env
from kworkers.testing.checker import committed, read_log, record_key
from kworkers.topic_plan import TopicSpec

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from charge_worker import RETRY, TIERS  # type: ignore[import-not-found]  # noqa: E402  (the demo's own worker module, beside it)

PARTITIONS = 6


class DemoFailed(Exception):
    """The demo could not finish (timeout, workers that cannot start): exit 2."""


class Slot:
    """One worker of the pool: a process that can be SIGKILLed and started again."""

    def __init__(self, index: int, args: list[str], log_dir: Path) -> None:
        self.index = index
        self.args = args
        self.log_path = log_dir / f"worker-{index}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            log.write(b"--- process started\n")  # before it can die: a start is counted
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE / "charge_worker.py"), *self.args], stdout=log,
                stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def kill(self) -> bool:
        """SIGKILL the process if it still runs; whether it did (one that had exited by
        itself is not a kill)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
            return True
        return False

    def terminate(self, timeout: float) -> int:
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


@dataclass
class Report:
    orders: int
    charges: dict[str, int]
    dead_letters: int
    redriven: int
    kills: int
    restarts: int
    elapsed: float
    victim: str
    expected: set[str] = field(default_factory=set)

    @property
    def twice(self) -> dict[str, int]:
        return {k: n for k, n in sorted(self.charges.items()) if n > 1}

    @property
    def never(self) -> list[str]:
        return sorted(k for k in self.expected if self.charges.get(k, 0) == 0)

    @property
    def ok(self) -> bool:
        return not self.twice and not self.never and set(self.charges) == self.expected

    def table(self, mode: str) -> Table:
        t = Table(title=f"kworkers demo ({mode}): charges counted from the charges table",
                  show_header=False, title_justify="left")
        t.add_column("what", style="bold")
        t.add_column("value")
        rows = [
            ("orders", str(self.orders)),
            ("charge rows", str(sum(self.charges.values()))),
            ("orders charged once", str(sum(1 for n in self.charges.values() if n == 1))),
            ("orders charged twice or more", str(len(self.twice))),
            ("orders never charged", str(len(self.never))),
            ("killed right after its charge", f"{self.victim}: charged "
                                              f"{self.charges.get(self.victim, 0)} time(s)"),
            ("dead letters redriven", f"{self.redriven} (of {self.dead_letters})"),
            ("SIGKILLs", f"{self.kills} by the demo, {self.restarts} restarts in all"),
            ("elapsed", f"{self.elapsed:.1f}s"),
        ]
        for k, v in rows:
            t.add_row(k, v)
        return t

    def verdict(self) -> str:
        if self.ok:
            return (f"verified: {self.orders} orders, each charged exactly once, after "
                    f"{self.restarts} worker deaths")
        parts = []
        if self.twice:
            sample = ", ".join(f"{k} x{n}" for k, n in list(self.twice.items())[:10])
            parts.append(f"charged twice: {len(self.twice)} order(s) ({sample})")
        if self.never:
            parts.append(f"never charged: {len(self.never)} ({', '.join(self.never[:10])})")
        return "NOT verified: " + "; ".join(parts)


class Demo:
    def __init__(self, args: argparse.Namespace, console: Console) -> None:
        self.a = args
        self.c = console
        self.rng = random.Random(args.seed)
        self.deadline = time.monotonic() + args.timeout
        self.started = time.monotonic()
        self.kills = 0
        self.restarts = 0
        self.slots: list[Slot] = []
        self.expected = {f"order-{i}/charge" for i in range(args.orders)}
        #: the order whose worker dies right after charging it (a certain redelivery)
        self.victim = f"order-{args.orders // 3}/charge"

    def run(self, client: ClientSettings, tmp: Path) -> Report:
        bootstrap = client.bootstrap_servers
        run_id = uuid.uuid4().hex[:8]
        topic, group = f"demo-orders-{run_id}", f"demo-charges-{run_id}"
        dlq = TIERS.dlq_topic(topic)
        tiers = [t.topic for t in TIERS.tiers(topic)]
        create_topics(admin_client(client), [
            TopicSpec(topic, PARTITIONS), *(TopicSpec(t, PARTITIONS)
                                            for t in TIERS.all_topics(topic))])
        self._produce(client, topic)
        self.c.print(f"produced {self.a.orders} orders to [bold]{topic}[/] ({PARTITIONS} "
                     f"partitions; tiers {', '.join(t.label for t in TIERS.tiers(topic))}; "
                     f"DLQ {dlq})")
        db = tmp / "demo.db"
        flag = tmp / "failures-off"
        (tmp / "markers").mkdir()
        args = ["--bootstrap", bootstrap, *(["--config", str(self.a.config)] if self.a.config
                                            else []),
                "--topic", topic, "--group", group, "--db", str(db),
                "--fail-rate", str(self.a.fail_rate), "--flag", str(flag),
                "--kill-after-charge", self.victim, "--markers", str(tmp / "markers")]
        if self.a.without_receiver:
            args.append("--without-receiver")
        self.slots = [Slot(i, args, tmp) for i in range(self.a.processes)]
        for s in self.slots:
            s.start()
        receiver = ("WITHOUT the idempotent receiver" if self.a.without_receiver else
                    "Worker(idempotency=store), charging through store.apply_once")
        self.c.print(f"started {self.a.processes} workers: {receiver}; fail rate "
                     f"{self.a.fail_rate:.0%}, {RETRY.max_attempts} attempts, then the DLQ; "
                     f"the worker charging {self.victim} dies right after the charge")
        dead = DlqKeys(client, dlq)
        thresholds = sorted(self.rng.uniform(0.1, 0.8) for _ in range(self.a.kills))
        try:
            def phase1() -> bool:
                dead.poll()
                done = (set(charges(db)) | dead.keys) & self.expected
                frac = len(done) / len(self.expected)
                if thresholds and frac >= thresholds[0]:
                    thresholds.pop(0)
                    self._kill_one()
                return done == self.expected

            self._until(phase1, "every order charged or dead-lettered")
            dead.drain()  # one moment for both counts: the DLQ read to its end now
            copies = dead.records - len(dead.keys)
            why = ("" if not copies else
                   f"; {copies} more: a worker killed after a dead letter was acknowledged "
                   "and before its offset was committed ran that order again, and it was "
                   "dead-lettered again")
            self.c.print(f"every order charged or dead-lettered: {len(dead.keys)} orders in "
                         f"{dead.records} dead letters{why}; failures off, redriving the DLQ "
                         "(every dead letter: the receiver absorbs a copy's replay)")
            flag.touch()
            summary = redrive(client, dlq)
            self.c.print(f"redrive: {summary.line()}")
            redriven = summary.redriven
            redriven_at = dead.records
            while thresholds:
                thresholds.pop(0)
                self._kill_one()

            def settled() -> bool:
                nonlocal redriven, redriven_at
                dead.poll()
                if dead.records > redriven_at:
                    # dead-lettered again after the failures stopped: an order whose lease a
                    # killed worker still held ran out of attempts; redrive those too
                    again = redrive(client, dlq)
                    self.c.print(f"redrive: {again.line()}")
                    redriven += again.redriven
                    redriven_at = dead.records
                if not set(charges(db)) >= self.expected:
                    return False
                return (_at_end(client, group, [topic])
                        and _at_end(client, f"{group}.retry", tiers))

            self._until(settled, "every order charged and every offset committed")
            dead.poll()
        finally:
            dead.close()
        codes = [s.terminate(30) for s in self.slots]
        if any(code != 0 for code in codes):
            self.c.print(f"[yellow]worker exit codes on SIGTERM: {codes}[/]")
        log = read_log(bootstrap, topic, config=client.properties)
        log_keys = {record_key(r.headers, r.value) for r in log}
        return Report(orders=len(self.expected), charges=charges(db),
                      dead_letters=dead.records, redriven=redriven, kills=self.kills,
                      restarts=self.restarts, elapsed=time.monotonic() - self.started,
                      victim=self.victim, expected=self.expected & log_keys)

    def _until(self, step: Callable[[], bool], what: str) -> None:
        while not step():
            if time.monotonic() > self.deadline:
                raise DemoFailed(f"timed out after {self.a.timeout:.0f}s waiting for {what}")
            self._restart_exited()
            time.sleep(0.2)

    def _kill_one(self) -> None:
        # a worker that died by itself (the certain kill) is started again first, so the
        # demo's SIGKILL lands on a running process: a CI run once picked the slot the certain
        # kill had just emptied and counted a kill that stopped nothing (3 starts, not 4)
        for _ in range(5):
            self._restart_exited()
            s = self.rng.choice(self.slots)
            old = s.pid
            if s.kill():
                self.kills += 1
                self._restart_exited()
                self.c.print(f"SIGKILL worker {s.index} (pid {old}); restarted as pid {s.pid}")
                return
        self.c.print("[yellow]no running worker to SIGKILL after 5 tries[/]")

    def _restart_exited(self) -> None:
        for s in self.slots:
            if s.exited():
                self.restarts += 1
                if self.restarts > self.a.kills + 10:
                    raise DemoFailed("workers keep exiting; see their logs below")
                s.start()

    def _produce(self, client: ClientSettings, topic: str) -> None:
        p = Producer({**_conf(client), "enable.idempotence": True, "linger.ms": 5,
                      "log_level": 3})
        for i in range(self.a.orders):
            headers: list[tuple[str, str | bytes | None]] = [
                ("kw-workflow-id", f"order-{i}".encode()), ("kw-activity-id", b"charge")]
            value = json.dumps({"order": i, "amount_cents": 100 + i}).encode()
            while True:
                try:
                    p.produce(topic, key=f"order-{i}".encode(), value=value, headers=headers)
                    break
                except BufferError:
                    p.poll(0.1)
        if p.flush(30):
            raise DemoFailed(f"could not produce the orders to {topic}")

    def close(self) -> None:
        for s in self.slots:
            with contextlib.suppress(Exception):
                s.kill()


def charges(db: Path) -> dict[str, int]:
    """Charge rows per order, read from the table the workers append to."""
    if not db.exists():
        return {}
    conn = sqlite3.connect(db, timeout=60)
    try:
        rows = conn.execute("SELECT order_key, COUNT(*) FROM charges GROUP BY order_key")
        return {str(k): int(n) for k, n in rows}
    except sqlite3.OperationalError:  # the workers have not created the table yet
        return {}
    finally:
        conn.close()


def _conf(client: ClientSettings) -> dict[str, Any]:
    """A plain client's configuration for the demo's own producer and observer: the address
    and the security (TLS, SASL) of ``--bootstrap`` / ``--config``."""
    return {**client.properties, "bootstrap.servers": client.bootstrap_servers}


def _at_end(client: ClientSettings, group: str, topics: list[str]) -> bool:
    """``group`` committed every record of ``topics``: past each partition's last record, as a
    read_committed consumer reads it (a transaction's commit marker after it is not a record,
    and a position just before it is the end)."""
    for t in topics:
        pos = committed(client.bootstrap_servers, group, t, config=client.properties)
        for p, records in read_log(client.bootstrap_servers, t,
                                   config=client.properties).records.items():
            if records and pos.get(p, -1) <= records[-1].offset:
                return False
    return True


class DlqKeys:
    """Follows the DLQ from its beginning: which orders were dead-lettered so far."""

    def __init__(self, client: ClientSettings, dlq: str) -> None:
        self._c = Consumer({**_conf(client), "log_level": 3,
                            "group.id": "kworkers-demo-observer", "enable.auto.commit": False,
                            "isolation.level": "read_committed"})
        self._c.assign([TopicPartition(dlq, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        self.records = 0
        self.keys: set[str] = set()

    def poll(self, timeout: float = 0.05) -> int:
        """Reads what arrived; how many dead letters that was."""
        n = 0
        for m in self._c.consume(500, timeout):
            if m.error() is None:
                n += 1
                self.keys.add(record_key(headers_of(m.headers() or []), m.value()))
        self.records += n
        return n

    def drain(self) -> None:
        """Poll until a poll brings nothing: what the DLQ holds now, all counted."""
        while self.poll(0.5):
            pass

    def close(self) -> None:
        self._c.close()


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="scripts/demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--orders", "-n", type=int, default=200)
    ap.add_argument("--fail-rate", type=float, default=0.5,
                    help="chance that an attempt fails (retryable)")
    ap.add_argument("--kills", "-k", type=int, default=3,
                    help="SIGKILLs of a random worker at random moments")
    ap.add_argument("--processes", "-p", type=int, default=2)
    ap.add_argument("--bootstrap", "-b", metavar="HOST:PORT",
                    help="use this broker (default: start one, and remove it at the end)")
    ap.add_argument("--config", type=Path, metavar="FILE",
                    help="how to reach --bootstrap: client properties (key=value, as Kafka's "
                         "--command-config: TLS, mTLS, SASL) or a kworkers.toml")
    ap.add_argument("--without-receiver", action="store_true",
                    help="charge without the idempotent receiver: shows the double charge")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--workdir", type=Path, default=None,
                    help="keep the charges database, markers and logs here (kept after the run)")
    args = ap.parse_args(argv)
    if args.orders < 3:
        ap.error("--orders must be >= 3")
    if not 0.0 <= args.fail_rate <= 0.95:
        ap.error("--fail-rate must be within 0 and 0.95")
    if args.kills < 0 or args.processes < 1:
        ap.error("--kills must be >= 0 and --processes >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    console = Console()
    broker: Any = None
    tmp = args.workdir or Path(tempfile.mkdtemp(prefix="kworkers-demo-"))
    tmp.mkdir(parents=True, exist_ok=True)
    demo = Demo(args, console)
    ok = False
    try:
        bootstrap = args.bootstrap
        if args.config is not None and bootstrap is None:
            raise DemoFailed("--config says how to reach a broker: name it with --bootstrap")
        if bootstrap is None:
            console.print("starting a Kafka broker for the demo (about 30 s; pass --bootstrap "
                          "to use yours)")
            broker = broker_from_env(own=True)
            broker.start()
            bootstrap = broker.bootstrap_servers
            console.print(f"broker ready at {bootstrap}")
        try:
            client = settings.client_settings(settings.client_flags(bootstrap, ()), {},
                                              args.config)
        except ConfigError as exc:
            raise DemoFailed(str(exc)) from None
        report = demo.run(client, tmp)
        mode = "without the receiver" if args.without_receiver else "with the receiver"
        console.print(report.table(mode))
        console.print(report.verdict(), style="bold green" if report.ok else "bold red")
        if args.without_receiver and report.twice:
            console.print("a worker died after charging and before committing its offset; the "
                          "redelivered order was charged again. Run without "
                          "--without-receiver: the same kill charges nothing twice.")
        ok = report.ok
        return 0 if ok else 1
    except DemoFailed as exc:
        console.print(f"[bold red]demo failed:[/] {exc}")
        for s in demo.slots:
            console.print(f"--- worker {s.index} log ({s.log_path}):\n{s.log_tail()}")
        return 2
    finally:
        demo.close()
        if broker is not None:
            with contextlib.suppress(Exception):
                broker.close()
        if ok and args.workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            console.print(f"logs and the charges database are kept in {tmp}")


if __name__ == "__main__":
    sys.exit(main())
