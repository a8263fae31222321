"""pytest fixtures: ``schema_registry`` (one per session) and ``fault_registry`` (one per test).

Loaded by ``kworkers.testing.pytest_plugin``. The registry is real (Apicurio Registry, or the one
``KWORKERS_SCHEMA_REGISTRY_URL`` names); see ``kworkers.testing.registry``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kworkers.testing.registry import SchemaRegistryServer, registry_from_env


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[SchemaRegistryServer]:
    """A registry shared by a session's tests; tests must not stop it (use ``fault_registry``).
    Subjects are shared too: name yours after the test (its topic)."""
    registry = registry_from_env()
    registry.start()
    try:
        yield registry
    finally:
        registry.close()


@pytest.fixture
def fault_registry() -> Iterator[SchemaRegistryServer]:
    """A registry of the test's own, which it may stop, SIGKILL, pause and start again (its
    schemas and ids survive a stop). Never the external one: faults stay in the test."""
    registry = registry_from_env(own=True)
    registry.start()
    try:
        yield registry
    finally:
        registry.close()
