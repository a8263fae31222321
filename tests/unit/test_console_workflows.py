"""The Workflows pages on a real SQLite store of the workflow engine's tables (no broker)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from kworkers.console.settings import ConsoleSettings
from kworkers.idempotency import open_store
from kworkers.kafka.settings import ClientSettings
from kworkers.workflow import RunRow, RunState, RunTables

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

    from kworkers.console.app import create_app

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def fill(path: Path) -> str:
    """Three runs as the engine writes them: completed, failed (dead-lettered), compensating."""
    url = f"sqlite:///{path}"
    tables = RunTables(open_store(url), "kworkers_wf")  # type: ignore[arg-type]
    tables.ensure_schema()
    rows = [
        ("doc-1", RunState("completed", None, "step", 3, None, None)),
        ("doc-2", RunState("failed", "doc-2/embed", "step", 1, "Expired: model gone", None)),
        ("order-7", RunState("compensating", "order-7/refund", "compensation", 0, None,
                             "ship failed: no stock")),
    ]
    with tables.store.atomic() as conn:
        for i, (wid, state) in enumerate(rows):
            wf = "order" if wid.startswith("order") else "pipeline"
            tables.insert_run(conn, RunRow(wid, wf, "v1", state, '{"doc": "a.txt"}', None,
                                           1_700_000_000.0 + i, 1_700_000_100.0 + i))
        # as the engine writes them: each attempt's start, then its outcome
        tables.started(conn, "doc-2", "doc-2/download", "step", 0, "download", 1_700_000_049.0)
        tables.record(conn, "doc-2", "doc-2/download", "step", 0, "download", "completed",
                      1_700_000_050.0, result='{"bytes": 12}')
        tables.started(conn, "doc-2", "doc-2/embed", "step", 1, "embed", 1_700_000_059.0)
        tables.record(conn, "doc-2", "doc-2/embed", "step", 1, "embed", "retrying",
                      1_700_000_060.0, error="Timeout: slow model")
        tables.started(conn, "doc-2", "doc-2/embed", "step", 1, "embed", 1_700_000_069.0)
        tables.record(conn, "doc-2", "doc-2/embed", "step", 1, "embed", "failed",
                      1_700_000_070.0, error="Expired: model gone")
    return url


def _client(**kw: object) -> TestClient:
    s = ConsoleSettings(ClientSettings("127.0.0.1:1"), connect_timeout=0.5,
                        **kw)  # type: ignore[arg-type]
    return TestClient(create_app(s), base_url="http://127.0.0.1:8080")


def test_runs_counts_filters_and_one_run(tmp_path: Path) -> None:
    with _client(workflow_store=fill(tmp_path / "wf.db")) as c:
        r = c.get("/workflows")
        assert r.status_code == 200
        for wid in ("doc-1", "doc-2", "order-7"):
            assert f">{wid}</a>" in r.text
        assert "(dead-lettered: redrive to retry)" in r.text
        failed = c.get("/workflows?status=failed").text
        assert ">doc-2</a>" in failed and ">doc-1</a>" not in failed
        orders = c.get("/workflows?workflow=order").text
        assert ">order-7</a>" in orders and ">doc-2</a>" not in orders
        assert c.get("/workflows?status=lost").status_code == 400

        run = c.get("/workflows/doc-2")
        assert run.status_code == 200
        assert re.search(r'id="run-status">failed<', run.text)
        assert "error: Expired: model gone" in run.text
        steps = re.findall(r"<tr><td class=\"mono\">([^<]+)</td>", run.text)
        assert steps == ["doc-2/download", "doc-2/embed"]
        assert "<td>2</td>" in run.text  # embed: two attempts recorded
        assert "&#34;doc&#34;: &#34;a.txt&#34;" in run.text  # the input, pretty and escaped
        assert c.get("/workflows/nope").status_code == 404


def test_without_a_store_the_page_says_how(tmp_path: Path) -> None:
    with _client() as c:
        r = c.get("/workflows")
        assert r.status_code == 200 and 'id="no-store"' in r.text


def test_a_store_without_tables_is_a_503_without_its_url(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    with _client(workflow_store=url) as c:
        r = c.get("/workflows")
        assert r.status_code == 503
        assert "cannot read the workflow tables kworkers_wf_runs" in r.text
        assert str(tmp_path) not in r.text
