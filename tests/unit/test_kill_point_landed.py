"""An ``after-complete`` kill point another lane's kill leaves unfired, and what counts as landed.

Broker-less: one process of the fault suite's kind (``StoreProbe`` over a store, the
``--complete-marks`` hook, kill points) completes two keys on two threads and SIGKILLs itself
at the first key's ``after-complete`` while the second key's ``complete`` has returned and its
own step is not reached yet (its mark is being written). The second key is done in the store
and has no marker, and nothing can ever give it one: every later claim answers DONE before
the step. The Redis kill loop waited for every marker and never ended
(``tests/faults/support.kill_point_landed``).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from kworkers.testing.instruments import KillPoint
from tests.faults.support import kill_point_landed

ROOT = str(Path(__file__).resolve().parents[2])

#: the worker's completion path, as ledger_worker wires it, on two lanes
_WORKER = textwrap.dedent("""
    import sys, threading
    from kworkers.idempotency import SqliteStore
    from kworkers.testing.instruments import KillPoint, StoreProbe

    db, markers = sys.argv[1], sys.argv[2]
    kills = [KillPoint("a@after-complete", markers), KillPoint("b@after-complete", markers)]
    b_completed, b_marking = threading.Event(), threading.Event()

    def completed(key):  # ledger_worker's hook: the complete mark, then the kill points
        if key == "b":
            b_completed.set()
            b_marking.wait()  # the mark's write, slow on a loaded ledger: never ends here
        for k in kills:
            k.at("after-complete", key)

    store = StoreProbe(SqliteStore(db), on_complete=completed)
    owner = "host:%d:tag" % __import__("os").getpid()
    a, b = (store.claim(k, owner, 30.0, 0.0) for k in "ab")
    threading.Thread(target=store.complete, args=("b", b.token, 1.0), daemon=True).start()
    b_completed.wait()
    store.complete("a", a.token, 1.0)  # a's kill point: SIGKILL, b's lane with it
    sys.exit("not killed")
""")


def _completed_by(db: Path) -> Callable[[str], int | None]:
    def pid(key: str) -> int | None:
        with sqlite3.connect(db) as c:
            row = c.execute("SELECT owner, status FROM kworkers_idempotency WHERE key = ?",
                            (key,)).fetchone()
        return int(row[0].split(":")[1]) if row is not None and row[1] == "done" else None

    return pid


def test_a_kill_between_another_keys_complete_and_its_step_lands_that_point(
        tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    db = tmp_path / "store.db"
    proc = subprocess.run([sys.executable, "-c", _WORKER, str(db), str(markers)], cwd=ROOT,
                          capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    a, b = KillPoint("a@after-complete", markers), KillPoint("b@after-complete", markers)
    done_by = _completed_by(db)
    assert a.fired() and not b.fired()  # b can never fire: its key is done
    assert done_by("b") is not None
    victim = done_by("a")
    assert victim is not None
    # waiting for the markers (the loop's old end condition) never ends; b landed all the same
    assert kill_point_landed(b, done_by, {victim})
    # canaries: a key done by a process that did not die, a point of another step
    assert not kill_point_landed(b, done_by, set())
    assert not kill_point_landed(KillPoint("b@after-effect", markers), done_by, {victim})
    assert not kill_point_landed(KillPoint("c@after-complete", markers), done_by, {victim})
