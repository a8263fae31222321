"""Settings from TOML, KWORKERS_* and flags: parsing, precedence, and errors that name a source."""

from __future__ import annotations

from pathlib import Path

import pytest

from kworkers.config import WorkerConfig
from kworkers.errors import ConfigError
from kworkers.kafka.settings import ClientSettings
from kworkers.retry_tiers.policy import RetryPolicy
from kworkers.retry_tiers.tiers import TierLadder
from kworkers.settings import (
    apply,
    client_flags,
    client_settings,
    env_name,
    env_vars,
    from_env,
    from_flags,
    from_toml,
    load_file,
    load_toml,
    merge,
    overrides,
    parse_duration,
    parse_rate,
    parse_tiers,
    resolve,
)

BASE = WorkerConfig(topics=("orders",), group_id="billing", concurrency=4,
                    retry=RetryPolicy(initial=2.0, max_attempts=7),
                    consumer_config={"fetch.min.bytes": 1, "session.timeout.ms": 10_000})


@pytest.mark.parametrize(("text", "seconds"), [
    ("500ms", 0.5), ("1s", 1.0), ("2m", 120.0), ("1h", 3600.0), ("1.5s", 1.5), (" 10s ", 10.0),
    ("3", 3.0), (2, 2.0), (0.25, 0.25),
])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "1x", "s", "-1s", "0s", "1 d", True, None, [1], "nan"])
def test_bad_durations_name_the_setting(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"^--tiers"):
        parse_duration(bad, "--tiers")


def test_tiers_from_labels_and_lists() -> None:
    assert parse_tiers("1s,5s,30s,2m,10m") == TierLadder((1, 5, 30, 120, 600))
    assert parse_tiers("500ms, 1s") == TierLadder((0.5, 1.0))
    assert parse_tiers(["250ms", 1, "2m"]) == TierLadder((0.25, 1.0, 120.0))


@pytest.mark.parametrize("bad", ["", ",", "5s,1s", "1s,1s", "1x", "1.0005s", 7])
def test_bad_tiers(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"^tiers"):
        parse_tiers(bad)


@pytest.mark.parametrize(("text", "rate"), [
    ("50", 50.0), ("50/s", 50.0), ("600/m", 10.0), ("3600/h", 1.0), ("0.5/s", 0.5),
])
def test_rates(text: str, rate: float) -> None:
    assert parse_rate(text) == rate


@pytest.mark.parametrize("bad", ["", "x", "0", "0/s", "5/d", "-1/s"])
def test_bad_rates(bad: str) -> None:
    with pytest.raises(ConfigError, match="rate"):
        parse_rate(bad)


def test_env_names() -> None:
    assert env_name("concurrency") == "KWORKERS_CONCURRENCY"
    assert env_name("retry.max_attempts") == "KWORKERS_RETRY_MAX_ATTEMPTS"


def test_env_reads_known_variables_only() -> None:
    env = {
        "KWORKERS_BOOTSTRAP_SERVERS": "k1:9092,k2:9092",
        "KWORKERS_GROUP_ID": "g2",
        "KWORKERS_CONCURRENCY": "16",
        "KWORKERS_TOPICS": "a, b",
        "KWORKERS_TIERS": "1s,10s",
        "KWORKERS_RETRY_MAX_ATTEMPTS": "3",
        "KWORKERS_MESSAGE_TIMEOUT": "off",
        # test tooling and empty values: not settings, not errors
        "KWORKERS_BOOTSTRAP": "elsewhere:1", "KWORKERS_KAFKA_IMAGE": "x", "KWORKERS_ORDERING": "",
        "PATH": "/bin",
    }
    assert from_env(env) == {
        "bootstrap_servers": "k1:9092,k2:9092", "group_id": "g2", "concurrency": 16,
        "topics": ("a", "b"), "tiers": TierLadder((1.0, 10.0)), "retry.max_attempts": 3,
        "message_timeout": None,
    }


@pytest.mark.parametrize(("var", "value"), [
    ("KWORKERS_CONCURRENCY", "many"), ("KWORKERS_CONCURRENCY", "0"),
    ("KWORKERS_ORDERING", "random"), ("KWORKERS_DRAIN_TIMEOUT", "soon"),
    ("KWORKERS_RETRY_BACKOFF", "-2"),
])
def test_env_errors_name_the_variable(var: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"^{var}:"):
        from_env({var: value})


