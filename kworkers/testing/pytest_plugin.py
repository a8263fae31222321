"""pytest fixtures: ``kafka_broker`` (one per session) and ``fault_broker`` (one per test).

Load with ``pytest_plugins = ["kworkers.testing.pytest_plugin"]``.

No silent skips under CI: when ``KWORKERS_CI`` is set (or ``CI``, as CI services set it; a
``KWORKERS_CI=0`` turns this off), a test that skips is reported as a failure, with its reason,
and so is a module that skips at collection (``pytest.importorskip`` at module level, a
``skip(allow_module_level=True)``), which would otherwise hide a whole suite before any test
runs. A missing PostgreSQL/Redis URL, browser or library, or a broker that cannot be killed is
a broken CI set-up, and a green run must not hide it. Expected failures (``xfail``) are not
skips and stay as they are.

Full-size only: a test marked ``full_only`` is deselected (reported as such, never skipped)
unless ``KWORKERS_FULL=1``. It is for scenarios too long for CI's budget at any size, run by
hand; their figures are in docs/RELIABILITY.md.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from kworkers.testing.broker import Broker, broker_from_env
from kworkers.testing.workload import SIZE_SCALE_ENV, full_runs

pytest_plugins = ["kworkers.testing.registry_fixtures"]  # schema_registry, fault_registry


def in_ci() -> bool:
    flag = os.environ.get("KWORKERS_CI")
    if flag is not None:
        return flag.lower() not in ("", "0", "false", "no")
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "full_only: too long for CI; runs only with KWORKERS_FULL=1 (by hand)")
    if in_ci() and os.environ.get(SIZE_SCALE_ENV):
        raise pytest.UsageError(f"{SIZE_SCALE_ENV} is for the by-hand size search: CI runs "
                                "every scenario at its own CI size")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if full_runs():
        return
    dropped = [i for i in items if i.get_closest_marker("full_only") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [i for i in items if i.get_closest_marker("full_only") is None]


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[Broker]:
    """A broker shared by a session's tests; tests must not kill it (use ``fault_broker``)."""
    broker = broker_from_env()
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture
def fault_broker() -> Iterator[Broker]:
    """A broker of the test's own, which it may stop, SIGKILL, pause and restart.

    With ``KWORKERS_BOOTSTRAP`` naming an external broker, the test still gets a broker of its
    own (a container, or Kafka's jars as a process): faults are never injected into a broker
    somebody else runs."""
    broker = broker_from_env(own=True)
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci():
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (f"{collector.nodeid}: skipped at collection under CI, which must "
                           f"run every test: {reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[
        None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and in_ci():
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, which must run every test: {reason}"
