"""A worker for the liveness suite: every handler start goes to an append-only ledger (pid and
time), served the way ``kworkers run`` serves it (``/readyz``, ``/healthz``, ``/metrics``).

    python -m tests.apps.backlog_worker BOOTSTRAP TOPIC GROUP --ledger PATH [options]

``--skip-resume`` is the canary: the consumer ignores every resume of the main group's
partitions, as a worker that assumed a partition's pause state instead of setting it would (a
partition paused by backpressure is then never fetched again). ``--sync-commit`` is the frozen
broker's canary: every commit is sent synchronously on the poll thread, as before issue #27,
so a frozen broker holds the loop (and SIGTERM) until it answers.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from kworkers import Message, Worker
from kworkers.activity import ActivityInvoker
from kworkers.cli.run import run_one
from kworkers.kafka.settings import consumer_settings
from kworkers.memory import parse_bytes
from kworkers.testing.instruments import RecordingInvoker
from kworkers.testing.ledger import Ledger
from tests.apps.adapters import KafkaConsumerAdapter, raw_client


class SkipsResume:
    """The real adapter, except that ``resume`` does nothing (the canary's bug)."""

    def __init__(self, inner: KafkaConsumerAdapter) -> None:
        self._inner = inner
        self.group = inner.group

    def resume(self, tps: list[tuple[str, int]]) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class CommitsSynchronously:
    """The real adapter, except that a commit is sent synchronously, on the poll thread, and
    its outcome reported at once: what every commit did before issue #27."""

    def __init__(self, inner: KafkaConsumerAdapter) -> None:
        self._inner = inner
        self.group = inner.group
        self._results: list[Any] = []

    def commit_async(self, positions: dict[tuple[str, int], int]) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        tps = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
        try:
            raw_client(self._inner).commit(offsets=tps, asynchronous=False)
            self._results.append((dict(positions), None))
        except KafkaException as exc:
            self._results.append((dict(positions), exc))

    def commit_results(self) -> list[Any]:
        out = self._inner.commit_results() + self._results
        self._results = []
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("topic")
    ap.add_argument("group")
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--slow-ms", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-in-flight", type=int, default=300)
    ap.add_argument("--per-partition", type=int, default=200)
    ap.add_argument("--max-in-flight-bytes", default=None,
                    help="the byte bound (issue #45), such as 64KiB; unset: the default")
    ap.add_argument("--protocol", default="classic")
    ap.add_argument("--metrics-port", type=int, default=0)
    ap.add_argument("--stall-timeout", type=float, default=None)
    ap.add_argument("--skip-resume", action="store_true")
    ap.add_argument("--sync-commit", action="store_true")
    ap.add_argument("--drain-timeout", type=float, default=5.0)
    ap.add_argument("--revoke-timeout", type=float, default=5.0)
    ap.add_argument("--session-ms", type=int, default=6000)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(name)s %(message)s")
    ledger = Ledger(args.ledger)
    consumer_config: dict[str, Any] = {}
    if args.protocol == "classic":
        consumer_config = {"session.timeout.ms": args.session_ms, "heartbeat.interval.ms": 500}
    bytes_bound: dict[str, Any] = ({} if args.max_in_flight_bytes is None else  # **settings
                                   {"max_in_flight_bytes": parse_bytes(args.max_in_flight_bytes)})
    worker = Worker(
        topics=[args.topic], group_id=args.group, bootstrap_servers=args.bootstrap,
        group_protocol=args.protocol, consumer_config=consumer_config,
        concurrency=args.concurrency, max_in_flight=args.max_in_flight,
        max_in_flight_per_partition=args.per_partition, stall_timeout=args.stall_timeout,
        **bytes_bound,
        revoke_timeout=args.revoke_timeout, drain_timeout=args.drain_timeout,
        invoke=RecordingInvoker(ledger, ActivityInvoker()),
        consumer=(_factory(args, consumer_config) if args.skip_resume or args.sync_commit
                  else None),
    )

    @worker.handler
    def handle(msg: Message) -> None:
        time.sleep(args.slow_ms / 1000)

    worker.create_topics()  # idempotent; an injected consumer skips run's pre-flight
    print("worker ready", flush=True)
    return run_one(worker, args.metrics_port)


def _factory(args: argparse.Namespace, overrides: dict[str, Any]) -> Any:
    def make(group: str) -> Any:
        cfg = consumer_settings(args.bootstrap, group, args.protocol, overrides)
        real = KafkaConsumerAdapter(cfg)
        if group != args.group:
            return real
        return SkipsResume(real) if args.skip_resume else CommitsSynchronously(real)

    return make


if __name__ == "__main__":
    sys.exit(main())
