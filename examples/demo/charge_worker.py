"""One worker of the demo pool: charges each order once, through kworkers' idempotent receiver.

    python examples/demo/charge_worker.py --bootstrap B --topic T --group G --db PATH
        [--fail-rate R] [--flag PATH] [--kill-after-charge KEY --markers DIR]
        [--without-receiver]

The effect is a charge: a row appended to ``charges`` (no unique key: charging is not
idempotent, exactly like a payment provider's API). With the receiver (the default) the worker
runs under ``Worker(idempotency=store)`` and charges through ``store.apply_once``, so the charge
row and the key's done-mark commit in one transaction: a redelivery finds the key done and
charges nothing. ``--without-receiver`` charges directly, as seed 003's first version does.

``--kill-after-charge KEY`` makes the double charge certain rather than likely: the process
SIGKILLs itself right after KEY's charge is committed and before its offset is, once (a marker
file in ``--markers`` remembers it), so KEY is always delivered again after a restart.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

from kworkers import Message, RetryableError, RetryPolicy, TierLadder, Worker, activity, settings
from kworkers.idempotency import SqliteStore

#: Short tiers and few attempts: retries are visible within seconds, and with a 50% failure rate
#: about one order in sixteen exhausts its attempts and is dead-lettered (then redriven).
TIERS = TierLadder((0.25, 0.5, 1.0))
RETRY = RetryPolicy(initial=0.5, backoff=2.0, max_interval=2.0, max_attempts=4)
#: Classic protocol with a short session: a killed worker's partitions move on after ~6 s.
CONSUMER_CONFIG: dict[str, str | int | float | bool] = {
    "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
}
LEASE_S = 5.0
CHARGES = """CREATE TABLE IF NOT EXISTS charges (
    order_key TEXT NOT NULL, amount_cents INTEGER NOT NULL, pid INTEGER NOT NULL)"""


def charge(conn: Any, key: str, amount_cents: int) -> None:
    """The non-idempotent effect: every call is one more charge."""
    conn.execute("INSERT INTO charges VALUES (?, ?, ?)", (key, amount_cents, os.getpid()))


def _kill_once(markers: Path, key: str) -> None:
    try:
        fd = os.open(markers / key.replace("/", "_"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    print(f"killing myself after charging {key}, before its offset is committed", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="charge_worker.py")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--config", help="client properties or kworkers.toml: TLS, SASL")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--db", required=True, help="SQLite file: the store and the charges")
    ap.add_argument("--fail-rate", type=float, default=0.0)
    ap.add_argument("--flag", help="failures stop once this file exists")
    ap.add_argument("--kill-after-charge", metavar="KEY")
    ap.add_argument("--markers", type=Path)
    ap.add_argument("--without-receiver", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(name)s %(message)s")
    store = SqliteStore(args.db)
    with store.atomic() as conn:
        conn.execute(CHARGES, ())
    local = threading.local()  # handlers run on several threads: a connection each

    def plain() -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = sqlite3.connect(args.db, timeout=60, isolation_level=None)
        return conn

    rnd = random.Random()
    client = settings.client_settings(settings.client_flags(args.bootstrap, ()), {}, args.config)
    worker = Worker(topics=[args.topic], group_id=args.group,
                    bootstrap_servers=client.bootstrap_servers,
                    client_config=client.properties,
                    retry=RETRY, tiers=TIERS, consumer_config=CONSUMER_CONFIG,
                    drain_timeout=10.0,
                    idempotency=None if args.without_receiver else store,
                    # a killed worker's lease on an unfinished order blocks that order (the
                    # record is retried later) until the lease expires: keep it short here
                    lease_s=LEASE_S)

    @worker.handler
    def handle(msg: Message) -> None:
        key = activity.idempotency_key()  # "<order>/charge", the same on every attempt
        amount = int(json.loads(msg.value or b"{}").get("amount_cents", 0))
        if args.fail_rate and not (args.flag and Path(args.flag).exists()) \
                and rnd.random() < args.fail_rate:
            raise RetryableError("PaymentGatewayBusy", f"attempt {msg.attempt}")
        if args.without_receiver:
            charge(plain(), key, amount)  # autocommit: charged, whatever happens next
        else:
            store.apply_once(key, lambda conn: charge(conn, key, amount))
        if args.kill_after_charge == key and args.markers is not None:
            _kill_once(args.markers, key)

    print("worker ready", flush=True)
    worker.run()
    print("worker stopped cleanly", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
