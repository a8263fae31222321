"""A worker process for the fault suite: every delivery and every application of the effect
goes to the append-only ledger, and the checker judges what happened.

    python -m tests.apps.ledger_worker BOOTSTRAP TOPIC GROUP --ledger PATH [options]

Effects (``--effect``):

- ``plain``: ``ledger.apply`` after the record, no idempotent receiver (at least once);
- ``txn``: ``store.apply_once(key, ledger.apply_in)``: the ledger lives in the store's database
  and its row commits with the done-mark (exactly once); ``--claim`` also runs the lease claim
  (``Worker(idempotency=store)``), the way the README shows it;
- ``lease``: the worker claims the key with a lease (``Worker(idempotency=store)``), the effect
  is ``ledger.apply`` outside the store, then the invoker completes the key;
- ``fire-and-forget``: the canary that commits before its effect: the handler returns at once
  and the effect runs later on a thread.

A record's key is its activity's idempotency key (headers), else its value. ``--hold PATH``
holds every handler before its effect while PATH exists (a result made late on purpose). Kill points
(``--kill KEY@STEP``, repeatable, ``KEY`` may be ``*``) make a crash certain:
``before-effect``, ``after-heartbeat`` (``--heartbeats 3`` first), ``after-effect`` (lease,
plain: the effect row is committed; txn: inside the transaction, before it commits),
``after-complete`` (the key is done, the offset not yet committed) and ``after-commit``
(fire-and-forget: the offset is committed, the effect not yet applied).

``--broken MODE``: the canaries of the checker's findings, a consumer that seeks back below
its commits, skips a record, drops a killed process's work or commits backwards
(``tests/apps/broken_consumer.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import logging
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from kworkers import Message, RetryableError, RetryPolicy, TierLadder, Worker, activity
from kworkers.activity import ActivityInvoker
from kworkers.idempotency import IdempotencyStore, TransactionalStore, open_store
from kworkers.testing.instruments import KillPoint, RecordingInvoker, StoreProbe, message_key
from kworkers.testing.ledger import Ledger
from tests.apps.broken_consumer import MODES, factory


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("topic")
    ap.add_argument("group")
    ap.add_argument("--ledger", help="standalone ledger file (plain, lease, fire-and-forget)")
    ap.add_argument("--ledger-table", default="kworkers_ledger")
    ap.add_argument("--store", help="idempotency store URL")
    ap.add_argument("--effect", default="plain",
                    choices=["plain", "txn", "lease", "fire-and-forget"])
    ap.add_argument("--claim", action="store_true", help="txn: also claim with a lease")
    ap.add_argument("--broken-claim", action="store_true",
                    help="canary: the store's claim always answers ACQUIRED")
    ap.add_argument("--kill", action="append", default=[], metavar="KEY@STEP")
    ap.add_argument("--markers", help="directory of the kill points' markers")
    ap.add_argument("--heartbeats", type=int, default=0)
    ap.add_argument("--hold", metavar="PATH",
                    help="each handler waits, before its effect, while this file exists "
                         "(and touches PATH.<key> when it starts waiting)")
    ap.add_argument("--fail-rate", type=float, default=0.0)
    ap.add_argument("--slow-ms", type=float, default=0.0)
    ap.add_argument("--ordering", default="partition")
    ap.add_argument("--protocol", default="classic")
    ap.add_argument("--async", dest="use_async", action="store_true")
    ap.add_argument("--lease-s", type=float, default=3.0)
    ap.add_argument("--session-timeout-ms", type=int, default=6000)
    ap.add_argument("--no-fencing", action="store_true",
                    help="canary: self-fencing off (a member cut off runs on)")
    ap.add_argument("--consumer", action="append", default=[], metavar="NAME=VALUE",
                    help="extra consumer setting")
    ap.add_argument("--complete-marks", action="store_true",
                    help="lease mode: a row in the ledger's table COMPLETES each time the "
                         "store's complete returned (which keys a kill left between effect "
                         "and complete)")
    ap.add_argument("--broken", choices=MODES,
                    help="canary: the main group's consumer is broken this way "
                         "(tests/apps/broken_consumer.py)")
    return ap.parse_args(argv)


#: the table of ``--complete-marks`` (beside the ledger's own, in the same file)
COMPLETES = "kworkers_completes"


def _setting(text: str) -> tuple[str, str | int]:
    name, _, value = text.partition("=")
    return name, int(value) if value.lstrip("-").isdigit() else value


class _FireAndForget:
    """The bug the loss canary plants: the offset completes (and commits) before the effect."""

    def __init__(self, args: argparse.Namespace, ledger: Ledger, kills: list[KillPoint]) -> None:
        self.args = args
        self.ledger = ledger
        self.kills = kills
        self.threads: list[threading.Thread] = []

    def _committed_past(self, msg: Message) -> bool:
        c = Consumer({"bootstrap.servers": self.args.bootstrap, "group.id": self.args.group,
                      "log_level": 3})
        try:
            tp = c.committed([TopicPartition(msg.topic, msg.partition)], timeout=5)[0]
            return int(tp.offset) > msg.offset
        finally:
            c.close()

    def later(self, key: str, msg: Message) -> None:
        def run() -> None:
            if any(k.key == key and k.step == "after-commit" for k in self.kills):
                while not self._committed_past(msg):
                    time.sleep(0.1)
            for k in self.kills:
                k.at("after-commit", key)
            self.ledger.apply(key, msg)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.threads.append(t)

    def join(self) -> None:
        """At a clean stop, the effects still on their way are applied before exiting."""
        for t in self.threads:
            t.join()


def main(argv: list[str] | None = None) -> int:
    # a crash in native code (librdkafka's failed assertion after a broker's hard restart,
    # RELIABILITY row 24) leaves every thread's Python stack in the log, as `kworkers run`'s
    faulthandler.enable(all_threads=True)
    args = _parse(argv)
    # KWORKERS_TEST_LOG_LEVEL=INFO: rebalances and commits in the workers' logs, to read a
    # fault run after the fact
    logging.basicConfig(level=os.environ.get("KWORKERS_TEST_LOG_LEVEL", "WARNING"),
                        stream=sys.stderr, format="%(asctime)s %(process)d %(name)s %(message)s")
    if os.environ.get("KWORKERS_TEST_COMMIT_LOG"):
        # the evidence of a fault run (tests/faults/support.py::commit_trail): every commit
        # sent and answered, and the partitions given and taken, whatever the level above
        logging.getLogger("kworkers.consumer").setLevel(logging.INFO)
        logging.getLogger("kworkers.consumer.commits").setLevel(logging.DEBUG)
    kills = [KillPoint(spec, args.markers) for spec in args.kill]

    def at(step: str, key: str) -> None:
        for k in kills:
            k.at(step, key)

    store: Any = open_store(args.store) if args.store else None
    if args.effect in ("txn", "lease") and store is None:
        raise SystemExit(f"--effect {args.effect} needs --store")
    if args.effect == "txn":
        ledger = Ledger.on_store(store, table=args.ledger_table)
    else:
        if not args.ledger:
            raise SystemExit(f"--effect {args.effect} needs --ledger")
        ledger = Ledger(args.ledger, table=args.ledger_table)

    claims: IdempotencyStore | None = None
    marks = (Ledger(args.ledger, table=COMPLETES)
             if args.complete_marks and args.ledger else None)

    def completed(key: str) -> None:
        if marks is not None:
            marks.apply(key, note="complete")
        at("after-complete", key)

    if args.effect == "lease" or (args.effect == "txn" and args.claim):
        claims = StoreProbe(store, on_complete=completed,
                            claim_always_acquired=args.broken_claim)
    invoker = RecordingInvoker(ledger, ActivityInvoker(claims, lease_s=args.lease_s))
    extra: dict[str, Any] = dict(_setting(s) for s in args.consumer)
    if os.environ.get("KWORKERS_TEST_CLIENT_DEBUG"):  # librdkafka's debug contexts, e.g. cgrp
        extra.setdefault("debug", os.environ["KWORKERS_TEST_CLIENT_DEBUG"])
    if args.protocol == "classic":
        extra.setdefault("session.timeout.ms", args.session_timeout_ms)
        extra.setdefault("heartbeat.interval.ms", 500)
    worker = Worker(
        topics=[args.topic], group_id=args.group, bootstrap_servers=args.bootstrap,
        ordering=args.ordering, group_protocol=args.protocol, consumer_config=extra,
        retry=RetryPolicy(initial=0.2, backoff=2.0, max_interval=1.0, max_attempts=100),
        tiers=TierLadder((0.25, 0.5, 1.0)), drain_timeout=20.0, invoke=invoker,
        self_fencing=not args.no_fencing,
        consumer=None if args.broken is None else factory(
            args.bootstrap, args.group, args.broken, args.markers, args.protocol, extra),
    )
    rnd = random.Random()
    later = _FireAndForget(args, ledger, kills)

    def effect(msg: Message) -> None:
        key = activity.idempotency_key() if msg.header("kw-workflow-id") else message_key(msg)
        if args.hold and os.path.exists(args.hold):
            # says which record it holds (a file beside the hold file), then waits
            Path(f"{args.hold}.{key.replace('/', '_')}").touch()
            while os.path.exists(args.hold):
                time.sleep(0.05)
        at("before-effect", key)
        if args.heartbeats:
            ledger.apply(f"seen/{key}/{activity.attempt()}",
                         note=(activity.heartbeat_details() or b"").decode())
            for i in range(1, args.heartbeats + 1):
                activity.record_heartbeat(f"ckpt-{i}".encode())
            at("after-heartbeat", key)
        if args.fail_rate and rnd.random() < args.fail_rate:
            raise RetryableError("Flaky", "injected failure")
        if args.effect == "fire-and-forget":
            later.later(key, msg)
            return
        if args.effect == "txn":
            txn: TransactionalStore[Any] = store

            def apply(conn: Any) -> None:
                ledger.apply_in(conn, key, msg)
                at("after-effect", key)  # inside the transaction: a kill rolls it back

            txn.apply_once(key, apply)
            at("after-complete", key)
            return
        ledger.apply(key, msg)
        at("after-effect", key)

    if args.use_async:
        @worker.handler
        async def handle_async(msg: Message) -> None:
            if args.slow_ms:
                await asyncio.sleep(args.slow_ms / 1000)
            effect(msg)
    else:
        @worker.handler
        def handle(msg: Message) -> None:
            if args.slow_ms:
                time.sleep(args.slow_ms / 1000)
            effect(msg)

    worker.create_topics()  # idempotent; several workers may race to it
    print("worker ready", flush=True)
    worker.run()
    later.join()
    print("worker stopped cleanly", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
