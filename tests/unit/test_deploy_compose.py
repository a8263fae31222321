"""docker-compose.yml and the Prometheus files agree with the code they drive (no engine needed)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from kworkers import settings
from kworkers.deploy import env as envvars
from kworkers.testing.broker import _server_env
from kworkers.testing.registry import LOCAL_REGISTRY_IMAGE
from kworkers.testing.registry import _env as registry_env

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text("utf-8"))
    return data


def interpolate(text: str) -> str:
    """Compose's ``${VAR:-default}`` with every variable unset."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)


def test_every_service_is_on_the_host_network() -> None:
    services = compose()["services"]
    assert set(services) == {"kafka", "schema-registry", "init", "worker", "producer",
                             "prometheus"}
    for name, svc in services.items():
        assert svc["network_mode"] == "host", name


def test_kafka_is_configured_like_the_test_fixture_on_loopback() -> None:
    kafka = compose()["services"]["kafka"]
    assert interpolate(kafka["image"]) == "apache/kafka:4.3.1"
    envs = {k: interpolate(str(v)) for k, v in kafka["environment"].items()}
    fixture = _server_env(9092, 9093)
    same = {"CLUSTER_ID", "KAFKA_PROCESS_ROLES", "KAFKA_LISTENERS", "KAFKA_ADVERTISED_LISTENERS",
            "KAFKA_CONTROLLER_QUORUM_VOTERS", "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
            "KAFKA_LOG_DIRS", "KWORKERS_KAFKA_PORT", "KWORKERS_KAFKA_CONTROLLER_PORT"}
    for key in same:
        assert envs[key] == fixture[key], key
    for key in ("KAFKA_LISTENERS", "KAFKA_ADVERTISED_LISTENERS", "KAFKA_CONTROLLER_QUORUM_VOTERS"):
        hosts = re.findall(r"(?:://|@)([^:,]+):", envs[key])
        assert hosts and set(hosts) == {"127.0.0.1"}, key


def test_schema_registry_is_configured_like_the_test_fixture_on_loopback() -> None:
    registry = compose()["services"]["schema-registry"]
    assert interpolate(registry["image"]) == LOCAL_REGISTRY_IMAGE
    envs = {k: interpolate(str(v)) for k, v in registry["environment"].items()}
    fixture = registry_env(8081, 9001, "/tmp/kworkers-registry/registry")
    for key in ("QUARKUS_HTTP_HOST", "QUARKUS_HTTP_PORT", "QUARKUS_MANAGEMENT_HOST",
                "QUARKUS_MANAGEMENT_PORT", "APICURIO_DATASOURCE_URL"):
        assert envs[key] == fixture[key], key
    assert envs["QUARKUS_HTTP_HOST"] == envs["QUARKUS_MANAGEMENT_HOST"] == "127.0.0.1"


def test_worker_services_use_the_settings_variables_and_a_local_image() -> None:
    services = compose()["services"]
    known = {settings.env_name(n) for n in settings.FIELDS}
    demo = {"KWORKERS_DEMO_RECORDS", "KWORKERS_DEMO_RATE",
            "KWORKERS_METRICS_HOST", "KWORKERS_METRICS_PORT"}
    init = " ".join(services["init"]["command"])
    assert "kworkers topics create" in init and "--partitions 6" in init
    assert "${KWORKERS_DEMO_TIERS:-1s,5s,30s,2m,10m}" in init  # the tiers the worker uses
    assert services["worker"]["environment"]["KWORKERS_TIERS"] == (
        "${KWORKERS_DEMO_TIERS:-1s,5s,30s,2m,10m}")
    for name in ("init", "worker", "producer"):
        svc = services[name]
        if name != "init":
            assert svc["entrypoint"] == ["python", "-m", "kworkers.deploy.example"]
        assert interpolate(svc["image"]) == "kworkers/worker:local"
        assert svc["build"]["dockerfile"] == "deploy/images/worker/Dockerfile"
        assert (ROOT / svc["build"]["dockerfile"]).exists()
        assert re.fullmatch(r"\$\{KWORKERS_WORKER_BASE:-[^}]+\}", svc["build"]["args"]["BASE"])
        if name == "init":
            assert "--bootstrap 127.0.0.1:${KWORKERS_COMPOSE_KAFKA_PORT:-9092}" in init
            continue
        unknown = set(svc["environment"]) - known - demo
        assert not unknown, f"{name}: {unknown} is read by nobody"
        assert svc["environment"][envvars.BOOTSTRAP] == (
            "127.0.0.1:${KWORKERS_COMPOSE_KAFKA_PORT:-9092}")
    assert services["worker"]["environment"]["KWORKERS_METRICS_HOST"] == "127.0.0.1"
    for name in ("worker", "producer"):
        assert services[name]["depends_on"] == {
            "init": {"condition": "service_completed_successfully"}}


def test_worker_stop_grace_covers_its_drain() -> None:
    worker = compose()["services"]["worker"]
    grace = int(worker["stop_grace_period"].rstrip("s"))
    drain = float(worker["environment"]["KWORKERS_DRAIN_TIMEOUT"])
    assert grace >= drain + 10 + 10  # drain + the default revoke timeout + a margin


def test_prometheus_is_optional_and_scrapes_the_worker() -> None:
    services = compose()["services"]
    prom = services["prometheus"]
    assert prom["profiles"] == ["prometheus"]
    assert interpolate(prom["image"]) == "prom/prometheus"
    assert any("127.0.0.1:" in c for c in prom["command"])
    mounts = {m.split(":")[0] for m in prom["volumes"]}
    assert mounts == {"./deploy/prometheus/prometheus.yml", "./deploy/prometheus/alerts.yml"}
    conf = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text("utf-8"))
    (job,) = conf["scrape_configs"]
    port = interpolate(services["worker"]["environment"]["KWORKERS_METRICS_PORT"])
    assert job["static_configs"][0]["targets"] == [f"127.0.0.1:{port}"]
    assert conf["rule_files"] == ["/etc/prometheus/alerts.yml"]
