"""Rendered manifests: schema-valid, consistent with the WorkerConfig, committed copies current."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kworkers import RetryPolicy, TierLadder, WorkerConfig, settings
from kworkers.consumer.commit import CommitPolicy
from kworkers.deploy import (
    EXAMPLE_ARGS,
    config_env,
    config_from_env,
    cross_problems,
    example_config,
    example_files,
    keda_problems,
    manifests,
    render,
    validate_core,
)
from kworkers.deploy.yamltext import dump, scalar
from kworkers.errors import ConfigError
from kworkers.keda import ScalerSettings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.30"


def sample(**kw: Any) -> dict[str, dict[str, Any]]:
    return manifests(example_config(), **{**EXAMPLE_ARGS, **kw})


def test_committed_examples_match_a_fresh_render() -> None:
    files = example_files()
    assert set(files) == {"k8s/configmap.yaml", "k8s/deployment.yaml",
                          "keda/scaledobject.yaml", "keda/triggerauthentication.yaml"}
    stale = [n for n, text in files.items()
             if not (DEPLOY / n).exists() or (DEPLOY / n).read_text("utf-8") != text]
    assert not stale, f"{stale} differ from render(): run `python -m kworkers.deploy`"


def test_yaml_text_reads_back_as_the_objects() -> None:
    objs = sample()
    for name, text in render(example_config(), **EXAMPLE_ARGS).items():
        assert yaml.safe_load(text) == objs[name], name


def test_core_kinds_pass_the_kubernetes_schema() -> None:
    objs = sample()
    core = [o for o in objs.values() if o["apiVersion"] in ("v1", "apps/v1")]
    assert {o["kind"] for o in core} == {"ConfigMap", "Deployment"}
    for obj in core:
        validate_core(obj, K8S_VERSION)


def test_schema_check_can_fail() -> None:
    dep = copy.deepcopy(sample()["k8s/deployment.yaml"])
    dep["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 55  # misspelt
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_core(dep, K8S_VERSION)


def test_keda_objects_pass_the_structural_check() -> None:
    objs = sample()
    for name in ("keda/scaledobject.yaml", "keda/triggerauthentication.yaml"):
        assert keda_problems(objs[name]) == [], name
    assert cross_problems(objs) == []


@pytest.mark.parametrize("mutate, expect", [
    (lambda so: so.update(apiVersion="keda.sh/v1"), "apiVersion"),
    (lambda so: so["spec"]["triggers"][0]["metadata"].update(lagTreshold="5"), "lagTreshold"),
    (lambda so: so["spec"]["triggers"][1]["metadata"].update(excludePersistentLag=True),
     "must be a string"),
    (lambda so: so["spec"]["triggers"][0]["metadata"].update(offsetResetPolicy="smallest"),
     "offsetResetPolicy"),
    (lambda so: so["spec"]["triggers"][0]["metadata"].pop("consumerGroup"), "consumerGroup"),
    (lambda so: so["spec"]["triggers"][0]["metadata"].update(lagThreshold="0"), "> 0"),
    (lambda so: so["spec"].pop("scaleTargetRef"), "scaleTargetRef"),
    (lambda so: so["spec"].update(maxReplicas=3), "spec.maxReplicas"),
    (lambda so: so["spec"].update(minReplicaCount=7), "minReplicaCount 7 > maxReplicaCount"),
    (lambda so: so["spec"].update(triggers=[]), "triggers"),
])
def test_keda_check_catches(mutate: Any, expect: str) -> None:
    so = copy.deepcopy(sample()["keda/scaledobject.yaml"])
    mutate(so)
    problems = keda_problems(so)
    assert any(expect in p for p in problems), problems


def test_triggerauth_check_catches_a_bad_parameter() -> None:
    ta = copy.deepcopy(sample()["keda/triggerauthentication.yaml"])
    ta["spec"]["secretTargetRef"][0]["parameter"] = "user"
    assert any("'user'" in p for p in keda_problems(ta))


def test_cross_check_catches_a_dangling_auth() -> None:
    objs = sample()
    del objs["keda/triggerauthentication.yaml"]
    assert cross_problems(objs)


def test_max_replicas_defaults_to_and_may_not_exceed_partitions() -> None:
    assert sample()["keda/scaledobject.yaml"]["spec"]["maxReplicaCount"] == 6
    assert sample(max_replicas=4)["keda/scaledobject.yaml"]["spec"]["maxReplicaCount"] == 4
    with pytest.raises(ConfigError, match="7 > 6 partitions"):
        sample(max_replicas=7)
    with pytest.raises(ConfigError):
        sample(min_replicas=5, max_replicas=4)
    with pytest.raises(ConfigError):
        sample(partitions=0)
    with pytest.raises(ConfigError, match="allowIdleConsumers"):
        sample(scaler=ScalerSettings(allow_idle_consumers=True))


def test_grace_period_covers_drain_and_revoke() -> None:
    cfg = WorkerConfig(topics=("orders",), group_id="g", drain_timeout=42.5, revoke_timeout=5,
                       bootstrap_servers="k:9092")
    dep = manifests(cfg, **EXAMPLE_ARGS)["k8s/deployment.yaml"]
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 63  # 47.5 -> 48 + 15
    default = sample()["k8s/deployment.yaml"]
    assert default["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 30 + 10 + 15


def test_grace_period_follows_started_work_not_the_queue() -> None:
    """A stop waits for started handler calls only, so their deadline bounds it."""
    cfg = WorkerConfig(topics=("orders",), group_id="g", message_timeout=5, revoke_timeout=5,
                       bootstrap_servers="k:9092")
    dep = manifests(cfg, **EXAMPLE_ARGS)["k8s/deployment.yaml"]
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 5 + 5 + 15


def test_deployment_runs_the_module_and_probes_the_metrics_port() -> None:
    dep = sample(metrics_port=9300)["k8s/deployment.yaml"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["kworkers"]
    assert c["args"] == ["run", "kworkers.deploy.example:worker", "--metrics-port", "9300"]
    assert c["ports"] == [{"name": "metrics", "containerPort": 9300, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert "lifecycle" not in c  # SIGTERM drains: no preStop hook
    assert c["envFrom"] == [{"configMapRef": {"name": "orders-config"}}]
    secret_env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"]}
    assert secret_env == {
        "KWORKERS_SASL_USERNAME": {"name": "orders-kafka-sasl", "key": "username"},
        "KWORKERS_SASL_PASSWORD": {"name": "orders-kafka-sasl", "key": "password"},
    }
    assert set(c["resources"]) == {"requests", "limits"}
    assert "replicas" not in dep["spec"]  # KEDA owns the count
    # a bare module name runs its `worker`
    bare = sample(module="orders.app")["k8s/deployment.yaml"]
    assert bare["spec"]["template"]["spec"]["containers"][0]["args"][1] == "orders.app:worker"
    with pytest.raises(ConfigError):
        sample(module="orders app")


def test_triggers_watch_both_groups_and_waiting_retries_do_not_scale() -> None:
    """Issue #47 item 3: Kafka triggers on both groups only wake the pool (a lagThreshold no
    lag reaches: they ask for 1 replica at most), a Prometheus trigger on the drainable lag of
    both groups grows it; excludePersistentLag is never relied on."""
    from kworkers.deploy.autoscale import ACTIVATION_ONLY_LAG_THRESHOLD, drainable_query

    cfg = example_config()
    so = sample()["keda/scaledobject.yaml"]
    triggers = so["spec"]["triggers"]
    kafka = [t["metadata"] for t in triggers if t["type"] == "kafka"]
    main = [m for m in kafka if m["consumerGroup"] == cfg.group_id]
    retry = [m for m in kafka if m["consumerGroup"] == cfg.retry_group_id]
    assert [m["topic"] for m in main] == list(cfg.topics)
    assert [m["topic"] for m in retry] == list(cfg.tier_topics())
    assert len(main) + len(retry) == len(kafka)
    for m in kafka:
        assert m["lagThreshold"] == str(ACTIVATION_ONLY_LAG_THRESHOLD)
        assert m["activationLagThreshold"] == "0"
        assert m["excludePersistentLag"] == "false"
        assert m["bootstrapServers"] == cfg.bootstrap_servers
        assert m["offsetResetPolicy"] == "earliest"  # the worker's auto.offset.reset
        assert m["sasl"] == "plaintext"
    [drain] = [t for t in triggers if t["type"] == "prometheus"]
    assert drain["metadata"]["query"] == drainable_query((cfg.group_id, cfg.retry_group_id))
    assert drain["metadata"]["threshold"] == "100"
    assert so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"][
        "scaleDown"]["stabilizationWindowSeconds"] == 300
    # without a Prometheus server: the main group's raw lag, the tiers still only wake
    raw = sample(prometheus=None)["keda/scaledobject.yaml"]["spec"]["triggers"]
    assert {t["type"] for t in raw} == {"kafka"}
    assert [t["metadata"]["lagThreshold"] for t in raw
            if t["metadata"]["consumerGroup"] == cfg.group_id] == ["100"]
    assert {t["metadata"]["lagThreshold"] for t in raw
            if t["metadata"]["consumerGroup"] == cfg.retry_group_id} == {
        str(ACTIVATION_ONLY_LAG_THRESHOLD)}
    assert {t["authenticationRef"]["name"] for t in triggers
            if t["type"] == "kafka"} == {"orders-kafka-auth"}
    ta = sample()["keda/triggerauthentication.yaml"]
    assert {(r["parameter"], r["name"], r["key"]) for r in ta["spec"]["secretTargetRef"]} == {
        ("username", "orders-kafka-sasl", "username"),
        ("password", "orders-kafka-sasl", "password"), ("ca", "orders-kafka-ca", "ca.crt")}
    assert so["spec"]["scaleTargetRef"]["name"] == sample()["k8s/deployment.yaml"]["metadata"][
        "name"]


def test_without_sasl_there_is_no_secret_anywhere() -> None:
    objs = sample(sasl_secret=None, tls_secret=None)
    assert "keda/triggerauthentication.yaml" not in objs
    for t in objs["keda/scaledobject.yaml"]["spec"]["triggers"]:
        assert "authenticationRef" not in t and "sasl" not in t["metadata"]
    c = objs["k8s/deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    assert "env" not in c
    assert "KWORKERS_SASL_MECHANISM" not in objs["k8s/configmap.yaml"]["data"]
    assert cross_problems(objs) == []
    for obj in objs.values():
        if obj["apiVersion"].startswith("keda"):
            assert keda_problems(obj) == []
        else:
            validate_core(obj, K8S_VERSION)


def test_configmap_describes_the_config() -> None:
    data = sample()["k8s/configmap.yaml"]["data"]
    assert data["KWORKERS_BOOTSTRAP_SERVERS"] == "kafka-bootstrap.kafka.svc:9092"
    assert data["KWORKERS_GROUP_ID"] == "orders-workers"
    assert data["KWORKERS_TOPICS"] == "orders"
    assert data["KWORKERS_TIERS"] == "1,5,30,120,600"
    assert data["KWORKERS_SECURITY_PROTOCOL"] == "SASL_SSL"  # --sasl-secret: over TLS
    assert data["KWORKERS_SSL_CA_LOCATION"] == "/etc/kworkers/tls/ca.crt"  # the mounted Secret
    assert "KWORKERS_SASL_PASSWORD" not in data
    env = {**data, "KWORKERS_SASL_USERNAME": "u", "KWORKERS_SASL_PASSWORD": "p"}
    cfg = config_from_env(env)
    assert cfg.client_config == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                                 "ssl.ca.location": "/etc/kworkers/tls/ca.crt",
                                 "sasl.username": "u", "sasl.password": "p"}
    assert cfg.consumer_config == cfg.producer_config == {}  # one place for every client


def test_every_configmap_variable_is_one_kworkers_run_reads() -> None:
    # one scheme: `kworkers run` applies kworkers.settings.from_env over the module's config,
    # the SASL variables included (they become the client_config every client gets)
    data = sample()["k8s/configmap.yaml"]["data"]
    assert set(data) <= settings.env_vars()
    layer = settings.from_env(data)
    security = {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                "ssl.ca.location": "/etc/kworkers/tls/ca.crt"}
    assert layer.pop("client_config") == security
    assert {settings.env_name(n) for n in layer} == set(data) - {
        "KWORKERS_SECURITY_PROTOCOL", "KWORKERS_SASL_MECHANISM", "KWORKERS_SSL_CA_LOCATION"}
    assert settings.apply(WorkerConfig(topics=("x",), group_id="y"), layer) == example_config()


CONFIGS = [
    WorkerConfig(topics=("t",), group_id="g"),
    WorkerConfig(
        topics=("orders", "payments"), group_id="g1", bootstrap_servers="k1:9092,k2:9092",
        ordering="key", concurrency=3, max_in_flight=900, max_in_flight_per_partition=300,
        message_timeout=2.5, commit=CommitPolicy(interval_s=0.5, max_completions=100),
        group_protocol="consumer",
        retry=RetryPolicy(initial=0.2, backoff=3, max_interval=9, max_attempts=4,
                          non_retryable=("Bad", "Worse")),
        tiers=TierLadder((0.25, 2, 60)), jitter_seed=11, revoke_timeout=4, drain_timeout=12,
        delay_buffer=77, consume_batch=50),
]


@pytest.mark.parametrize("cfg", CONFIGS)
def test_env_round_trip(cfg: WorkerConfig) -> None:
    assert config_from_env(config_env(cfg)) == cfg
    # over a worker's own config with other values, the variables win everywhere
    other = WorkerConfig(topics=("z",), group_id="other", concurrency=99, message_timeout=7,
                         retry=RetryPolicy(non_retryable=("X",)), jitter_seed=5)
    back = config_from_env(config_env(cfg), base=other)
    expect_nr = cfg.retry.non_retryable or ("X",)  # an empty list is not written
    expect_seed = 5 if cfg.jitter_seed is None else cfg.jitter_seed
    assert back == dataclasses.replace(
        cfg, retry=dataclasses.replace(cfg.retry, non_retryable=expect_nr),
        jitter_seed=expect_seed)


def test_client_tables_stay_with_the_worker_module() -> None:
    cfg = WorkerConfig(topics=("t",), group_id="g", consumer_config={"fetch.min.bytes": 1})
    env = config_env(cfg)
    assert not any("fetch" in k.lower() or "fetch" in v for k, v in env.items())
    assert config_from_env(env, base=cfg) == cfg


def test_env_errors_name_the_variable() -> None:
    with pytest.raises(ConfigError, match="KWORKERS_GROUP_ID"):
        config_from_env({"KWORKERS_TOPICS": "t"})
    with pytest.raises(ConfigError, match="KWORKERS_TOPICS"):
        config_from_env({"KWORKERS_GROUP_ID": "g"})
    with pytest.raises(ConfigError, match="KWORKERS_CONCURRENCY"):
        config_from_env({"KWORKERS_TOPICS": "t", "KWORKERS_GROUP_ID": "g",
                         "KWORKERS_CONCURRENCY": "eight"})
    with pytest.raises(ConfigError, match="go together"):
        config_from_env({"KWORKERS_TOPICS": "t", "KWORKERS_GROUP_ID": "g",
                         "KWORKERS_SASL_USERNAME": "u"})
    overridden = config_from_env({"KWORKERS_TOPICS": "t"}, group_id="mine")
    assert overridden.group_id == "mine"


def test_the_environment_wins_over_what_the_code_sets() -> None:
    """One precedence everywhere (flags > environment > file > code), as under kworkers run."""
    env = {"KWORKERS_TOPICS": "t", "KWORKERS_GROUP_ID": "from-env", "KWORKERS_CONCURRENCY": "3"}
    cfg = config_from_env(env, group_id="from-code", concurrency=12, drain_timeout=5.0)
    assert (cfg.group_id, cfg.concurrency, cfg.drain_timeout) == ("from-env", 3, 5.0)
    base = WorkerConfig(topics=("t",), group_id="g", concurrency=7)
    assert config_from_env({"KWORKERS_CONCURRENCY": "2"}, base=base, concurrency=9).concurrency == 2


@pytest.mark.parametrize("s", ["true", "True", "yes", "no", "on", "off", "null", "~", "1", "9100",
                               "0x1F", "1e3", ".inf", "-x", "a: b", "x:", "", "1:30", "#c",
                               "[a]", "{a}", "*a", "&a", "!a", "|", ">", "@a", "%a", "'q'",
                               "\"q\"", "a,b", "tab\there", "line\nbreak", "ünï", "kafka:9092",
                               "/healthz", "SASL_PLAINTEXT", "orders.retry.1s"])
def test_scalars_read_back_as_the_same_string(s: str) -> None:
    assert yaml.safe_load(f"k: {scalar(s)}\n") == {"k": s}


def test_dump_nested_structures() -> None:
    obj: dict[str, Any] = {"a": [{"b": 1, "c": ["x", "y"]}, {"d": {"e": True}}], "f": [],
                           "g": {"h": None}, "i": {}}
    text = dump(obj, "top\nsecond")
    assert text.startswith("# top\n# second\n")
    assert yaml.safe_load(text) == obj


# --- the client settings travel with the manifests, the secrets never -----------------------

SCRAM_TLS = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
             "ssl.ca.location": "/etc/kafka/ca.pem"}


def test_security_settings_travel_in_the_configmap_and_the_triggers() -> None:
    cfg = dataclasses.replace(example_config(), client_config=SCRAM_TLS)
    objs = manifests(cfg, **{**EXAMPLE_ARGS, "tls_secret": None})
    data = objs["k8s/configmap.yaml"]["data"]
    assert data["KWORKERS_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert data["KWORKERS_SASL_MECHANISM"] == "SCRAM-SHA-512"
    assert data["KWORKERS_SSL_CA_LOCATION"] == "/etc/kafka/ca.pem"
    for t in objs["keda/scaledobject.yaml"]["spec"]["triggers"]:
        if t["type"] != "kafka":
            continue
        assert t["metadata"]["sasl"] == "scram_sha512" and t["metadata"]["tls"] == "enable"
        assert keda_problems(objs["keda/scaledobject.yaml"]) == []
    # what the pods read back is what was rendered, credentials from the Secret on top
    env = {**data, "KWORKERS_SASL_USERNAME": "u", "KWORKERS_SASL_PASSWORD": "p"}
    back = config_from_env(env)
    assert back.client_config == {**SCRAM_TLS, "sasl.username": "u", "sasl.password": "p"}
    assert settings.resolve(example_config(), None, env).client == back.client


@pytest.mark.parametrize(("client", "secret", "match"), [
    ({"sasl.username": "u", "sasl.password": "p"}, None, "pass sasl_secret"),
    ({"ssl.key.password": "k"}, None, "cannot carry"),
    ({"sasl.username": "u", "sasl.password": "p", "ssl.key.password": "k"}, "s", "cannot carry"),
])
def test_a_secret_is_never_rendered_nor_silently_dropped(client: dict[str, str],
                                                         secret: str | None,
                                                         match: str) -> None:
    cfg = dataclasses.replace(example_config(), client_config=client)
    with pytest.raises(ConfigError, match=match) as e:
        render(cfg, **{**EXAMPLE_ARGS, "sasl_secret": secret})
    assert "'p'" not in str(e.value) and "'k'" not in str(e.value)
    if secret is None and "sasl.username" in client:  # with the Secret, the pods get them
        files = render(cfg, **EXAMPLE_ARGS)
        assert not any("KWORKERS_SASL_PASSWORD: " in t or ": p\n" in t for t in files.values())


def test_every_worker_config_field_travels_the_configmap() -> None:
    # the settings are derived from WorkerConfig: a field added there (handoff_limit, the
    # optional breaker) is a KWORKERS_* variable with nothing kept in step by hand
    from kworkers.consumer.breaker import BreakerPolicy

    cfg = WorkerConfig(topics=("t",), group_id="g", handoff_limit=77, auto_create_topics=False,
                       breaker=BreakerPolicy(min_attempts=7, cooldown_s=2.5))
    env = config_env(cfg)
    assert env["KWORKERS_HANDOFF_LIMIT"] == "77" and env["KWORKERS_BREAKER_MIN_ATTEMPTS"] == "7"
    assert env["KWORKERS_AUTO_CREATE_TOPICS"] == "false"
    assert config_from_env(env) == cfg
    assert not any(k.startswith("KWORKERS_BREAKER_") for k in config_env(example_config()))


OIDC = {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.scope": "kafka",
        "sasl.oauthbearer.token.endpoint.url": "https://idp.example/oauth2/token"}


@pytest.mark.parametrize(("client", "args", "env_from_secret", "mounted"), [
    ({"sasl.mechanism": "SCRAM-SHA-512"}, {"tls_client_cert": True},
     ["KWORKERS_SASL_USERNAME", "KWORKERS_SASL_PASSWORD"], ["ca.crt", "tls.crt", "tls.key"]),
    ({"security.protocol": "SSL"}, {"sasl_secret": None, "tls_client_cert": True}, [],
     ["ca.crt", "tls.crt", "tls.key"]),
    (OIDC, {}, ["KWORKERS_SASL_OAUTHBEARER_CLIENT_ID", "KWORKERS_SASL_OAUTHBEARER_CLIENT_SECRET"],
     ["ca.crt"]),
])
def test_tls_and_oauth_pools_render_valid_and_consistent(client: dict[str, str],
                                                         args: dict[str, Any],
                                                         env_from_secret: list[str],
                                                         mounted: list[str]) -> None:
    cfg = dataclasses.replace(example_config(), client_config=client)
    objs = manifests(cfg, **{**EXAMPLE_ARGS, **args})
    pod = objs["k8s/deployment.yaml"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert [e["name"] for e in c.get("env", [])] == env_from_secret
    assert [i["key"] for i in pod["volumes"][0]["secret"]["items"]] == mounted
    assert c["volumeMounts"] == [{"name": "kafka-tls", "mountPath": "/etc/kworkers/tls",
                                  "readOnly": True}]
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    data = objs["k8s/configmap.yaml"]["data"]
    assert not {"KWORKERS_SASL_PASSWORD", "KWORKERS_SASL_OAUTHBEARER_CLIENT_SECRET"} & set(data)
    assert cross_problems(objs) == []
    for obj in objs.values():
        if obj["apiVersion"].startswith("keda"):
            assert keda_problems(obj) == [], obj
        else:
            validate_core(obj, K8S_VERSION)
    files = render(cfg, **{**EXAMPLE_ARGS, **args})
    assert "plaintext" not in "".join(files.values()).lower()  # every comment tells the truth


def test_a_triggerauthentication_reading_a_missing_configmap_key_is_caught() -> None:
    cfg = dataclasses.replace(example_config(), client_config=OIDC)
    objs = copy.deepcopy(manifests(cfg, **EXAMPLE_ARGS))
    assert cross_problems(objs) == []
    del objs["k8s/configmap.yaml"]["data"]["KWORKERS_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL"]
    assert "which the rendered ConfigMap lacks" in " ".join(cross_problems(objs))


def test_a_rate_limited_pool_names_its_own_max_replicas() -> None:
    """A pool-wide rate limit: the lag the limit causes must not scale the pool to every
    partition (issue #33), so render wants ``max_replicas`` and says why; the ConfigMap
    carries the limit as the variables ``kworkers run`` reads back."""
    from kworkers.pace import RateLimit

    cfg = dataclasses.replace(example_config(), rate_limit=RateLimit(per_second=100, burst=20))
    raw = {**EXAMPLE_ARGS, "prometheus": None}  # grown on raw lag: the workaround stays
    with pytest.raises(ConfigError, match="max_replicas: the pool is rate-limited"):
        manifests(cfg, **raw)
    # grown on drainable lag (issue #47): a pool at its limit has none, no workaround needed
    drained = render(cfg, **EXAMPLE_ARGS)["keda/scaledobject.yaml"]
    assert "maxReplicaCount: 6" in drained and "report no drainable lag" in " ".join(
        drained.replace("#", "").split())
    files = render(cfg, **{**raw, "max_replicas": 3})
    so = files["keda/scaledobject.yaml"]
    assert "maxReplicaCount: 3" in so and "kworkers_rate_limit_waiting" in so
    env = config_env(cfg)
    assert env["KWORKERS_RATE_LIMIT_PER_SECOND"] == "100"
    assert env["KWORKERS_RATE_LIMIT_BURST"] == "20"
    assert config_from_env(env, example_config()).rate_limit == cfg.rate_limit
    replica = dataclasses.replace(cfg, rate_limit=RateLimit(per_second=5, scope="replica"))
    assert "per pod" in render(replica, **EXAMPLE_ARGS)["keda/scaledobject.yaml"]
