"""The two tables a workflow engine keeps in the store's database: runs and step history.

Why in the store's database: the checkpoint of a step (its result, the run's next state, the
next activity's outbox row, the step's own in-store effects and the idempotency done-mark) must
commit in one transaction, and only one database can give that. So the engine needs a SQL store
(SQLite or PostgreSQL); Redis has no transaction spanning those rows.

``<prefix>_runs``: one row per run, its state (``RunState``) and input. ``<prefix>_steps``: one
row per activity a run has tried, with its status (``running``, ``completed``, ``retrying``,
``failed``), its attempts, the last error and the result. ``attempts`` counts the times the
step *started* (written in a transaction of its own before the step runs), so an attempt
killed mid-step counts too: it shows as ``running`` until the broker's redelivery resumes it,
which then shows one attempt more.

Every statement takes the connection of the caller's transaction; reads that stand alone open
one of their own. On PostgreSQL ``lock_run`` is ``SELECT ... FOR UPDATE``; on SQLite the
transaction already holds the database's write lock (the few words the two differ in:
``kworkers.sqlbase.Dialect``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kworkers.errors import ConfigError
from kworkers.idempotency.capabilities import dialect_of
from kworkers.idempotency.store import TransactionalStore
from kworkers.sqlbase import SqlConnection, check_identifier
from kworkers.workflow.kind import Kind
from kworkers.workflow.state import STATUSES, RunState, Status

__all__ = ["RunRow", "RunTables", "StepRow", "StepStatus"]

StepStatus = Literal["running", "completed", "retrying", "failed"]

_RUN_COLUMNS = ("workflow_id, workflow, version, status, activity, kind, position, error, "
                "cause, input, traceparent, created_at, updated_at, wake_at, wait_signal")
_STEP_COLUMNS = ("activity_id, kind, position, name, status, attempts, error, result, "
                 "updated_at")


@dataclass(frozen=True)
class RunRow:
    workflow_id: str
    workflow: str
    version: str
    state: RunState
    input: str | None
    traceparent: str | None
    created_at: float
    updated_at: float

    @property
    def status(self) -> Status:
        return self.state.status


@dataclass(frozen=True)
class StepRow:
    activity_id: str
    kind: Kind
    position: int
    name: str
    status: StepStatus
    attempts: int
    error: str | None
    result: str | None
    updated_at: float


def _run(row: Sequence[Any]) -> RunRow:
    (wid, wf, ver, status, activity, kind, pos, error, cause, inp, tp, created, updated,
     wake_at, wait_signal) = row
    if status not in STATUSES or kind not in ("step", "compensation"):
        raise ConfigError(f"corrupt workflow run row {wid!r}: status {status!r}, kind {kind!r}")
    return RunRow(str(wid), str(wf), str(ver),
                  RunState(status, activity, kind, int(pos), error, cause,
                           None if wake_at is None else float(wake_at), wait_signal),
                  inp, tp, float(created), float(updated))


def _step(row: Sequence[Any]) -> StepRow:
    aid, kind, pos, name, status, attempts, error, result, updated = row
    return StepRow(str(aid), kind, int(pos), str(name), status, int(attempts), error, result,
                   float(updated))


class RunTables:
    def __init__(self, store: TransactionalStore[Any], prefix: str = "kworkers_wf") -> None:
        self.store = store
        self.prefix = check_identifier(prefix, "table prefix")
        self.runs = check_identifier(f"{prefix}_runs")
        self.steps = check_identifier(f"{prefix}_steps")
        self.signals_table = check_identifier(f"{prefix}_signals")
        #: the SQL of the store's database (its few differences: ``kworkers.sqlbase.Dialect``)
        self._dialect = dialect_of(store)

    def _sql(self, sql: str) -> str:
        return self._dialect.sql(sql, runs=self.runs, steps=self.steps,
                                 signals=self.signals_table)

    def ensure_schema(self) -> None:
        real, serial = self._dialect.real, self._dialect.serial
        with self.store.atomic() as conn:
            self._dialect.lock_ddl(conn, self.runs)
            for stmt in (
                f"CREATE TABLE IF NOT EXISTS {{runs}} (workflow_id TEXT PRIMARY KEY, "
                "workflow TEXT NOT NULL, version TEXT NOT NULL, status TEXT NOT NULL, "
                "activity TEXT, kind TEXT NOT NULL, position INTEGER NOT NULL, error TEXT, "
                f"cause TEXT, input TEXT, traceparent TEXT, created_at {real} NOT NULL, "
                f"updated_at {real} NOT NULL, wake_at {real}, wait_signal TEXT)",
                "CREATE INDEX IF NOT EXISTS {runs}_status ON {runs} (status, updated_at)",
                f"CREATE TABLE IF NOT EXISTS {{steps}} (workflow_id TEXT NOT NULL, "
                "activity_id TEXT NOT NULL, kind TEXT NOT NULL, position INTEGER NOT NULL, "
                "name TEXT NOT NULL, status TEXT NOT NULL, attempts INTEGER NOT NULL, "
                f"error TEXT, result TEXT, updated_at {real} NOT NULL, "
                "PRIMARY KEY (workflow_id, activity_id))",
                f"CREATE TABLE IF NOT EXISTS {{signals}} (id {serial}, "
                "workflow_id TEXT NOT NULL, name TEXT NOT NULL, payload TEXT, "
                f"sent_at {real} NOT NULL, consumed_by TEXT)",
                "CREATE INDEX IF NOT EXISTS {signals}_run ON {signals} (workflow_id, name, id)",
            ):
                conn.execute(self._sql(stmt), ())
            self._add_wait_columns(conn, real)

    def _add_wait_columns(self, conn: SqlConnection, real: str) -> None:
        """Runs tables made before runs could wait have no ``wake_at``/``wait_signal``."""
        have = self._dialect.columns(conn, self.runs)
        if "wake_at" not in have:
            conn.execute(self._sql(f"ALTER TABLE {{runs}} ADD COLUMN wake_at {real}"), ())
        if "wait_signal" not in have:
            conn.execute(self._sql("ALTER TABLE {runs} ADD COLUMN wait_signal TEXT"), ())

    # -- in the caller's transaction --------------------------------------------------------

    def insert_run(self, conn: SqlConnection, row: RunRow) -> bool:
        """Insert a new run; False (nothing written) when the id exists."""
        s = row.state
        cur = conn.execute(self._sql(
            f"INSERT INTO {{runs}} ({_RUN_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
            "ON CONFLICT (workflow_id) DO NOTHING"),
            (row.workflow_id, row.workflow, row.version, s.status, s.activity, s.kind,
             s.position, s.error, s.cause, row.input, row.traceparent, row.created_at,
             row.updated_at, s.wake_at, s.signal))
        return bool(cur.rowcount == 1)

    def lock_run(self, conn: SqlConnection, workflow_id: str, *,
                 lock: bool = True) -> RunRow | None:
        """The run's row, locked until the transaction ends (``lock=False``: a plain read)."""
        lock_sql = self._dialect.for_update if lock else ""
        row = conn.execute(self._sql(
            f"SELECT {_RUN_COLUMNS} FROM {{runs}} WHERE workflow_id = ?{lock_sql}"),
            (workflow_id,)).fetchone()
        return None if row is None else _run(row)

    def set_state(self, conn: SqlConnection, workflow_id: str, s: RunState, now: float) -> None:
        conn.execute(self._sql(
            "UPDATE {runs} SET status = ?, activity = ?, kind = ?, position = ?, error = ?, "
            "cause = ?, updated_at = ?, wake_at = ?, wait_signal = ? WHERE workflow_id = ?"),
            (s.status, s.activity, s.kind, s.position, s.error, s.cause, now, s.wake_at,
             s.signal, workflow_id))

    def add_signal(self, conn: SqlConnection, workflow_id: str, name: str,
                   payload: str | None, now: float) -> None:
        """Keep a signal until a step that waits for ``name`` takes it (sent before the wait:
        kept all the same)."""
        conn.execute(self._sql(
            "INSERT INTO {signals} (workflow_id, name, payload, sent_at) VALUES (?,?,?,?)"),
            (workflow_id, name, payload, now))

    def first_signal(self, conn: SqlConnection, workflow_id: str,
                     name: str) -> tuple[int, str | None] | None:
        """The oldest signal ``name`` of the run no step has taken: (id, payload JSON)."""
        row = conn.execute(self._sql(
            "SELECT id, payload FROM {signals} WHERE workflow_id = ? AND name = ? AND "
            "consumed_by IS NULL ORDER BY id LIMIT 1"), (workflow_id, name)).fetchone()
        return None if row is None else (int(row[0]), row[1])

    def take_signal(self, conn: SqlConnection, signal_id: int, activity_id: str) -> None:
        """Mark a signal taken by ``activity_id``, in that step's checkpoint."""
        conn.execute(self._sql("UPDATE {signals} SET consumed_by = ? WHERE id = ?"),
                     (activity_id, signal_id))

    def started(self, conn: SqlConnection, workflow_id: str, activity_id: str, kind: Kind,
                position: int, name: str, now: float) -> None:
        """An attempt starts: upsert the activity's row as ``running``, one more attempt
        counted (the last error and result stay until this attempt reports)."""
        conn.execute(self._sql(
            f"INSERT INTO {{steps}} (workflow_id, {_STEP_COLUMNS}) "
            "VALUES (?,?,?,?,?,'running',1,NULL,NULL,?) "
            "ON CONFLICT (workflow_id, activity_id) DO UPDATE SET status = 'running', "
            "attempts = {steps}.attempts + 1, updated_at = excluded.updated_at"),
            (workflow_id, activity_id, kind, position, name, now))

    def record(self, conn: SqlConnection, workflow_id: str, activity_id: str, kind: Kind,
               position: int, name: str, status: StepStatus, now: float,
               error: str | None = None, result: str | None = None) -> None:
        """One attempt's outcome, on the row its start wrote (``started``)."""
        conn.execute(self._sql(
            f"INSERT INTO {{steps}} (workflow_id, {_STEP_COLUMNS}) VALUES (?,?,?,?,?,?,1,?,?,?) "
            "ON CONFLICT (workflow_id, activity_id) DO UPDATE SET status = excluded.status, "
            "error = excluded.error, result = excluded.result, "
            "updated_at = excluded.updated_at"),
            (workflow_id, activity_id, kind, position, name, status, error, result, now))

    def completed_results(self, conn: SqlConnection, workflow_id: str) -> dict[str, str | None]:
        """Activity id -> result JSON of the run's completed steps (not compensations)."""
        rows = conn.execute(self._sql(
            "SELECT activity_id, result FROM {steps} WHERE workflow_id = ? AND kind = 'step' "
            "AND status = 'completed'"), (workflow_id,)).fetchall()
        return {str(a): r for a, r in rows}

    # -- reads of their own -----------------------------------------------------------------

    def run(self, workflow_id: str) -> RunRow | None:
        with self.store.atomic() as conn:
            return self.lock_run(conn, workflow_id, lock=False)

    def history(self, workflow_id: str) -> list[StepRow]:
        with self.store.atomic() as conn:
            rows = conn.execute(self._sql(
                f"SELECT {_STEP_COLUMNS} FROM {{steps}} WHERE workflow_id = ? "
                "ORDER BY updated_at, position"), (workflow_id,)).fetchall()
        return [_step(r) for r in rows]

    def signals(self, workflow_id: str) -> list[tuple[str, float, str | None]]:
        """The run's signals in the order sent: (name, sent_at, taken by or None)."""
        with self.store.atomic() as conn:
            rows = conn.execute(self._sql(
                "SELECT name, sent_at, consumed_by FROM {signals} WHERE workflow_id = ? "
                "ORDER BY id"), (workflow_id,)).fetchall()
        return [(str(n), float(t), c) for n, t, c in rows]

    def list_runs(self, status: Status | None = None, workflow: str | None = None,
                  limit: int = 100) -> list[RunRow]:
        if limit < 1:
            raise ConfigError(f"limit must be >= 1, got {limit}")
        where: list[str] = []
        args: list[object] = []
        if status is not None:
            if status not in STATUSES:
                raise ConfigError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
            where.append("status = ?")
            args.append(status)
        if workflow is not None:
            where.append("workflow = ?")
            args.append(workflow)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        with self.store.atomic() as conn:
            rows = conn.execute(self._sql(
                f"SELECT {_RUN_COLUMNS} FROM {{runs}}{clause} ORDER BY updated_at DESC, "
                "workflow_id LIMIT ?"), (*args, limit)).fetchall()
        return [_run(r) for r in rows]

    def counts(self) -> dict[str, int]:
        """Runs per status (what ``kworkers workflow list`` summarizes)."""
        with self.store.atomic() as conn:
            rows = conn.execute(self._sql("SELECT status, COUNT(*) FROM {runs} GROUP BY status"),
                                ()).fetchall()
        return {str(s): int(n) for s, n in rows}
