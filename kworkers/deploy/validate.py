"""Checks for rendered manifests before anyone applies them.

Core kinds (ConfigMap, Deployment) are validated against the Kubernetes OpenAPI schema with
``kubernetes-validate`` (a test dependency, imported only when asked). KEDA's kinds are custom
resources that package does not know, so ``keda_problems`` checks their structure itself: the
API version, the fields KEDA requires, trigger metadata keys spelled the way KEDA's Kafka
scaler reads them (a misspelt key is silently ignored by KEDA and its default used instead,
which is exactly the failure a check must catch) and every metadata value a string (KEDA's
CRD types trigger metadata as ``map[string]string``: an unquoted ``true`` is rejected).

``keda_schema_problems`` checks the same objects against KEDA's own CRDs (their
``openAPIV3Schema``, from the KEDA module the tests build their scaler probe from) with
``jsonschema``, strict as ``kubectl apply``'s default field validation is: a field the schema
does not declare is an error, not silently pruned. ``keda_problems`` stays for what a schema
cannot say (metadata keys KEDA's scaler reads: the CRD types metadata as any string map).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

KEDA_API = "keda.sh/v1alpha1"

#: every metadata key KEDA 2.x's Kafka scaler reads
KAFKA_METADATA_KEYS = frozenset({
    "bootstrapServers", "bootstrapServersFromEnv", "consumerGroup", "consumerGroupFromEnv",
    "topic", "topicFromEnv", "partitionLimitation", "lagThreshold", "activationLagThreshold",
    "offsetResetPolicy", "allowIdleConsumers", "excludePersistentLag",
    "scaleToZeroOnInvalidOffset", "limitToPartitionsWithLag",
    "ensureEvenDistributionOfPartitions", "version", "tls", "unsafeSsl", "sasl",
    "saslTokenProvider", "awsRegion",
})
KAFKA_REQUIRED = ("bootstrapServers", "consumerGroup")
KAFKA_AUTH_PARAMETERS = frozenset({
    "sasl", "username", "password", "tls", "ca", "cert", "key", "keyPassword",
    "saslTokenProvider", "scopes", "oauthTokenEndpointUri", "oauthExtensions", "keytab",
    "realm", "kerberosConfig", "kerberosServiceName", "kerberosDisableFAST",
})
_BOOLS = ("allowIdleConsumers", "excludePersistentLag", "scaleToZeroOnInvalidOffset",
          "limitToPartitionsWithLag", "ensureEvenDistributionOfPartitions", "unsafeSsl")
_ENUMS = {
    "offsetResetPolicy": ("latest", "earliest"),
    "sasl": ("none", "plaintext", "scram_sha256", "scram_sha512", "oauthbearer", "gssapi"),
    "tls": ("enable", "disable"),
}
_SCALEDOBJECT_SPEC = frozenset({
    "scaleTargetRef", "pollingInterval", "initialCooldownPeriod", "cooldownPeriod",
    "idleReplicaCount", "minReplicaCount", "maxReplicaCount", "fallback", "advanced",
    "triggers",
})
_TRIGGER_FIELDS = frozenset({"type", "name", "metadata", "authenticationRef", "metricType",
                             "useCachedMetrics"})
_TRIGGERAUTH_SPEC = frozenset({
    "secretTargetRef", "env", "configMapTargetRef", "hashiCorpVault", "azureKeyVault",
    "awsSecretManager", "gcpSecretManager", "podIdentity", "boundServiceAccountToken",
})
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_INT = re.compile(r"-?[0-9]+")


def _metadata(obj: Mapping[str, Any], where: str, out: list[str]) -> None:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        out.append(f"{where}: metadata.name is required")
        return
    if len(meta["name"]) > 253 or not _NAME.fullmatch(meta["name"]):
        out.append(f"{where}: metadata.name {meta['name']!r} is not a DNS-1123 subdomain")


def _int_field(spec: Mapping[str, Any], key: str, where: str, out: list[str],
               minimum: int = 0) -> None:
    if key in spec and (not isinstance(spec[key], int) or isinstance(spec[key], bool)
                        or spec[key] < minimum):
        out.append(f"{where}: spec.{key} must be an integer >= {minimum}, got {spec[key]!r}")


def _kafka_metadata(meta: Any, where: str, out: list[str]) -> None:
    if not isinstance(meta, Mapping):
        out.append(f"{where}: metadata must be a mapping")
        return
    for key, value in meta.items():
        if key not in KAFKA_METADATA_KEYS:
            out.append(f"{where}: unknown kafka metadata key {key!r}")
        if not isinstance(value, str):
            out.append(f"{where}: metadata.{key} must be a string, got "
                       f"{type(value).__name__} {value!r}")
    for key in KAFKA_REQUIRED:
        if not (meta.get(key) or meta.get(f"{key}FromEnv")):
            out.append(f"{where}: metadata.{key} is required")
    for key in ("lagThreshold", "activationLagThreshold"):
        v = meta.get(key)
        if isinstance(v, str) and not _INT.fullmatch(v):
            out.append(f"{where}: metadata.{key} must be a whole number, got {v!r}")
    if isinstance(meta.get("lagThreshold"), str) and _INT.fullmatch(meta["lagThreshold"]) \
            and int(meta["lagThreshold"]) <= 0:
        out.append(f"{where}: metadata.lagThreshold must be > 0")
    for key in _BOOLS:
        v = meta.get(key)
        if isinstance(v, str) and v not in ("true", "false"):
            out.append(f"{where}: metadata.{key} must be \"true\" or \"false\", got {v!r}")
    for key, allowed in _ENUMS.items():
        v = meta.get(key)
        if isinstance(v, str) and v not in allowed:
            out.append(f"{where}: metadata.{key} must be one of {allowed}, got {v!r}")


def _scaledobject(obj: Mapping[str, Any], out: list[str]) -> None:
    where = f"ScaledObject {obj.get('metadata', {}).get('name')!r}"
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        out.append(f"{where}: spec is required")
        return
    for key in spec:
        if key not in _SCALEDOBJECT_SPEC:
            out.append(f"{where}: unknown field spec.{key}")
    ref = spec.get("scaleTargetRef")
    if not isinstance(ref, Mapping) or not isinstance(ref.get("name"), str) or not ref["name"]:
        out.append(f"{where}: spec.scaleTargetRef.name is required")
    for key in ("pollingInterval", "cooldownPeriod", "initialCooldownPeriod",
                "minReplicaCount", "idleReplicaCount"):
        _int_field(spec, key, where, out)
    _int_field(spec, "maxReplicaCount", where, out, minimum=1)
    lo, hi = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        out.append(f"{where}: minReplicaCount {lo} > maxReplicaCount {hi}")
    triggers = spec.get("triggers")
    if not isinstance(triggers, list) or not triggers:
        out.append(f"{where}: spec.triggers must be a non-empty list")
        return
    names = [t.get("name") for t in triggers if isinstance(t, Mapping) and t.get("name")]
    if len(names) != len(set(names)):
        out.append(f"{where}: trigger names must be unique")
    for i, trig in enumerate(triggers):
        tw = f"{where} trigger {i}"
        if not isinstance(trig, Mapping) or not isinstance(trig.get("type"), str):
            out.append(f"{tw}: type is required")
            continue
        for key in trig:
            if key not in _TRIGGER_FIELDS:
                out.append(f"{tw}: unknown field {key!r}")
        if "authenticationRef" in trig:
            auth = trig["authenticationRef"]
            if not isinstance(auth, Mapping) or not isinstance(auth.get("name"), str) \
                    or not auth["name"]:
                out.append(f"{tw}: authenticationRef.name is required")
        if trig["type"] == "kafka":
            _kafka_metadata(trig.get("metadata"), tw, out)


def _triggerauth(obj: Mapping[str, Any], out: list[str]) -> None:
    where = f"TriggerAuthentication {obj.get('metadata', {}).get('name')!r}"
    spec = obj.get("spec")
    if not isinstance(spec, Mapping) or not spec:
        out.append(f"{where}: spec is required")
        return
    for key in spec:
        if key not in _TRIGGERAUTH_SPEC:
            out.append(f"{where}: unknown field spec.{key}")
    for field in ("secretTargetRef", "configMapTargetRef"):
        _target_refs(spec.get(field, []), f"{where} {field}", out)


def _target_refs(refs: Any, where: str, out: list[str]) -> None:
    if not isinstance(refs, list):
        out.append(f"{where}: must be a list")
        return
    for i, ref in enumerate(refs):
        rw = f"{where} {i}"
        if not isinstance(ref, Mapping):
            out.append(f"{rw}: must be a mapping")
            continue
        for key in ("parameter", "name", "key"):
            if not isinstance(ref.get(key), str) or not ref[key]:
                out.append(f"{rw}: {key} is required (a string)")
        if isinstance(ref.get("parameter"), str) and ref["parameter"] not in KAFKA_AUTH_PARAMETERS:
            out.append(f"{rw}: {ref['parameter']!r} is not a Kafka scaler auth parameter")


def keda_problems(obj: Mapping[str, Any]) -> list[str]:
    """What is wrong with a ScaledObject or TriggerAuthentication (empty: nothing found)."""
    out: list[str] = []
    kind = obj.get("kind")
    if obj.get("apiVersion") != KEDA_API:
        out.append(f"{kind}: apiVersion must be {KEDA_API}, got {obj.get('apiVersion')!r}")
    _metadata(obj, str(kind), out)
    if kind == "ScaledObject":
        _scaledobject(obj, out)
    elif kind == "TriggerAuthentication":
        _triggerauth(obj, out)
    else:
        out.append(f"unexpected KEDA kind {kind!r}")
    return out


def cross_problems(objs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """References between rendered objects that must resolve: the ScaledObject's target, its
    triggers' TriggerAuthentication, the ConfigMap keys that one reads, and the Deployment's
    ConfigMap."""
    by_kind: dict[str, set[str]] = {}
    for obj in objs.values():
        by_kind.setdefault(str(obj.get("kind")), set()).add(str(obj["metadata"]["name"]))
    out: list[str] = []
    for obj in objs.values():
        if obj.get("kind") == "ScaledObject":
            target = obj["spec"]["scaleTargetRef"]["name"]
            if target not in by_kind.get("Deployment", set()):
                out.append(f"ScaledObject targets Deployment {target!r}, which is not rendered")
            for trig in obj["spec"]["triggers"]:
                ref = trig.get("authenticationRef", {}).get("name")
                if ref and ref not in by_kind.get("TriggerAuthentication", set()):
                    out.append(f"trigger {trig.get('name')!r} names TriggerAuthentication "
                               f"{ref!r}, which is not rendered")
        if obj.get("kind") == "TriggerAuthentication":
            data = {str(o["metadata"]["name"]): o.get("data", {}) for o in objs.values()
                    if o.get("kind") == "ConfigMap"}
            for ref in obj["spec"].get("configMapTargetRef", []):
                if ref.get("key") not in data.get(ref.get("name"), {}):
                    out.append(f"TriggerAuthentication reads {ref.get('key')!r} of ConfigMap "
                               f"{ref.get('name')!r}, which the rendered ConfigMap lacks")
        if obj.get("kind") == "Deployment":
            for c in obj["spec"]["template"]["spec"]["containers"]:
                for src in c.get("envFrom", []):
                    name = src.get("configMapRef", {}).get("name")
                    if name and name not in by_kind.get("ConfigMap", set()):
                        out.append(f"Deployment reads ConfigMap {name!r}, which is not rendered")
    return out


def validate_core(obj: Mapping[str, Any], version: str = "1.30") -> None:
    """Validates a core-kind object against Kubernetes ``version``'s schema (strict: unknown
    fields fail); raises ``kubernetes_validate.ValidationError``. Needs kubernetes-validate."""
    import kubernetes_validate

    kubernetes_validate.validate(dict(obj), version, strict=True)


def _strict(schema: Any) -> Any:
    """An OpenAPI v3 structural schema with undeclared fields refused (Kubernetes prunes them,
    or with kubectl's default strict field validation refuses them; a typo must fail here)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@cache
def _crd_schema(path: Path) -> Any:
    import yaml

    crd = yaml.safe_load(path.read_text(encoding="utf-8"))
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return _strict(version["schema"]["openAPIV3Schema"])


def keda_schema_problems(obj: Mapping[str, Any], crd_dir: Path) -> list[str]:
    """``obj`` (a ScaledObject or TriggerAuthentication) checked against KEDA's CRD in
    ``crd_dir`` (``keda.sh_scaledobjects.yaml``, ``keda.sh_triggerauthentications.yaml``):
    one line per violation. Needs ``jsonschema`` and PyYAML (test dependencies)."""
    import jsonschema

    files = {"ScaledObject": "keda.sh_scaledobjects.yaml",
             "TriggerAuthentication": "keda.sh_triggerauthentications.yaml"}
    kind = str(obj.get("kind"))
    if kind not in files:
        return [f"no KEDA CRD for kind {kind!r}"]
    validator = jsonschema.Draft7Validator(_crd_schema(crd_dir / files[kind]))
    return [f"{kind} {'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
            for e in sorted(validator.iter_errors(dict(obj)), key=lambda e: list(
                map(str, e.absolute_path)))]
