"""The Workflows pages: durable workflow runs as ``kworkers workflow list|show`` sees them.

Reads the engine's tables through their public reads (``kworkers.workflow.RunTables``:
``counts``, ``list_runs``, ``run``, ``history``) in the store the console was given
(``--workflow-store``, a ``sqlite:`` or ``postgresql:`` URL, as ``kworkers workflow --store``).
The store is opened once, on the first page that needs it. Its URL may hold a password, so it
is never shown: a store that does not answer is a page with the driver's words only.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kworkers.errors import ConfigError, KworkersError
from kworkers.idempotency import open_store
from kworkers.idempotency.capabilities import require_sql
from kworkers.workflow import RunRow, RunTables, StepRow
from kworkers.workflow.state import STATUSES

#: At most this many runs on the list page.
RUN_LIMIT = 100
T = TypeVar("T")


class StoreUnavailable(KworkersError):
    """The workflow store did not answer (or has no workflow tables)."""


@dataclass(frozen=True)
class RunList:
    counts: dict[str, int]
    runs: list[RunRow]


@dataclass(frozen=True)
class RunDetail:
    run: RunRow
    steps: list[StepRow]
    input: str | None  # pretty JSON


class WorkflowTables:
    """The engine's tables in one store, opened on first use and kept."""

    def __init__(self, url: str, prefix: str) -> None:
        self._url = url
        self._prefix = prefix
        self._tables: RunTables | None = None
        self._lock = threading.Lock()

    def _open(self) -> RunTables:
        with self._lock:
            if self._tables is None:
                store = require_sql(open_store(self._url), "--workflow-store (the workflow "
                                    "tables)")
                self._tables = RunTables(store, self._prefix)
            return self._tables

    def _read(self, what: Callable[[RunTables], T]) -> T:
        tables = self._open()
        try:
            return what(tables)
        except KworkersError:
            raise
        except Exception as exc:  # the driver's words, never the URL (it may hold a password)
            raise StoreUnavailable(f"cannot read the workflow tables {tables.runs} and "
                                   f"{tables.steps} ({type(exc).__name__}: {str(exc)[:200]})"
                                   ) from None

    def runs(self, status: str | None, workflow: str | None,
             limit: int = RUN_LIMIT) -> RunList:
        if status is not None and status not in STATUSES:
            raise ConfigError(f"status: one of {', '.join(STATUSES)}, got {status[:40]!r}")
        return self._read(lambda t: RunList(
            t.counts(), t.list_runs(status, workflow, limit)))

    def run(self, workflow_id: str) -> RunDetail | None:
        def read(t: RunTables) -> RunDetail | None:
            run = t.run(workflow_id)
            if run is None:
                return None
            return RunDetail(run, t.history(workflow_id), _pretty(run.input))
        return self._read(read)


def _pretty(raw: str | None) -> str | None:
    if raw is None:
        return None
    try:
        return json.dumps(json.loads(raw), indent=2, ensure_ascii=False)
    except ValueError:
        return raw