def test_toml_layer_with_nested_tables() -> None:
    layer = from_toml({
        "group_id": "g3", "concurrency": 2, "ordering": "key", "drain_timeout": "45s",
        "retry": {"max_attempts": 9, "initial": "250ms", "non_retryable": ["BadSpec"]},
        "commit": {"interval_s": 2},
        "consumer_config": {"session.timeout.ms": 6000},
    })
    assert layer == {
        "group_id": "g3", "concurrency": 2, "ordering": "key", "drain_timeout": 45.0,
        "retry.max_attempts": 9, "retry.initial": 0.25, "retry.non_retryable": ("BadSpec",),
        "commit.interval_s": 2.0, "consumer_config": {"session.timeout.ms": 6000},
    }


@pytest.mark.parametrize(("data", "match"), [
    ({"concurency": 2}, "unknown setting 'concurency'"),
    ({"retry": {"max_attempt": 2}}, "unknown setting 'retry.max_attempt'"),
    ({"concurrency": "2x"}, "concurrency: expected a whole number"),
    ({"concurrency": True}, "concurrency: expected a whole number"),
    ({"consumer_config": "x"}, "consumer_config: expected a table"),
    ({"topics": []}, "topics: must not be empty"),
])
def test_toml_errors_name_file_and_key(data: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=f"^kworkers.toml: {match}"):
        from_toml(data)


