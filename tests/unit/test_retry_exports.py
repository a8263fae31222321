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
        "Destination",
        "Route",
        "RETRY",
        "DLQ",
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


PURE_MODULES = [
    "kworkers.retry_tiers.policy",
    "kworkers.retry_tiers.tiers",
    "kworkers.retry_tiers.routing",
    "kworkers.retry_tiers.headers",
    "kworkers.retry_tiers.delay",
    "kworkers.dlq.record",
    "kworkers.dlq.redrive_plan",
]


@pytest.mark.parametrize("name", PURE_MODULES)
def test_pure_modules_do_not_touch_the_kafka_client(name: str) -> None:
    src = inspect.getsource(importlib.import_module(name))
    assert "confluent_kafka" not in src
    assert "time.time" not in src  # time is passed in
