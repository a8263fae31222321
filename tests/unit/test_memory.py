"""The byte bound (issue #45) without a broker: sizes as settings read them, what a record costs,
librdkafka's sizes chosen with the bound, the worst-case formula, the bound in every entrance,
and the container's memory limit read (never acted on silently)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from kworkers.config import WorkerConfig
from kworkers.consumer.partition import PartitionState
from kworkers.deploy import config_from_env
from kworkers.deploy.env import config_env
from kworkers.errors import ConfigError
from kworkers.kafka.settings import consumer_settings
from kworkers.memory import (
    DEFAULT_IN_FLIGHT_BYTES,
    HEADER_COST,
    RECORD_COST,
    FetchSizes,
    GiB,
    KiB,
    MemoryBound,
    MiB,
    cgroup_limit,
    hand_off_bytes,
    message_bytes,
    over_limit,
    parse_bytes,
    record_sizes,
    show_bytes,
)
from kworkers.message import Message
from kworkers.settings import resolve

BASE = WorkerConfig(topics=("orders",), group_id="billing")


@pytest.mark.parametrize(("text", "n"), [
    ("64MiB", 64 * MiB), ("64M", 64 * MiB), ("512KiB", 512 * KiB), ("1GiB", GiB),
    ("256MB", 256_000_000), ("1.5GiB", 3 * GiB // 2), (" 20 mib ", 20 * MiB), ("1000", 1000),
    (4096, 4096)])
def test_sizes(text: object, n: int) -> None:
    assert parse_bytes(text) == n


@pytest.mark.parametrize("bad", ["", "lots", "-1MiB", "0", 0, 1.5, True, "12 parsecs"])
def test_bad_sizes_name_the_setting(bad: object) -> None:
    with pytest.raises(ConfigError, match="max_in_flight_bytes"):
        parse_bytes(bad, "max_in_flight_bytes")


def test_sizes_are_shown_as_a_person_writes_them_and_read_back() -> None:
    for n in (64 * MiB, 3 * GiB, 512 * KiB, 1000, 1_048_577):
        assert parse_bytes(show_bytes(n)) == n
    assert show_bytes(DEFAULT_IN_FLIGHT_BYTES) == "64MiB"


# ------------------------------------------------------------------ what a record costs

def test_a_record_costs_its_key_value_and_headers() -> None:
    plain = Message("t", 0, 1, b"key", b"v" * 100)
    tomb = Message("t", 0, 2, None, None)
    headed = Message("t", 0, 3, b"k", b"vv", (("kw-attempt", b"2"), ("trace", b"x" * 50)))
    assert list(record_sizes([plain, tomb])) == [103, 0]  # no headers: counted in C alone
    want = 1 + 2 + len("kw-attempt") + 1 + len("trace") + 50 + 2 * HEADER_COST
    assert list(record_sizes([plain, headed, tomb])) == [103, want, 0]
    assert message_bytes(headed.key, headed.value, headed.headers) == want
    ps = PartitionState("t", 0)
    ps.tracker.track_many([1, 2, 3], record_sizes([plain, tomb, headed]))
    assert ps.held_bytes() == 103 + want + 3 * RECORD_COST
    ps.tracker.complete(1)
    assert ps.held_bytes() == want + 2 * RECORD_COST


# ------------------------------------------------------------------ librdkafka's share

def test_the_read_ahead_is_sized_from_the_bound() -> None:
    f = FetchSizes.of(64 * MiB)
    assert f == FetchSizes(4096, 2 * MiB, MiB)  # a 16th queued, a 32nd a fetch, 1 MiB a part
    small = FetchSizes.of(20 * MiB)  # librdkafka refuses fetch.max.bytes < message.max.bytes
    assert small == FetchSizes(1280, 1_000_000, 1_000_000)
    assert FetchSizes.of(10 * MiB, message_max_bytes=4 * MiB).fetch_bytes == 4 * MiB
    huge = FetchSizes.of(1 << 40)  # within what librdkafka takes
    assert huge.queue_kbytes == 2_097_151 and huge.fetch_bytes == 2_147_483_135
    assert f.read_ahead(3) == 4 * MiB + 3 * 2 * MiB


def test_the_consumer_gets_them_unless_its_config_sets_them() -> None:
    props = consumer_settings("b:9092", "g", in_flight_bytes=64 * MiB)
    assert props["queued.max.messages.kbytes"] == 4096 and props["fetch.max.bytes"] == 2 * MiB
    assert props["max.partition.fetch.bytes"] == MiB
    mine = consumer_settings("b:9092", "g", overrides={"queued.max.messages.kbytes": 777},
                             in_flight_bytes=64 * MiB)
    assert mine["queued.max.messages.kbytes"] == 777 and mine["fetch.max.bytes"] == 2 * MiB
    assert "fetch.max.bytes" not in consumer_settings("b:9092", "g")  # librdkafka's own
    cfg = WorkerConfig(topics=("t",), group_id="g", max_in_flight_bytes=20 * MiB,
                       consumer_config={"message.max.bytes": 3_000_000})
    assert cfg.consumer_properties("g")["fetch.max.bytes"] == 3_000_000


# ------------------------------------------------------------------ the formula

def test_the_worst_case_is_one_formula_of_the_settings() -> None:
    b = BASE.memory_bound()
    assert b.in_flight_bytes == 64 * MiB and b.hand_off_bytes == hand_off_bytes(64 * MiB)
    assert b.read_ahead == 4 * MiB + 3 * 2 * MiB
    assert b.total == b.idle + b.busy + 2 * (64 * MiB + 2 * b.read_ahead + 8 * MiB)
    assert b.total <= 300 * MiB  # the default worker: a 384 MiB pod (docs/CONFIG.md)
    text = b.describe()
    assert text.startswith("288 MiB = ") and "3 brokers" in text
    assert BASE.memory_bound(brokers=9).total > b.total
    # what consumer_config sets is what the formula uses
    own = WorkerConfig(topics=("t",), group_id="g",
                       consumer_config={"queued.max.messages.kbytes": 65536})
    assert own.memory_bound().read_ahead == 64 * MiB + 3 * 2 * MiB
    assert MemoryBound(10, 1, FetchSizes(1, 2, 2), brokers=1, loops=1, idle=0,
                       busy=0).total == 10 + 2 * (1024 + 2) + 1


# ------------------------------------------------------------------ every entrance

def test_the_bound_comes_from_code_toml_env_or_the_flag(tmp_path: Path) -> None:
    assert BASE.max_in_flight_bytes == DEFAULT_IN_FLIGHT_BYTES == BASE.loop.max_in_flight_bytes
    code = WorkerConfig(topics=("t",), group_id="g", max_in_flight_bytes=32 * MiB)
    assert code.loop.max_in_flight_bytes == 32 * MiB and code.loop.hand_off_bytes() == 4 * MiB
    toml = tmp_path / "kworkers.toml"
    toml.write_text('max_in_flight_bytes = "20MiB"\n')
    assert resolve(BASE, {}, {}, toml).max_in_flight_bytes == 20 * MiB
    env = {"KWORKERS_MAX_IN_FLIGHT_BYTES": "256MiB"}
    assert resolve(BASE, {}, env, toml).max_in_flight_bytes == 256 * MiB
    flags: dict[str, object] = {"max_in_flight_bytes": "1GiB"}
    assert resolve(BASE, flags, env, toml).max_in_flight_bytes == GiB
    toml.write_text("max_in_flight_bytes = 1048576\n")
    assert resolve(BASE, {}, {}, toml).max_in_flight_bytes == MiB
    with pytest.raises(ConfigError, match="KWORKERS_MAX_IN_FLIGHT_BYTES"):
        resolve(BASE, {}, {"KWORKERS_MAX_IN_FLIGHT_BYTES": "much"}, None)
    with pytest.raises(ConfigError, match=re.escape("kworkers.toml: max_in_flight_bytes")):
        toml.write_text('max_in_flight_bytes = "-3MiB"\n')
        resolve(BASE, {}, {}, toml)
    with pytest.raises(ConfigError, match="max_in_flight_bytes"):
        WorkerConfig(topics=("t",), group_id="g", max_in_flight_bytes=0)


def test_the_configmap_carries_it_as_a_size_and_reads_it_back() -> None:
    cfg = WorkerConfig(topics=("t",), group_id="g", max_in_flight_bytes=20 * MiB)
    env = config_env(cfg)
    assert env["KWORKERS_MAX_IN_FLIGHT_BYTES"] == "20MiB"
    assert config_from_env(env).max_in_flight_bytes == 20 * MiB


def test_kworkers_run_takes_it_as_a_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from kworkers.cli import run as run_cli

    seen: dict[str, object] = {}

    def prepare(_target: str, flags: dict[str, object], *_a: object) -> None:
        seen.update(flags)
        raise ConfigError("stop here")

    monkeypatch.setattr(run_cli, "prepare", prepare)
    out = CliRunner().invoke(run_cli.run, ["app:worker", "--max-in-flight-bytes", "20MiB"])
    assert isinstance(out.exception, ConfigError) and seen["max_in_flight_bytes"] == "20MiB"
    assert resolve(BASE, {"max_in_flight_bytes": seen["max_in_flight_bytes"]}, {},
                   None).max_in_flight_bytes == 20 * MiB


# ------------------------------------------------------------------ the container's limit

def test_the_container_limit_is_read_from_cgroup_v2_or_v1(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    assert cgroup_limit([v2, v1]) is None  # neither file: not in a container
    v1.write_text("9223372036854771712\n")  # cgroup v1's "no limit"
    assert cgroup_limit([v2, v1]) is None
    v1.write_text("536870912\n")
    assert cgroup_limit([v2, v1]) == 512 * MiB
    v2.write_text("max\n")  # v2 read first: no limit there
    assert cgroup_limit([v2, v1]) is None
    v2.write_text("402653184\n")
    assert cgroup_limit([v2, v1]) == 384 * MiB


def test_a_worker_whose_bound_exceeds_its_containers_limit_says_so_in_one_line() -> None:
    bound = BASE.memory_bound()
    assert over_limit(bound, None) is None and over_limit(bound, 512 * MiB) is None
    why = over_limit(bound, 256 * MiB)
    assert why is not None and "\n" not in why
    assert "288 MiB" in why and "256 MiB" in why and "max_in_flight_bytes (now 64MiB)" in why


def test_render_keeps_the_memory_it_is_given() -> None:
    from kworkers.deploy import EXAMPLE_ARGS, Resources, example_config, manifests

    def memory(**kw: object) -> dict[str, dict[str, str]]:
        dep = manifests(example_config(), **{**EXAMPLE_ARGS, **kw})
        res: dict[str, dict[str, str]] = (
            dep["k8s/deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]["resources"])
        return res

    assert memory()["limits"]["memory"] == "288Mi"
    own = memory(resources=Resources(memory_request="1Gi", memory_limit="2Gi"))
    assert own["requests"]["memory"] == "1Gi" and own["limits"]["memory"] == "2Gi"
    half = memory(resources=Resources(memory_limit="1Gi"))
    assert half["requests"]["memory"] == "288Mi" and half["limits"]["memory"] == "1Gi"
    with pytest.raises(ConfigError, match="brokers"):
        memory(brokers=0)
