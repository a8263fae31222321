"""kworkers: pools of Kafka consumer workers that never lose work nor apply an effect twice.

The package root is light: its public names are imported on first use (PEP 562), so importing
a pure module such as ``kworkers.keda`` or ``kworkers.settings`` loads neither librdkafka nor
the Prometheus client; ``from kworkers import Worker`` loads what a worker needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kworkers import activity
    from kworkers.config import WorkerConfig
    from kworkers.consumer.batching import BatchPolicy
    from kworkers.consumer.breaker import BreakerPolicy
    from kworkers.consumer.commit import CommitPolicy
    from kworkers.errors import (
        ActivityFailure,
        BatchError,
        ConfigError,
        DecodeError,
        FencedError,
        HandOffError,
        KworkersError,
        NonRetryableError,
        RetryableError,
        WorkerFailed,
        failure_type,
        is_non_retryable,
    )
    from kworkers.message import Message
    from kworkers.pace.limit import RateLimit
    from kworkers.retry_tiers.policy import RetryPolicy
    from kworkers.retry_tiers.tiers import TierLadder
    from kworkers.worker import Worker

#: public name -> the module it lives in (a module itself when the names match)
_WHERE = {
    "ActivityFailure": "kworkers.errors",
    "BatchError": "kworkers.errors",
    "BatchPolicy": "kworkers.consumer.batching",
    "BreakerPolicy": "kworkers.consumer.breaker",
    "CommitPolicy": "kworkers.consumer.commit",
    "ConfigError": "kworkers.errors",
    "DecodeError": "kworkers.errors",
    "FencedError": "kworkers.errors",
    "HandOffError": "kworkers.errors",
    "KworkersError": "kworkers.errors",
    "Message": "kworkers.message",
    "NonRetryableError": "kworkers.errors",
    "RateLimit": "kworkers.pace.limit",
    "RetryPolicy": "kworkers.retry_tiers.policy",
    "RetryableError": "kworkers.errors",
    "TierLadder": "kworkers.retry_tiers.tiers",
    "Worker": "kworkers.worker",
    "WorkerConfig": "kworkers.config",
    "WorkerFailed": "kworkers.errors",
    "activity": "kworkers.activity",
    "failure_type": "kworkers.errors",
    "is_non_retryable": "kworkers.errors",
}

__all__ = [
    "ActivityFailure",
    "BatchError",
    "BatchPolicy",
    "BreakerPolicy",
    "CommitPolicy",
    "ConfigError",
    "DecodeError",
    "FencedError",
    "HandOffError",
    "KworkersError",
    "Message",
    "NonRetryableError",
    "RateLimit",
    "RetryPolicy",
    "RetryableError",
    "TierLadder",
    "Worker",
    "WorkerConfig",
    "WorkerFailed",
    "activity",
    "failure_type",
    "is_non_retryable",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'kworkers' has no attribute {name!r}")
    module = importlib.import_module(where)
    value = module if where.rsplit(".", 1)[-1] == name else getattr(module, name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
