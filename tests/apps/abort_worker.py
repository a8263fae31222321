"""A worker whose process aborts in native code once, run as an operator runs it:
``kworkers run tests.apps.abort_worker:worker [--processes N]`` with
``KWORKERS_BOOTSTRAP_SERVERS``, ``KWORKERS_TOPICS`` and ``KWORKERS_GROUP_ID`` set.

The first process to meet the record whose value is ``abort`` calls ``os.abort()`` (SIGABRT,
what librdkafka's failed assertion does: ``rd_kafka_enq_once_del_source_return: Assertion
'eonce->refcnt > 0' failed``, issue #43), once across restarts (a marker file in
``ABORT_WORKER_DIR``). Every record is appended to the ledger ``ABORT_WORKER_DIR/ledger.db``
first (an effect row each time a handler runs: at least once), so the test reads back that
nothing was lost. ``ABORT_WORKER_CANARY=no-faulthandler``: the canary, with Python's
``faulthandler`` off again, so the abort leaves no stack behind.
"""

from __future__ import annotations

import faulthandler
import os
from pathlib import Path

from kworkers import Message, Worker
from kworkers.testing.ledger import Ledger

DIR = Path(os.environ.get("ABORT_WORKER_DIR", "."))
LEDGER = Ledger(DIR / "ledger.db")
if os.environ.get("ABORT_WORKER_CANARY") == "no-faulthandler":
    faulthandler.disable()

worker = Worker(topics=["placeholder"], group_id="placeholder", drain_timeout=2.0)


@worker.handler
def handle(msg: Message) -> None:
    value = (msg.value or b"").decode()
    LEDGER.apply(value, msg)
    if value == "abort":
        try:
            fd = os.open(DIR / "aborted", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return  # aborted once already: this run goes through
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os.abort()
