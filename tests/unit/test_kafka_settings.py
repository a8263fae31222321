"""One client-settings value and every client's configuration; properties from the outside."""

from __future__ import annotations

from typing import Any

import pytest

from kworkers.config import WorkerConfig
from kworkers.errors import ConfigError
from kworkers.kafka.settings import (
    ClientSettings,
    admin_settings,
    consumer_settings,
    parse_properties,
    parse_property,
    producer_settings,
    properties_from_env,
    reader_settings,
    transactional_producer_settings,
)

SECRET = "pa55-w0rd-value"
SASL = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "svc", "sasl.password": SECRET}
CLIENT = ClientSettings.of("k1:9092", {**SASL, "client.id": "kw", "socket.timeout.ms": 5000})


def test_a_bare_address_gives_the_configurations_kworkers_always_used() -> None:
    assert consumer_settings("h:1", "g", "classic", {"fetch.min.bytes": 10}) == {
        "bootstrap.servers": "h:1", "group.id": "g", "enable.auto.commit": False,
        "enable.auto.offset.store": False, "auto.offset.reset": "earliest",
        "group.protocol": "classic", "max.poll.interval.ms": 300_000, "log_level": 4,
        "fetch.queue.backoff.ms": 10,
        "statistics.interval.ms": 1000, "enable.partition.eof": True,
        "partition.assignment.strategy": "cooperative-sticky", "fetch.min.bytes": 10,
        # failover for worker pools: 10 s, not librdkafka's 45 s (the client decides)
        "session.timeout.ms": 10_000, "heartbeat.interval.ms": 3_000}
    kip848 = consumer_settings("h:1", "g", "consumer")  # the broker decides: nothing to set
    assert not {"partition.assignment.strategy", "session.timeout.ms",
                "heartbeat.interval.ms"} & set(kip848)
    assert consumer_settings("h:1", "g", overrides={"session.timeout.ms": 45_000})[
        "session.timeout.ms"] == 45_000
    assert producer_settings("h:1")["linger.ms"] == 20  # hand-offs come in bursts
    assert producer_settings("h:1", {"linger.ms": 50}) == {
        "bootstrap.servers": "h:1", "enable.idempotence": True, "acks": "all",
        "linger.ms": 50, "delivery.timeout.ms": 30_000, "log_level": 4}


@pytest.mark.parametrize("conf", [
    consumer_settings(CLIENT, "g"), producer_settings(CLIENT), admin_settings(CLIENT),
    reader_settings(CLIENT), transactional_producer_settings(CLIENT, "tx"),
])
def test_every_client_gets_the_address_the_security_and_the_overrides(conf: dict[str, object]
                                                                      ) -> None:
    assert conf["bootstrap.servers"] == "k1:9092"
    assert {k: conf[k] for k in SASL} == SASL
    assert conf["client.id"] == "kw" and conf["socket.timeout.ms"] == 5000


def test_kworkers_owns_what_its_guarantees_rest_on() -> None:
    loose = ClientSettings.of("h:1", {"auto.offset.reset": "latest", "log_level": 7})
    r = reader_settings(loose)
    assert r["isolation.level"] == "read_committed" and r["enable.auto.commit"] is False
    assert r["log_level"] == 7 and r["auto.offset.reset"] == "latest"  # overrides win defaults
    assert transactional_producer_settings(loose, "tx-1")["transactional.id"] == "tx-1"
    c = consumer_settings(loose, "g", overrides={"auto.offset.reset": "earliest"})
    assert c["auto.offset.reset"] == "earliest"  # the role's own overrides win the shared ones
    for key in ("group.id", "enable.auto.commit", "isolation.level", "transactional.id",
                "bootstrap.servers"):
        with pytest.raises(ConfigError, match="set by kworkers itself"):
            ClientSettings.of("h:1", {key: "x"})


def test_security_and_overrides_are_split_and_checked() -> None:
    assert CLIENT.security == SASL
    assert CLIENT.overrides == {"client.id": "kw", "socket.timeout.ms": 5000}
    with pytest.raises(ConfigError, match="belong in the security part"):
        ClientSettings("h:1", overrides={"sasl.username": "u"})
    with pytest.raises(ConfigError, match="belong in the overrides part"):
        ClientSettings("h:1", security={"client.id": "u"})
    with pytest.raises(ConfigError, match="not a librdkafka property name"):
        ClientSettings.of("h:1", {"bad key": 1})
    with pytest.raises(ConfigError, match="must not be empty"):
        ClientSettings(" ")


def test_credentials_alone_mean_sasl_plain() -> None:
    creds = {"sasl.username": "u", "sasl.password": "p"}
    assert ClientSettings.of("h:1", creds).security == {
        **creds, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}
    tls = ClientSettings.of("h:1", {**creds, "ssl.ca.location": "/ca.pem"})
    assert tls.security["security.protocol"] == "SASL_SSL"
    plural = ClientSettings.of("h:1", {**creds, "sasl.mechanisms": "SCRAM-SHA-256"})
    assert "sasl.mechanism" not in plural.security
    with pytest.raises(ConfigError, match="go together"):
        ClientSettings.of("h:1", {"sasl.username": "u"})


