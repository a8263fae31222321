"""The example worker the image runs: settings from KWORKERS_* variables, a counting handler."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

from kworkers import Message, NonRetryableError, RetryableError
from kworkers.tracing import traced_invoke


def load(monkeypatch: pytest.MonkeyPatch, **env: str) -> ModuleType:
    """The example module imported afresh under exactly these KWORKERS_* variables."""
    for k in list(os.environ):
        if k.startswith("KWORKERS_") and k not in env:
            monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import kworkers.deploy.example as example

    return importlib.reload(example)


def test_defaults_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = load(monkeypatch)
    assert ex.worker.config.topics == ("orders",)
    assert ex.worker.config.group_id == "orders-workers"
    assert ex.worker._invoke is traced_invoke
    ex = load(monkeypatch, KWORKERS_TOPICS="a,b", KWORKERS_GROUP_ID="g",
              KWORKERS_BOOTSTRAP_SERVERS="h:1", KWORKERS_TIERS="1s,1m",
              KWORKERS_RETRY_MAX_ATTEMPTS="3")
    cfg = ex.worker.config
    assert (cfg.topics, cfg.group_id, cfg.bootstrap_servers) == (("a", "b"), "g", "h:1")
    assert cfg.tiers.delays == (1.0, 60.0) and cfg.retry.max_attempts == 3


def test_handler_counts_and_fails_on_purpose(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = load(monkeypatch, KWORKERS_RETRY_MAX_ATTEMPTS="3")

    def m(value: bytes, attempt: int = 1) -> Message:
        return Message("orders", 0, 1, None, value, (), None, attempt)

    ex.count(m(b"1"))
    ex.count(m(b"2"))
    assert ex.handled["orders"] == 2
    with pytest.raises(NonRetryableError):
        ex.count(m(b"poison-1"))
    with pytest.raises(RetryableError):
        ex.count(m(b"fail-1", attempt=2))
    ex.count(m(b"fail-1", attempt=3))  # the last attempt succeeds
    assert ex.handled["orders"] == 3
    assert ex.main(["nonsense"]) == 2
