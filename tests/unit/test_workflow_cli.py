"""``kworkers workflow start|show|list`` on a SQLite store (no broker: start only writes the
run and its outbox row)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kworkers.errors import ConfigError
from kworkers.workflow.cli import load_engine, workflow_cli

APP = "examples.pipeline.app:engine"


@pytest.fixture
def store_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path}/pipeline.db"
    monkeypatch.setenv("KWORKERS_STORE_URL", url)
    return url


def _run(*args: str) -> Result:
    return CliRunner().invoke(workflow_cli, list(args), catch_exceptions=True)


def test_start_is_idempotent_and_show_and_list_read_it_back(store_url: str) -> None:
    r = _run("start", APP, "pipeline", "--id", "doc-1", "--input", '{"doc": "kafka.txt"}')
    assert r.exit_code == 0, r.output
    assert r.output.startswith("started: doc-1 (pipeline sha-")
    r = _run("start", APP, "pipeline", "--id", "doc-1", "--input", '{"doc": "kafka.txt"}')
    assert r.exit_code == 0 and r.output.startswith("exists: doc-1"), r.output
    r = _run("show", "doc-1")
    assert r.exit_code == 0, r.output
    assert "status running" in r.output and "pending download" in r.output
    shown = json.loads(_run("show", "doc-1", "--json").output)
    assert (shown["status"], shown["pending"], shown["history"]) == ("running", "download", [])
    assert shown["input"] == {"doc": "kafka.txt"}
    assert shown["traceparent"].startswith("00-")
    listed = json.loads(_run("list", "--json", "--status", "running").output)
    assert listed["counts"] == {"running": 1}
    assert [r["workflow_id"] for r in listed["runs"]] == ["doc-1"]
    r = _run("list", "--store", store_url)
    assert r.exit_code == 0 and "doc-1" in r.output and "running: 1" in r.output


@pytest.mark.parametrize(("args", "message"), [
    (("show", "ghost"), "no workflow run 'ghost'"),
    (("start", APP, "pipeline", "--id", "d", "--input", "{nope"), "--input is not JSON"),
    (("start", APP, "nope", "--id", "d"), "unknown workflow 'nope'"),
    (("start", APP, "pipeline", "--id", "a/b"), "no '/'"),
    (("start", "examples.pipeline.app:missing", "pipeline", "--id", "d"), "loading"),
    (("start", "examples.pipeline.app:DATA_DIR", "pipeline", "--id", "d"), "not a kworkers"),
    (("start", "nomodule", "pipeline", "--id", "d"), "MODULE:ENGINE"),
    (("list", "--store", "redis://127.0.0.1:1/0"), "SQL store"),
])
def test_bad_input_is_one_clear_error(store_url: str, args: tuple[str, ...],
                                      message: str) -> None:
    load_engine(APP)  # the tables exist
    r = _run(*args)
    assert isinstance(r.exception, ConfigError), r.output
    assert message in str(r.exception)


def test_show_needs_a_store_with_workflow_tables(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.delenv("KWORKERS_STORE_URL", raising=False)
    r = _run("show", "x")
    assert isinstance(r.exception, ConfigError) and "--store" in str(r.exception)
    r = _run("list", "--store", f"sqlite:///{tmp_path}/empty.db", "--tables", "other")
    assert isinstance(r.exception, ConfigError)
    assert "cannot read the workflow table other_runs" in str(r.exception)


def test_load_engine_accepts_an_instance(store_url: str) -> None:
    from examples.pipeline import app

    engine = load_engine(APP)
    app.__dict__["the_engine"] = engine
    try:
        assert load_engine("examples.pipeline.app:the_engine") is engine
    finally:
        del app.__dict__["the_engine"]


@pytest.mark.parametrize("args", [
    ["workflow", "show", "ghost"],
    ["workflow", "list", "--status", "lost"],
    ["workflow", "start", APP, "pipeline"],  # missing --id
    ["workflow", "show", "x", "--store", "postgresql://u:hunter2@127.0.0.1:1/db"],
])
def test_through_the_kworkers_command_errors_are_one_line_without_secrets(
        store_url: str, args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from kworkers.cli import run_cli

    load_engine(APP)  # the tables exist
    code = run_cli(args)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("kworkers: error: ") and err.count("\n") == 1, err
    assert "hunter2" not in err and "Traceback" not in err


def test_signal_and_show_what_a_run_waits_for(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``kworkers workflow signal`` keeps a signal sent before the wait; ``show`` prints the
    timer a run sleeps on and the signal it waits for (no broker: the steps are run by hand)."""
    from examples.approval.app import make_engine
    from kworkers.idempotency import SqliteStore
    from tests.apps.workflow_checks import Harness

    url = f"sqlite:///{tmp_path}/a.db"
    monkeypatch.setenv("KWORKERS_STORE_URL", url)
    app = "examples.approval.app:engine"
    r = _run("start", app, "approval", "--id", "d-1", "--input", '{"cooling_s": 30}')
    assert r.exit_code == 0, r.output
    store = SqliteStore(f"{tmp_path}/a.db")
    h = Harness(make_engine(store))
    h.pump()
    shown = _run("show", "d-1")
    assert "waits for timer until" in shown.output, shown.output
    assert json.loads(_run("show", "d-1", "--json").output)["wait"]["signal"] is None
    r = _run("signal", app, "d-1", "decision", "--payload", '{"approve": true}')
    assert r.exit_code == 0 and "kept until a step waits" in r.output, r.output
    assert "signal 'decision' sent" in _run("show", "d-1").output
    r = _run("signal", app, "d-1", "decision", "--payload", "{nope")
    assert r.exit_code != 0 and "--payload is not JSON" in str(r.exception)
    r = _run("signal", app, "ghost", "decision")
    assert r.exit_code != 0 and "no workflow run 'ghost'" in str(r.exception)
    store.close()
