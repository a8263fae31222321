"""docs/CONFIG.md stays true: its table names every setting ``kworkers.toml`` takes (and no
other), and its example file is read as it says."""

from __future__ import annotations

import re
from pathlib import Path

from kworkers import settings
from kworkers.config import WorkerConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "CONFIG.md"


def test_the_table_names_every_setting_and_only_those() -> None:
    text = DOC.read_text()
    table = text[text.index("## Every key"):]
    keys = re.findall(r"^\| `([a-z_.]+)` \|", table, flags=re.M)
    assert len(keys) == len(set(keys)), "a key listed twice"
    assert set(keys) == set(settings.FIELDS)


def test_the_example_is_a_file_kworkers_reads(tmp_path: Path) -> None:
    text = DOC.read_text()
    example = re.search(r"## An example\n\n```toml\n(.*?)```", text, flags=re.S)
    assert example is not None
    path = tmp_path / "kworkers.toml"
    path.write_text(example.group(1))
    base = WorkerConfig(topics=("placeholder",), group_id="placeholder")
    cfg = settings.resolve(base, {}, {}, str(path))
    assert (cfg.topics, cfg.group_id, cfg.concurrency) == (("orders",), "order-workers", 16)
    assert cfg.message_timeout == 30.0 and cfg.retry.max_interval == 60.0
    assert cfg.retry.non_retryable == ("Malformed", "Expired")
    assert cfg.breaker is not None and cfg.breaker.min_attempts == 20
    assert cfg.tiers.delays == (1.0, 5.0, 30.0, 120.0, 600.0)
    assert cfg.client_config["sasl.mechanism"] == "SCRAM-SHA-512"
    assert cfg.consumer_config["fetch.max.bytes"] == 10485760
