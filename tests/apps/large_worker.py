"""A worker for the byte-bound tests (issue #45), run as ``kworkers run
tests.apps.large_worker:worker`` (bootstrap, topic, group and every bound from ``KWORKERS_*``).

Its handler is slow (``LARGE_SLOW_MS`` a record) and records every call in an append-only
ledger (``LARGE_LEDGER``, a SQLite file: one row per delivery, ``RecordingInvoker``), so a test
counts from the ledger which records ran, how often, on which partition.
"""

from __future__ import annotations

import os
import time

from kworkers import Message, Worker
from kworkers.activity import ActivityInvoker
from kworkers.testing.instruments import RecordingInvoker
from kworkers.testing.ledger import Ledger

SLOW_S = float(os.environ.get("LARGE_SLOW_MS", "50")) / 1000
ledger = Ledger(os.environ.get("LARGE_LEDGER", "/tmp/large-ledger.db"))

worker = Worker(topics=["placeholder"], group_id="placeholder", concurrency=8,
                invoke=RecordingInvoker(ledger, ActivityInvoker()))


@worker.handler
def handle(msg: Message) -> None:
    time.sleep(SLOW_S)
