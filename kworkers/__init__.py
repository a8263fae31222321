"""kworkers: pools of Kafka consumer workers that never lose work nor apply an effect twice."""

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

__all__ = [
    "ActivityFailure",
    "ConfigError",
    "DecodeError",
    "FencedError",
    "HandOffError",
    "KworkersError",
    "Message",
    "NonRetryableError",
    "RetryableError",
    "failure_type",
    "is_non_retryable",
]
