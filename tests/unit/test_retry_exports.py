"""The public names: every one the consumer loop uses is exported, and ``__all__`` is complete."""

from __future__ import annotations

import importlib
import inspect

import pytest

REQUIRED = {
    "kworkers.retry_tiers": {
        "RetryPolicy",
        "backoff",
        "jitter",
        "SeededJitter",
        "no_jitter",
        "JitterSource",
        "TierLadder",
        "Tier",
        "source_topic_of",
        "route",
        "RetryDecision",
        "DeadLetterDecision",
        "DelayBuffer",
        "FailureInfo",
        "HeaderError",
        "attempt_of",
        "due_at_of",
        "check_due",
        "failure_of",
        "retry_headers",
        "dead_letter_headers",
        "redrive_headers",
        "MAX_HEADER_VALUE",
        "MAX_ERROR_MESSAGE",
    },
    "kworkers.dlq": {"DeadLetter", "RedriveFilter"},
}


@pytest.mark.parametrize("package", sorted(REQUIRED))
def test_all_is_complete_and_resolvable(package: str) -> None:
    mod = importlib.import_module(package)
    exported = set(mod.__all__)
    assert REQUIRED[package] <= exported
    for name in exported:
        assert hasattr(mod, name), name
    public = {
        n
        for n, v in vars(mod).items()
        if not n.startswith("_") and not inspect.ismodule(v) and n != "annotations"
    }
    assert public == exported


def test_no_kafka_client_import() -> None:
    import sys

    for package in REQUIRED:
        importlib.import_module(package)
    for name in ("kworkers.retry_tiers", "kworkers.dlq"):
        src = inspect.getsource(importlib.import_module(name))
        assert "confluent_kafka" not in src
    assert all(
        "confluent_kafka" not in inspect.getsource(m)
        for n, m in list(sys.modules.items())
        if n.startswith(("kworkers.retry_tiers", "kworkers.dlq"))
    )