def test_load_toml_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_toml(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("concurrency = = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(bad)


def test_flags_skip_unset_values() -> None:
    assert from_flags({"concurrency": None, "topics": (), "group_id": "g"}) == {"group_id": "g"}
    with pytest.raises(ConfigError, match=r"^--concurrency"):
        from_flags({"concurrency": 0})


def test_merge_later_layer_wins_and_client_tables_merge_by_key() -> None:
    toml = {"concurrency": 2, "group_id": "from-toml", "consumer_config": {"a": 1, "b": 1}}
    env = {"concurrency": 3, "consumer_config": {"b": 2}}
    flags = {"concurrency": 4}
    assert merge(toml, env, flags) == {
        "concurrency": 4, "group_id": "from-toml", "consumer_config": {"a": 1, "b": 2},
    }


def test_apply_replaces_nested_fields_and_keeps_the_rest() -> None:
    cfg = apply(BASE, {"retry.max_attempts": 3, "concurrency": 32, "tiers": "1s,2s",
                       "consumer_config": {"session.timeout.ms": 6000}})
    assert cfg.retry == RetryPolicy(initial=2.0, max_attempts=3)  # initial kept
    assert cfg.concurrency == 32
    assert cfg.tiers == TierLadder((1.0, 2.0))
    assert cfg.consumer_config == {"fetch.min.bytes": 1, "session.timeout.ms": 6000}
    assert (cfg.topics, cfg.group_id) == (BASE.topics, BASE.group_id)
    assert apply(BASE, {}) is BASE


def test_apply_lets_the_config_validate() -> None:
    with pytest.raises(ConfigError, match="consumer_config"):
        apply(BASE, {"consumer_config": {"enable.auto.commit": True}})
    with pytest.raises(ConfigError, match="is a retry tier"):
        apply(BASE, {"topics": ("orders.dlq",)})


def test_precedence_cli_over_env_over_toml_over_worker(tmp_path: Path) -> None:
    toml = tmp_path / "kworkers.toml"
    toml.write_text(
        'bootstrap_servers = "toml:9092"\n'
        'group_id = "toml-group"\n'
        "concurrency = 2\n"
        "drain_timeout = 5\n"
        "[retry]\n"
        "max_attempts = 11\n"
    )
    env = {"KWORKERS_GROUP_ID": "env-group", "KWORKERS_CONCURRENCY": "3",
           "KWORKERS_DRAIN_TIMEOUT": "6s"}
    flags: dict[str, object] = {"concurrency": 4, "group_id": None}
    cfg = resolve(BASE, flags, env, toml)
    assert cfg.concurrency == 4  # flag
    assert cfg.group_id == "env-group"  # env (no flag)
    assert cfg.drain_timeout == 6.0  # env over TOML
    assert cfg.bootstrap_servers == "toml:9092"  # TOML (no env, no flag)
    assert cfg.retry.max_attempts == 11 and cfg.retry.initial == 2.0  # TOML over the worker's
    assert cfg.topics == ("orders",)  # the worker's own
    assert overrides() == {}


# --- how a command reaches the cluster (the same layers for every command) -------------------


def test_client_settings_flags_over_env_over_file(tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text("bootstrap.servers=file:9092\nsecurity.protocol=SASL_SSL\n"
                     "sasl.username=file-user\nsasl.password=file-pass\nclient.id=from-file\n")
    env = {"KWORKERS_SASL_USERNAME": "env-user", "KWORKERS_SASL_PASSWORD": "env-pass",
           "KWORKERS_BOOTSTRAP_SERVERS": "env:9092"}
    flags = client_flags(None, ["client.id=from-flag", "socket.timeout.ms=5000"])
    c = client_settings(flags, env, props)
    assert c.bootstrap_servers == "env:9092"
    assert c.security == {"security.protocol": "SASL_SSL", "sasl.username": "env-user",
                          "sasl.password": "env-pass", "sasl.mechanism": "PLAIN"}
    assert c.overrides == {"client.id": "from-flag", "socket.timeout.ms": "5000"}
    assert client_settings(client_flags("flag:1", ["bootstrap.servers=x:1"]), env,
                           props).bootstrap_servers == "flag:1"
    assert client_settings(client_flags(None, ["bootstrap.servers=x:1"]), env,
                           props).bootstrap_servers == "x:1"
    assert client_settings() == ClientSettings("127.0.0.1:9092")


def test_a_kworkers_toml_is_a_config_file_too(tmp_path: Path) -> None:
    toml = tmp_path / "kworkers.toml"
    toml.write_text('bootstrap_servers = "toml:9092"\nconcurrency = 3\n'
                    '[client_config]\n"security.protocol" = "SSL"\n"ssl.ca.location" = "/ca"\n')
    c = client_settings(path=toml)
    assert c == ClientSettings("toml:9092", {"security.protocol": "SSL",
                                             "ssl.ca.location": "/ca"})
    cfg = resolve(BASE, {}, {"KWORKERS_SASL_USERNAME": "u", "KWORKERS_SASL_PASSWORD": "p"}, toml)
    assert cfg.concurrency == 3 and cfg.bootstrap_servers == "toml:9092"
    assert cfg.client_config == {"security.protocol": "SSL", "ssl.ca.location": "/ca",
                                 "sasl.username": "u", "sasl.password": "p"}


def test_run_reads_the_security_variables() -> None:
    env = {"KWORKERS_SECURITY_PROTOCOL": "SASL_SSL", "KWORKERS_SASL_MECHANISM": "SCRAM-SHA-256",
           "KWORKERS_SASL_USERNAME": "u", "KWORKERS_SASL_PASSWORD": "p"}
    cfg = resolve(BASE, None, env)
    assert cfg.client.security == {"security.protocol": "SASL_SSL", "sasl.username": "u",
                                   "sasl.mechanism": "SCRAM-SHA-256", "sasl.password": "p"}
    assert set(env) <= env_vars()


def test_a_properties_file_holds_client_properties_only(tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text("concurrency=4\n")  # a worker setting is not a librdkafka property...
    assert load_file(props) == {"client_config": {"concurrency": "4"}}  # ...librdkafka says so
    props.write_text("[retry]\nmax_attempts = 2\n")
    with pytest.raises(ConfigError, match=r"client.properties:1: .* must end in \.toml"):
        load_file(props)


def test_a_rate_limit_comes_from_toml_env_or_the_flag(tmp_path: Path) -> None:
    """``[rate_limit]`` in kworkers.toml, ``KWORKERS_RATE_LIMIT_*``, ``--rate-limit 50/s``:
    setting any of its fields switches the limit on, the others keep their defaults."""
    from kworkers.pace import RateLimit

    toml = tmp_path / "kworkers.toml"
    toml.write_text('[rate_limit]\nper_second = 20\nscope = "replica"\n')
    cfg = resolve(BASE, {}, {"KWORKERS_RATE_LIMIT_BURST": "30"}, toml)
    assert cfg.rate_limit == RateLimit(per_second=20.0, burst=30, scope="replica")
    flags: dict[str, object] = {"rate_limit.per_second": parse_rate("600/m")}
    cfg = resolve(BASE, flags, {}, toml)
    assert cfg.rate_limit == RateLimit(per_second=10.0, scope="replica")
    assert resolve(BASE, {}, {}, None).rate_limit is None  # off unless asked for
    with pytest.raises(ConfigError, match="KWORKERS_RATE_LIMIT_SCOPE"):
        resolve(BASE, {}, {"KWORKERS_RATE_LIMIT_PER_SECOND": "5",
                           "KWORKERS_RATE_LIMIT_SCOPE": "everyone"}, None)
