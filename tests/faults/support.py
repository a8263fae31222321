"""Shared by the fault tests: where the idempotency stores are."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

STORE_ENV = {"postgres": "KWORKERS_PG_DSN", "redis": "KWORKERS_REDIS_URL"}


def store_url(kind: str, tmp: Path) -> str:
    """The store URL of ``kind``; a missing server URL skips, which fails under CI (see
    ``kworkers.testing.pytest_plugin``)."""
    if kind == "sqlite":
        return f"sqlite:///{tmp}/store.db"
    url = os.environ.get(STORE_ENV[kind])
    if not url:
        pytest.skip(f"{STORE_ENV[kind]} is unset (scripts/test starts the server)")
    return url
