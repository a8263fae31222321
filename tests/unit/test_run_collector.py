"""``kworkers run`` sets the interpreter's young-generation threshold before it imports the
application's module (``kworkers.cli.collector``): the worker runs with it, a flag or
``KWORKERS_GC_YOUNG_THRESHOLD`` changes it, a module that sets its own keeps it, a pool's
children get it, and a value that would turn the collector off is refused."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

from kworkers.cli import collector
from kworkers.cli import run as run_cli

INTERPRETER = (700, 10, 10)


@pytest.fixture(autouse=True)
def interpreter_collector() -> Iterator[None]:
    """Each test starts at CPython's thresholds and gives the suite's back."""
    before = gc.get_threshold()
    gc.set_threshold(*INTERPRETER)
    yield
    gc.set_threshold(*before)


def _run(monkeypatch: pytest.MonkeyPatch, *args: str, own: int | None = None,
         env: dict[str, str] | None = None) -> tuple[Result, dict[str, Any]]:
    """``kworkers run app:worker ARGS`` with the module's import (``prepare``) and the worker's
    run (``run_one``, ``run_pool``) replaced by recorders of the collector's thresholds;
    ``own``: the module sets its own young threshold when imported."""
    seen: dict[str, Any] = {}

    def prepare(*_a: object) -> object:
        seen["at_import"] = gc.get_threshold()
        if own is not None:
            gc.set_threshold(own, 10, 10)
        return object()

    def run_one(_worker: object, _port: object) -> int:
        seen["at_run"] = gc.get_threshold()
        return 0

    def run_pool(child: list[str], *_a: object, **_k: object) -> int:
        seen["child"] = child
        return 0

    monkeypatch.setattr(run_cli, "prepare", prepare)
    monkeypatch.setattr(run_cli, "run_one", run_one)
    monkeypatch.setattr("kworkers.cli.pool.run_pool", run_pool)
    # the variable unset unless the test gives it (None: unset for the call, as CliRunner does)
    given: dict[str, str | None] = {"KWORKERS_GC_YOUNG_THRESHOLD": None, **(env or {})}
    out = CliRunner().invoke(run_cli.run, ["app:worker", *args], env=given)
    return out, seen


def test_the_worker_runs_with_the_young_threshold_set_before_its_module(
        monkeypatch: pytest.MonkeyPatch) -> None:
    out, seen = _run(monkeypatch)
    assert out.exit_code == 0, out.output
    assert seen["at_import"] == seen["at_run"] == (collector.DEFAULT_YOUNG, 10, 10)


def test_canary_a_run_that_leaves_the_collector_runs_at_the_interpreters(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above fails for a ``kworkers run`` that does not set it: the worker runs at
    the interpreter's 700."""
    monkeypatch.setattr(collector, "set_young_threshold", lambda young: None)
    out, seen = _run(monkeypatch)
    assert out.exit_code == 0, out.output
    assert seen["at_run"] == INTERPRETER != (collector.DEFAULT_YOUNG, 10, 10)


def test_a_flag_or_the_environment_changes_it_the_flag_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"KWORKERS_GC_YOUNG_THRESHOLD": "3000"}
    assert _run(monkeypatch, env=env)[1]["at_run"] == (3000, 10, 10)
    assert _run(monkeypatch, "--gc-young-threshold", "5000", env=env)[1]["at_run"] == (
        5000, 10, 10)
    assert _run(monkeypatch, "--gc-young-threshold", "700")[1]["at_run"] == INTERPRETER


def test_a_module_that_sets_its_own_keeps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    out, seen = _run(monkeypatch, own=1234)
    assert out.exit_code == 0, out.output
    assert seen["at_import"][0] == collector.DEFAULT_YOUNG
    assert seen["at_run"] == (1234, 10, 10)


def test_a_pools_children_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    out, seen = _run(monkeypatch, "--processes", "2", "--gc-young-threshold", "5000")
    assert out.exit_code == 0, out.output
    child = seen["child"]
    assert child[child.index("--gc-young-threshold") + 1] == "5000"


@pytest.mark.parametrize("value", ["0", "-5", "many"])
def test_a_threshold_that_would_stop_the_collector_is_refused(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    out, seen = _run(monkeypatch, "--gc-young-threshold", value)
    assert out.exit_code == 2 and "--gc-young-threshold" in out.output, out.output
    assert not seen and gc.get_threshold() == INTERPRETER  # nothing imported, nothing set
    with pytest.raises(ValueError, match="turns the collector off"):
        collector.set_young_threshold(0)
