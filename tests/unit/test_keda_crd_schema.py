"""Every rendered KEDA object passes KEDA's own CRD schema (issue #47 item 5).

The CRDs come from the KEDA module the scaler probe is built from (``ensure_keda_probe``,
``kworkers.testing.keda_probe``): without them these tests skip, and under CI fail. The
renderings cover every variant render has: with and without a Prometheus trigger, records and
seconds, SASL/SCRAM, mutual TLS, OAUTHBEARER, share mode, a pool-wide rate limit, and the files
committed under deploy/keda.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from kworkers.deploy import example_config, keda_problems, keda_schema_problems, manifests
from kworkers.deploy.autoscale import Autoscale
from kworkers.deploy.samples import EXAMPLE_ARGS
from kworkers.testing.keda_probe import crds_dir

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROM = "http://prometheus.monitoring.svc:9090"
OIDC = {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.scope": "kafka",
        "sasl.oauthbearer.token.endpoint.url": "https://idp.example/oauth2/token"}


def _variants() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """name -> (WorkerConfig changes, render arguments)."""
    from kworkers.pace import RateLimit

    return {
        "example": ({}, {}),
        "no-prometheus": ({}, {"prometheus": None}),
        "seconds": ({}, {"autoscale": Autoscale(PROM, "seconds", time_lag_target=45.0)}),
        "plaintext": ({}, {"sasl_secret": None, "tls_secret": None, "prometheus": None}),
        "scram-mtls": ({"client_config": {"sasl.mechanism": "SCRAM-SHA-512"}},
                       {"tls_client_cert": True}),
        "mtls-only": ({"client_config": {"security.protocol": "SSL"}},
                      {"sasl_secret": None, "tls_client_cert": True}),
        "oauth": ({"client_config": OIDC}, {}),
        "share": ({"mode": "share"}, {"max_replicas": 24}),
        "rate-limited": ({"rate_limit": RateLimit(50, scope="pool")},
                         {"prometheus": None, "max_replicas": 2}),
        "min-one": ({}, {"min_replicas": 1}),
    }


def _keda_objects(name: str) -> list[dict[str, Any]]:
    changes, args = _variants()[name]
    cfg = dataclasses.replace(example_config(), **changes)
    objs = manifests(cfg, **{**EXAMPLE_ARGS, **args})
    return [o for o in objs.values() if str(o.get("apiVersion", "")).startswith("keda")]


@pytest.mark.parametrize("name", sorted(_variants()))
def test_rendered_keda_objects_pass_kedas_crd_schema(name: str) -> None:
    crds = crds_dir()
    objs = _keda_objects(name)
    assert any(o["kind"] == "ScaledObject" for o in objs)
    for obj in objs:
        assert keda_schema_problems(obj, crds) == [], obj
        assert keda_problems(obj) == [], obj


def test_committed_keda_files_pass_kedas_crd_schema() -> None:
    crds = crds_dir()
    files = sorted((DEPLOY / "keda").glob("*.yaml"))
    assert len(files) >= 3
    for path in files:
        for obj in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            assert keda_schema_problems(obj, crds) == [], path


@pytest.mark.parametrize(("mutate", "expect"), [
    # canaries: each a mistake the schema catches (and KEDA's API server would refuse)
    (lambda so: so["spec"].__setitem__("pollingInterval", "30"), "pollingInterval"),
    (lambda so: so["spec"].__setitem__("maxReplicaCount", 2.5), "maxReplicaCount"),
    (lambda so: so["spec"]["triggers"][0].__setitem__("metadataa", {}), "metadataa"),
    (lambda so: so["spec"]["triggers"][0]["metadata"].__setitem__("lagThreshold", 5),
     "lagThreshold"),
    (lambda so: so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
     ["scaleDown"].__setitem__("stabilizationWindowSecond", 300), "stabilizationWindowSecond"),
    (lambda so: so["spec"]["scaleTargetRef"].pop("name"), "name"),
    (lambda so: so["spec"].pop("triggers"), "triggers"),
])
def test_the_schema_check_can_fail(mutate: Any, expect: str) -> None:
    crds = crds_dir()
    (so,) = [copy.deepcopy(o) for o in _keda_objects("example") if o["kind"] == "ScaledObject"]
    mutate(so)
    problems = keda_schema_problems(so, crds)
    assert any(expect in p for p in problems), problems


def test_the_schema_check_catches_a_bad_triggerauthentication() -> None:
    crds = crds_dir()
    (ta,) = [copy.deepcopy(o) for o in _keda_objects("example")
             if o["kind"] == "TriggerAuthentication"]
    ta["spec"]["secretTargetRef"][0]["keyy"] = ta["spec"]["secretTargetRef"][0].pop("key")
    problems = keda_schema_problems(ta, crds)
    assert any("keyy" in p for p in problems) and any("'key'" in p for p in problems), problems
