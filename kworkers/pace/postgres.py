"""The pool's buckets in PostgreSQL: one row per bucket, locked for the length of a take.

Each take is one call of a PL/pgSQL function, one round trip and one short transaction: the
row is created if new, locked (``FOR UPDATE``), the server's clock read *after* the lock is
held (so a take that waited for the lock is judged at the moment it decides, never earlier),
``kworkers.pace.bucket.decide`` repeated in SQL, the row written. Why one round trip: the ask
is made from a runner thread of a busy worker, where every return from the socket waits for
the GIL (up to its 5 ms switch interval); five statements made a take 18 ms on average there,
during which the other runners could run out of tokens. Replicas' clocks never meet: every
grant is on the database's clock. Rows of buckets full again are deleted now and then, so
buckets per key do not grow the table for good. The contract suite
(``tests/unit/test_pace_buckets.py``) holds the function to ``decide``'s answers.
"""

from __future__ import annotations

import random
from typing import Any

import psycopg

from kworkers.pace.bucket import Grant
from kworkers.sqlbase import POSTGRES, PerThread, check_identifier

__all__ = ["PostgresBuckets"]

Connection = psycopg.Connection[Any]

#: one take in this many also deletes the rows of buckets that are full again
PRUNE_ONE_IN = 1000


#: ``decide`` in PL/pgSQL (the same arithmetic: base, available tokens, grant, retry after)
_TAKE = """
CREATE OR REPLACE FUNCTION {t}_take(p_name TEXT, p_want INT, p_rate FLOAT8, p_cap FLOAT8,
                                    OUT granted INT, OUT retry_after FLOAT8) AS $$
DECLARE v_tat FLOAT8; v_now FLOAT8; v_base FLOAT8;
BEGIN
  INSERT INTO {t} (name, tat) VALUES (p_name, NULL) ON CONFLICT (name) DO NOTHING;
  SELECT tat INTO v_tat FROM {t} WHERE name = p_name FOR UPDATE;
  v_now := extract(epoch FROM clock_timestamp());
  v_base := CASE WHEN v_tat IS NULL OR v_tat < v_now THEN v_now ELSE v_tat END;
  granted := greatest(0, least(p_want::FLOAT8,
                               floor((v_now - v_base) * p_rate + p_cap + 1e-9)))::INT;
  IF granted = 0 THEN
    retry_after := greatest(0, v_base + (1 - p_cap) / p_rate - v_now);
  ELSE
    retry_after := 0;
    UPDATE {t} SET tat = v_base + granted / p_rate WHERE name = p_name;
  END IF;
END $$ LANGUAGE plpgsql
"""


class PostgresBuckets:
    """Buckets in table ``table`` of the database at ``dsn`` (created on first use)."""

    remote = True

    def __init__(self, dsn: str, *, table: str = "kworkers_rate_buckets",
                 connect_timeout_s: float = 5.0) -> None:
        check_identifier(table)
        self.dsn = dsn
        self.table = table
        self._timeout = max(1, round(connect_timeout_s))
        self._conns: PerThread[Connection] = PerThread(
            self._connect, Connection.close, lambda c: not c.closed and not c.broken)

    def _connect(self) -> Connection:
        conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=self._timeout)
        try:
            with conn.transaction():
                POSTGRES.lock_ddl(conn, self.table)
                conn.execute(f"CREATE TABLE IF NOT EXISTS {self.table} ("
                             "name TEXT PRIMARY KEY, tat DOUBLE PRECISION)")
                conn.execute(_TAKE.format(t=self.table))
        except BaseException:
            conn.close()
            raise
        return conn

    def take(self, name: str, want: int, rate: float, capacity: float) -> Grant:
        conn = self._conns.get()
        row = conn.execute(f"SELECT granted, retry_after FROM {self.table}_take(%s, %s, %s, %s)",
                           (name, int(want), float(rate), float(capacity))).fetchone()
        assert row is not None
        if random.random() * PRUNE_ONE_IN < 1:
            conn.execute(f"DELETE FROM {self.table} WHERE tat < "
                         "extract(epoch FROM clock_timestamp())")
        granted = int(row[0])
        return Grant(granted, 0.0 if granted else max(0.0, float(row[1])))

    def close(self) -> None:
        self._conns.close()
