"""Derived topic and group names: built in one module, read back by the same rules."""

from __future__ import annotations

import pytest

from kworkers.config import WorkerConfig
from kworkers.errors import ConfigError
from kworkers.retry_tiers.tiers import TierLadder
from kworkers.topic_names import (
    dlq_topic,
    is_derived,
    is_tier_topic,
    ledger_topic,
    retry_group,
    source_topic_of,
    tier_label,
    tier_topic,
)


@pytest.mark.parametrize(("delay", "label"), [
    (0.5, "500ms"), (1.5, "1500ms"), (1, "1s"), (90, "90s"), (120, "2m"), (3600, "1h"),
])
def test_labels_use_the_longest_exact_unit(delay: float, label: str) -> None:
    assert tier_label(delay) == label
    assert source_topic_of(tier_topic("orders", label)) == "orders"


def test_every_name_reads_back_to_its_source() -> None:
    for name in ("orders.retry.5s", "orders.dlq", "orders.retry.5s.dlq", "orders"):
        assert source_topic_of(name) == "orders"
    assert dlq_topic("orders") == "orders.dlq"
    assert ledger_topic(dlq_topic("orders")) == "orders.dlq.redriven"
    assert retry_group("workers") == "workers.retry"
    assert is_tier_topic("a.b.retry.250ms") and not is_tier_topic("orders.retry.x")
    assert not is_tier_topic("orders.dlq") and not is_tier_topic("orders")
    assert is_derived("orders.retry.x") and is_derived("orders.dlq") and not is_derived("orders")
    with pytest.raises(ConfigError, match="no exact label"):
        tier_label(0.0001)


def test_the_config_and_the_ladder_use_these_names() -> None:
    cfg = WorkerConfig(topics=("orders",), group_id="w", tiers=TierLadder((0.5, 120)))
    assert cfg.tier_topics() == ("orders.retry.500ms", "orders.retry.2m")
    assert cfg.dlq_topics() == ("orders.dlq",) and cfg.retry_group_id == "w.retry"
    with pytest.raises(ConfigError, match="is a retry tier or DLQ"):
        WorkerConfig(topics=("orders.dlq",), group_id="w")
