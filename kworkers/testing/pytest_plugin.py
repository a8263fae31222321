"""pytest fixtures: ``kafka_broker`` (one per session) and ``fault_broker`` (one per test).

Load with ``pytest_plugins = ["kworkers.testing.pytest_plugin"]``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kworkers.testing.broker import Broker, broker_from_env


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
    """A broker of the test's own, which it may stop, SIGKILL and restart."""
    broker = broker_from_env()
    if not broker.supports_faults:
        pytest.skip("KWORKERS_BOOTSTRAP names an external broker; faults need a fixture broker")
    broker.start()
    try:
        yield broker
    finally:
        broker.close()
