"""kworkers: pools of Kafka consumer workers that never lose work nor apply an effect twice."""

from kworkers import activity
from kworkers.config import WorkerConfig
from kworkers.consumer.commit import CommitPolicy
from kworkers.errors import (
    ActivityFailure,
    ConfigError,
    DecodeError,
    FencedError,
    HandOffError,
    KworkersError,
    NonRetryableError,
    RetryableError,
    failure_type,
    is_non_retryable,
)
from kworkers.message import Message
from kworkers.retry_tiers.policy import RetryPolicy
from kworkers.retry_tiers.tiers import TierLadder
from kworkers.worker import Worker

__all__ = [
    "ActivityFailure",
    "CommitPolicy",
    "ConfigError",
    "DecodeError",
    "FencedError",
    "HandOffError",
    "KworkersError",
    "Message",
    "NonRetryableError",
    "RetryPolicy",
    "RetryableError",
    "TierLadder",
    "Worker",
    "WorkerConfig",
    "activity",
    "failure_type",
    "is_non_retryable",
]
