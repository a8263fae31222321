"""``Worker(outbox=...)`` under SIGKILL (issue #46): the effect and the record announcing it,
each once (the record at least once, deduplicated by its key downstream).

``kworkers run tests.apps.outbox_worker:worker`` (its relay started by ``kworkers run``) on the
session broker: 30 activities on 2 partitions; the worker SIGKILLs itself right after one
key's transaction committed (effect and outbox row) and before its offset did, and is SIGKILLed
from outside once half the records are out (the relay is sending: rows sent and not yet
deleted go out again); each time it is started again (static
membership: it takes its partitions back at once). Judged from what is read back, never from
the worker's counters: the ``effects`` ledger (append-only: an effect twice shows twice), the
output topic read from its start (read_committed), the outbox table (empty at the end: every
row relayed), the group's committed offsets.

The canary runs the same kills with the record enqueued in a transaction of its own after the
effect's (``KW_OUTBOX_MODE=apart``), killed only by itself, between the two: the record is
lost, and the judge finds it missing.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from kworkers.testing import Broker
from kworkers.testing.broker import free_port
from kworkers.testing.workload import (
    committed_total,
    make_topic,
    produce_activities,
    read_all,
    unique,
)
from tests.integration.conftest import wait_for
from tests.integration.test_cli_support import ROOT

N = 30


def judge(expected: list[str], effects: Counter[str], records: Counter[str]) -> list[str]:
    """Every key's effect exactly once, its record at least once, nothing from nowhere."""
    out = [f"effect of {k} applied {effects[k]} times" for k in expected if effects[k] != 1]
    out += [f"record of {k} missing" for k in expected if records[k] < 1]
    out += [f"{k} from nowhere" for k in (effects.keys() | records.keys()) - set(expected)]
    return out


def test_the_judge_finds_each_kind_of_problem() -> None:
    keys = ["a", "b", "c"]
    assert judge(keys, Counter(keys), Counter([*keys, "a"])) == []  # a record twice: deduped
    assert judge(keys, Counter(["a", "b", "b", "c"]), Counter(["a", "c", "x"])) == [
        "effect of b applied 2 times", "record of b missing", "x from nowhere"]
    assert judge(keys, Counter(), Counter()) != []  # an empty run proves nothing


def _rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(db, timeout=30) as conn:
        return conn.execute(sql).fetchall()


class Pool:
    """One ``kworkers run`` process at a time, started again whenever it died."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.env, self.log = args, env, log
        self.starts = 0
        self.p: subprocess.Popen[str] | None = None
        self.port = 0

    def keep_up(self) -> None:
        if self.p is None or self.p.poll() is not None:
            self.port = free_port()
            with self.log.open("a") as out:
                self.p = subprocess.Popen([sys.executable, "-m", "kworkers.cli", "run",
                                           *self.args, "--metrics-port", str(self.port)],
                                          env=self.env, cwd=ROOT, stdout=out,
                                          stderr=subprocess.STDOUT, text=True)
            self.starts += 1

    def ready(self) -> bool:
        """The process runs its loops (and so handles SIGTERM as a drain)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz",
                                        timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        if self.p is not None and self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait(30)

    def stop(self) -> int | None:
        if self.p is None or self.p.poll() is not None:
            return None
        self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            raise


def _run(bs: str, tmp_path: Path, mode: str) -> tuple[list[str], list[str], list[str]]:
    src, out, group = make_topic(bs, unique("ob-src"), 2), unique("ob-out"), unique("g")
    make_topic(bs, out, 2)
    keys = produce_activities(bs, src, N, "order")
    db, markers = tmp_path / "app.db", tmp_path / "markers"
    markers.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KW_OUTBOX_DB": str(db),
           "KW_OUTBOX_OUT": out, "KW_OUTBOX_MODE": mode, "KW_OUTBOX_KILL": keys[N // 3],
           "KW_OUTBOX_MARKERS": str(markers)}
    pool = Pool(["tests.apps.outbox_worker:worker", "-b", bs, "--topic", src, "--group",
                 group], env, tmp_path / "run.log")
    #: the canary needs only its self-kill: the record lost there is certain
    outside_kill = mode != "together"

    def settled() -> bool:
        pool.keep_up()
        nonlocal outside_kill
        if not outside_kill:
            if len({k for k, _v, _h in read_all(bs, out, 1.5)}) >= N // 2:
                pool.kill()  # from outside, while the relay sends the rest
                outside_kill = True
            return False
        try:
            if _rows(db, "SELECT COUNT(*) FROM kworkers_outbox")[0][0] != 0:
                return False
            done = len({r[0] for r in _rows(db, "SELECT k FROM effects")})
        except sqlite3.OperationalError:  # not made yet by the first process
            return False
        return done == N and committed_total(bs, group, src, 2) == N and pool.ready()

    try:
        wait_for(settled, 120, "every effect applied, relayed and committed")
    finally:
        code = pool.stop()
    effects = [str(r[0]) for r in _rows(db, "SELECT k FROM effects")]
    records = [(k or b"").decode() for k, _v, _h in read_all(bs, out, 5)]
    print(f"{mode}: starts {pool.starts}, effects {len(effects)}, records {len(records)} "
          f"({len(records) - len(set(records))} again, deduplicated by key)")
    assert (markers / keys[N // 3].replace("/", "_")).exists()  # the self-kill happened
    assert pool.starts >= (3 if mode == "together" else 2)  # each death followed by a start
    assert code == 0, (tmp_path / "run.log").read_text()[-3000:]
    return keys, effects, records


@pytest.mark.parametrize("mode", ["together", "apart"], ids=["outbox", "canary"])
def test_the_effect_and_its_record_each_once_under_sigkill(kafka_broker: Broker,
                                                           tmp_path: Path, mode: str) -> None:
    keys, effects, records = _run(kafka_broker.bootstrap_servers, tmp_path, mode)
    found = judge(keys, Counter(effects), Counter(records))
    if mode == "together":
        assert found == [], found
        return
    assert f"record of {keys[N // 3]} missing" in found, found
