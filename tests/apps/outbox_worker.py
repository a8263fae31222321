"""A worker with a transactional outbox, run by ``kworkers run`` in the outbox kill test
(``tests/faults/test_outbox_kill.py``).

    kworkers run tests.apps.outbox_worker:worker -b BOOTSTRAP --topic SRC --group G

Each record's effect is a row appended to ``effects`` (no unique key: an append-only ledger,
so an effect applied twice shows twice) and the record announcing it is an outbox row to
``KW_OUTBOX_OUT``, keyed by the idempotency key (what consumers dedupe on). Both go through
``store.apply_once`` under ``Worker(idempotency=store, outbox=outbox)``; the relay is the
worker's, started by ``kworkers run``.

Environment: ``KW_OUTBOX_DB`` (the SQLite file: store, outbox, effects), ``KW_OUTBOX_OUT``,
``KW_OUTBOX_KILL`` (an idempotency key: the process SIGKILLs itself right after that key's
transaction committed, before its offset is, once: a marker file in ``KW_OUTBOX_MARKERS``
remembers it), ``KW_OUTBOX_MODE``: ``together`` (the effect and its outbox row in one
transaction: what the README shows) or ``apart`` (the canary: the row enqueued in a
transaction of its own after the effect's, so the kill between them loses the record).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from kworkers import Message, TierLadder, Worker, activity
from kworkers.idempotency import Outbox, SqliteStore

DB = os.environ["KW_OUTBOX_DB"]
OUT = os.environ["KW_OUTBOX_OUT"]
MODE = os.environ.get("KW_OUTBOX_MODE", "together")
KILL = os.environ.get("KW_OUTBOX_KILL")
MARKERS = Path(os.environ.get("KW_OUTBOX_MARKERS", "."))

store = SqliteStore(DB)
with store.atomic() as conn:
    conn.execute("CREATE TABLE IF NOT EXISTS effects (k TEXT NOT NULL, pid INTEGER NOT NULL)",
                 ())
#: a short lease: a killed relay's claimed rows go to the next one within 2 s
outbox = Outbox(store, lease_s=2.0)
worker = Worker(topics=["placeholder"], group_id="placeholder", idempotency=store,
                outbox=outbox, lease_s=3.0, tiers=TierLadder((0.25,)), drain_timeout=5.0,
                # static membership: a restarted process takes its partitions back at once
                consumer_config={"group.instance.id": f"outbox-{os.environ.get('KW_SLOT', 0)}",
                                 "session.timeout.ms": 10_000})


def _kill_once(key: str) -> None:
    try:
        fd = os.open(MARKERS / key.replace("/", "_"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


@worker.handler
def handle(msg: Message) -> None:
    key = activity.idempotency_key()

    def effect(conn: Any) -> None:
        conn.execute("INSERT INTO effects VALUES (?, ?)", (key, os.getpid()))
        if MODE == "together":
            outbox.enqueue(conn, OUT, key.encode(), msg.value)

    store.apply_once(key, effect)
    if key == KILL:
        _kill_once(key)
    if MODE == "apart":
        with store.atomic() as conn:
            outbox.enqueue(conn, OUT, key.encode(), msg.value)
