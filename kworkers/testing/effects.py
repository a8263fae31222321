"""An effects ledger for fault tests and the demo, and the checker that reads it.

Every handler call appends a row to ``deliveries`` (so redeliveries are visible); the effect
itself is a row in ``effects`` with a unique key (the idempotent receiver in its simplest form).
The checker compares both with what was produced and with the committed offsets, and names
the classes of error Jepsen and Kafka's system tests look for: lost, duplicate effects,
redeliveries (allowed, counted), and commits ahead of handled work.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    value TEXT NOT NULL, topic TEXT NOT NULL, part INTEGER NOT NULL, off INTEGER NOT NULL,
    attempt INTEGER NOT NULL, pid INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS effects (
    key TEXT PRIMARY KEY, value TEXT NOT NULL, pid INTEGER NOT NULL, at REAL NOT NULL);
"""


def _wal(conn: sqlite3.Connection) -> None:
    """Switch to WAL once; the switch does not wait on other processes' locks, so retry."""
    deadline = time.monotonic() + 60
    while str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
        try:
            conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


class Ledger:
    """Thread-safe, multi-process safe (SQLite WAL); one connection per thread."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._local = threading.local()
        with self._conn() as c:
            c.executescript(SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            _wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    def delivered(self, value: str, topic: str, part: int, off: int, attempt: int) -> None:
        self._conn().execute(
            "INSERT INTO deliveries VALUES (?,?,?,?,?,?,?)",
            (value, topic, part, off, attempt, os.getpid(), time.time()))

    def apply_once(self, key: str, value: str) -> bool:
        """The effect: applied once per key whatever the number of deliveries."""
        cur = self._conn().execute(
            "INSERT OR IGNORE INTO effects VALUES (?,?,?,?)",
            (key, value, os.getpid(), time.time()))
        return cur.rowcount == 1

    def counts(self) -> tuple[int, int]:
        c = self._conn()
        deliveries = c.execute("SELECT COUNT(*) FROM deliveries").fetchone()[0]
        effects = c.execute("SELECT COUNT(*) FROM effects").fetchone()[0]
        return int(deliveries), int(effects)

    def effect_values(self) -> list[str]:
        return [r[0] for r in self._conn().execute("SELECT value FROM effects")]

    def delivery_counts(self) -> dict[str, int]:
        rows = self._conn().execute("SELECT value, COUNT(*) FROM deliveries GROUP BY value")
        return {r[0]: int(r[1]) for r in rows}

    def deliveries(self) -> list[tuple[str, str, int, int, int]]:
        return [tuple(r) for r in self._conn().execute(
            "SELECT value, topic, part, off, attempt FROM deliveries ORDER BY rowid")]


@dataclass
class Report:
    expected: int
    effects: int
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    duplicate_effects: int = 0
    redeliveries: int = 0
    #: (partition, offset) below a committed position that no handler ever saw
    skipped: list[tuple[int, int]] = field(default_factory=list)
    #: (partition, earlier, later) where a later commit sample went backwards
    non_monotonic: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (not self.lost and not self.unexpected and self.duplicate_effects == 0
                and not self.skipped and not self.non_monotonic)

    def summary(self) -> str:
        return (f"expected={self.expected} effects={self.effects} lost={len(self.lost)} "
                f"duplicate_effects={self.duplicate_effects} redeliveries={self.redeliveries} "
                f"skipped={len(self.skipped)} non_monotonic={len(self.non_monotonic)} "
                f"unexpected={len(self.unexpected)}")


def check(ledger: Ledger, expected: set[str], topic: str | None = None,
          commits: list[dict[int, int]] | None = None) -> Report:
    """Jepsen's and OffsetValidationTest's questions, answered from the ledger.

    ``commits``: samples of the group's committed position per partition of ``topic``, in the
    order they were taken (the last one after the run): they must never go backwards, and no
    offset of ``topic`` below the last one may have gone unhandled.
    """
    values = ledger.effect_values()
    got = set(values)
    deliveries = ledger.delivery_counts()
    report = Report(
        expected=len(expected),
        effects=len(values),
        lost=sorted(expected - got),
        unexpected=sorted(got - expected),
        duplicate_effects=len(values) - len(got),
        redeliveries=sum(n - 1 for n in deliveries.values() if n > 1),
    )
    if topic is not None and commits:
        last: dict[int, int] = {}
        for sample in commits:
            for part, pos in sample.items():
                if pos < 0:
                    continue
                if part in last and pos < last[part]:
                    report.non_monotonic.append((part, last[part], pos))
                last[part] = max(pos, last.get(part, pos))
        seen = {(p, o) for _v, t, p, o, _a in ledger.deliveries() if t == topic}
        offsets_by_part: dict[int, set[int]] = {}
        for p, o in seen:
            offsets_by_part.setdefault(p, set()).add(o)
        for part, pos in commits[-1].items():
            handled = offsets_by_part.get(part, set())
            low = min(handled) if handled else 0
            report.skipped += [(part, o) for o in range(low, pos) if o not in handled]
    return report