def test_secrets_never_show() -> None:
    assert SECRET not in repr(CLIENT) and "'sasl.password': '****'" in repr(CLIENT)
    assert "svc" in repr(CLIENT)  # a user name is not a secret
    text = f"auth failed for svc with {SECRET} at k1"
    assert CLIENT.redact(text) == "auth failed for svc with **** at k1"
    # canary: settings without that secret leave the text alone, so the check can fail
    assert ClientSettings("k1:9092").redact(text) == text
    with pytest.raises(ConfigError) as bad:
        ClientSettings.of("h:1", {"sasl.password": [SECRET]})
    assert SECRET not in str(bad.value)
    cfg = WorkerConfig(topics=("t",), group_id="g", client_config=SASL)
    assert SECRET not in repr(cfg) and cfg.client.security == SASL


def test_worker_config_keeps_connection_settings_in_one_place() -> None:
    for name in ("consumer_config", "producer_config"):
        settings: dict[str, Any] = {name: {"sasl.password": "x"}}  # WorkerConfig's own type
        with pytest.raises(ConfigError, match=rf"^{name}: \['sasl.password'\].*client_config"):
            WorkerConfig(topics=("t",), group_id="g", **settings)
    with pytest.raises(ConfigError, match="set by kworkers itself"):
        WorkerConfig(topics=("t",), group_id="g", client_config={"group.id": "x"})
    cfg = WorkerConfig(topics=("t",), group_id="g", bootstrap_servers="b:1",
                       client_config={"client.id": "w"})
    assert cfg.client == ClientSettings("b:1", overrides={"client.id": "w"})


def test_property_flags() -> None:
    assert parse_property("security.protocol=SASL_SSL") == ("security.protocol", "SASL_SSL")
    assert parse_property("sasl.password=a=b") == ("sasl.password", "a=b")
    for bad in ("sasl.password", f"={SECRET}", f"two words={SECRET}"):
        with pytest.raises(ConfigError, match=r"^-X: expected a librdkafka property") as e:
            parse_property(bad)
        assert SECRET not in str(e.value)


def test_properties_file() -> None:
    text = (
        "# Kafka client properties\n"
        "bootstrap.servers=b1:9092,b2:9092\n"
        "! another comment\n"
        "security.protocol : SASL_SSL\n"
        "sasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule \\\n"
        f'    required username="svc" password="{SECRET}";\n'
        "\n"
        "client.id=ops\n"
    )
    assert parse_properties(text, "c.properties") == {
        "bootstrap.servers": "b1:9092,b2:9092", "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN", "sasl.username": "svc", "sasl.password": SECRET,
        "client.id": "ops"}


def test_java_oidc_and_pem_truststore_properties_are_translated() -> None:
    text = (
        "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\n"
        "sasl.oauthbearer.token.endpoint.url=https://idp.example/token\n"
        "sasl.login.callback.handler.class=org.apache.kafka.common.security.oauthbearer."
        "OAuthBearerLoginCallbackHandler\n"
        "sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule "
        f'required clientId="svc" clientSecret="{SECRET}" scope="kafka";\n'
        "ssl.truststore.type=PEM\nssl.truststore.location=/etc/kafka/ca.pem\n")
    assert parse_properties(text, "c.properties") == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.token.endpoint.url": "https://idp.example/token",
        "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": "svc",
        "sasl.oauthbearer.client.secret": SECRET, "sasl.oauthbearer.scope": "kafka",
        "ssl.ca.location": "/etc/kafka/ca.pem"}


@pytest.mark.parametrize(("text", "match"), [
    ("sasl.login.callback.handler.class=com.example.MyHandler\n", "names a Java class"),
    ("ssl.truststore.location=/etc/kafka/trust.jks\n", "a JKS truststore, which only Java"),
    ("ssl.truststore.type=PKCS12\nssl.truststore.location=/t.p12\n", "a PKCS12 truststore"),
    (f"just-a-line-{SECRET}\n", "c.properties:1: expected key=value"),
    ("a=1\n[retry]\n", "c.properties:2: expected key=value"),
    ("a=1\\\n", "ends inside a continued line"),
    ("sasl.jaas.config=com.sun.security.auth.module.Krb5LoginModule required;\n",
     "sasl.jaas.config is for Java clients"),
])
def test_properties_file_errors_name_the_line_never_the_value(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        parse_properties(text, "c.properties")
    assert SECRET not in str(e.value)


def test_properties_from_environment() -> None:
    env = {"KWORKERS_SASL_USERNAME": "u", "KWORKERS_SASL_PASSWORD": "p",
           "KWORKERS_SSL_CA_LOCATION": "/ca.pem", "KWORKERS_KAFKA_LOG_LEVEL": "7",
           "KWORKERS_SECURITY_PROTOCOL": "", "KWORKERS_CONCURRENCY": "3"}
    assert properties_from_env(env) == {"sasl.username": "u", "sasl.password": "p",
                                        "ssl.ca.location": "/ca.pem", "log_level": "7"}
