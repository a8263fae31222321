"""Kubernetes and KEDA manifests for a worker pool, rendered from its ``WorkerConfig``.

Why render instead of templating: the numbers that must agree (the grace period and the drain
deadline, ``maxReplicaCount`` and the partition count, the consumer groups KEDA watches and the
ones the worker joins, the tier topic names) are all derived from one ``WorkerConfig``, so
they cannot drift apart the way hand-edited YAML does.

One Deployment runs both of a worker's poll loops (the main group on the source topics and
``<group>.retry`` on the tier topics: ``Worker.run`` always starts both), so one ScaledObject
scales it on both groups. How it scales is ``kworkers.deploy.autoscale``: with a Prometheus
server (``prometheus``), a Prometheus trigger on the workers' drainable lag grows the pool and
Kafka triggers (one per source topic and per tier topic, a ``lagThreshold`` no lag reaches)
only wake it from zero and keep one replica while anything waits. Without one, the main
group's Kafka triggers scale on raw lag as KEDA counts it (lag held on purpose grows the pool
too; a pool-wide rate limit then needs an explicit ``max_replicas``), and the tier triggers
still only wake: KEDA's ``excludePersistentLag`` does not keep waiting retries out (the tier
loop commits as earlier records come due, so everything waiting behind them counts).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from kworkers.config import WorkerConfig
from kworkers.deploy import env as envvars
from kworkers.deploy.autoscale import (
    ACTIVATION_ONLY_LAG_THRESHOLD,
    Autoscale,
    check_server,
    hpa_behavior,
)
from kworkers.deploy.comments import comments
from kworkers.deploy.security import POD_UID, DeploySecurity, deploy_security
from kworkers.deploy.yamltext import dump
from kworkers.errors import ConfigError
from kworkers.kafka.settings import DEFAULT_BOOTSTRAP, is_secret_key
from kworkers.keda import (
    RENDERED_LAG_THRESHOLD,
    SHARE_GROUP_MAX_SIZE,
    ScalerSettings,
    share_backlog_query,
)
from kworkers.lag import RENDERED_RESET_POLICY
from kworkers.memory import DEFAULT_BROKERS, kubernetes_quantity

KEDA_API = "keda.sh/v1alpha1"
#: seconds SIGTERM handling may need beyond the drain and revoke deadlines: closing the
#: consumer (a last commit, leaving the group) and flushing the hand-off producer
GRACE_MARGIN_S = 15
#: the trigger rendered unless told otherwise (``keda.RENDERED_LAG_THRESHOLD``: the console's
#: "KEDA would scale to" uses the same)
DEFAULT_SCALER = ScalerSettings(lag_threshold=RENDERED_LAG_THRESHOLD,
                                offset_reset_policy=RENDERED_RESET_POLICY)

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*(:[A-Za-z_][A-Za-z0-9_.]*)?")


@dataclass(frozen=True)
class Resources:
    """Container requests and limits (Kubernetes quantity strings).

    Memory, unless given: the worker's worst case (``WorkerConfig.memory_bound``, the formula
    of ``kworkers.memory``: ``max_in_flight_bytes``, librdkafka's read-ahead sized with it, the
    hand-offs' copies, the idle process), as the request and the limit alike. Memory cannot be
    taken back from a process the way CPU is throttled: a request below what the pod may use
    lets the node promise it elsewhere, and the kernel then kills the pod under pressure (the
    OOM-kill and crash loop of issue #45). An application whose own imports or handlers use
    more than ``kworkers.memory.IDLE`` allows sets its own.
    """

    cpu_request: str = "250m"
    memory_request: str | None = None
    cpu_limit: str = "1"
    memory_limit: str | None = None


@dataclass(frozen=True)
class _Names:
    app: str
    namespace: str

    @property
    def configmap(self) -> str:
        return f"{self.app}-config"

    @property
    def auth(self) -> str:
        return f"{self.app}-kafka-auth"

    def selector(self) -> dict[str, str]:
        """The Deployment's selector: immutable once applied, so only the stable labels."""
        return {"app.kubernetes.io/name": self.app, "app.kubernetes.io/component": "worker"}

    def labels(self) -> dict[str, str]:
        return {**self.selector(), "app.kubernetes.io/managed-by": "kworkers"}

    def meta(self, name: str) -> dict[str, Any]:
        return {"name": name, "namespace": self.namespace, "labels": self.labels()}


def grace_period(config: WorkerConfig) -> int:
    """``terminationGracePeriodSeconds``: what a graceful stop waits for (handler calls already
    started, bounded by their deadline or ``drain_timeout``; queued records are given back at
    once), the last commit through a rebalance in progress, and a margin for leaving the group.
    Anything shorter and the kubelet's SIGKILL cuts a drain short: redeliveries, not losses."""
    return math.ceil(config.leave_bound()) + GRACE_MARGIN_S


def _command_target(module: str) -> str:
    if not _MODULE.fullmatch(module):
        raise ConfigError(f"module: expected 'package.module' or 'package.module:worker', got "
                          f"{module!r}")
    return module if ":" in module else f"{module}:worker"


def manifests(
    config: WorkerConfig,
    *,
    image: str,
    app: str,
    module: str,
    partitions: int,
    namespace: str = "default",
    max_replicas: int | None = None,
    min_replicas: int | None = None,
    metrics_port: int = 9100,
    sasl_secret: str | None = None,
    scaler: ScalerSettings | None = None,
    resources: Resources | None = None,
    prometheus: str | None = None,
    tls_secret: str | None = None,
    tls_client_cert: bool = False,
    plaintext_sasl: bool = False,
    allow_loopback: bool = False,
    brokers: int | None = None,
    autoscale: Autoscale | None = None,
) -> dict[str, dict[str, Any]]:
    """The manifests as objects, keyed by the file they are written to (see ``render``)."""
    for what, name in (("app", app), ("namespace", namespace)):
        if len(name) > 50 or not _DNS_LABEL.fullmatch(name):
            raise ConfigError(f"{what}: a DNS-1123 label of at most 50 characters (names get "
                              f"suffixes), got {name!r}")
    for what, secret in (("sasl_secret", sasl_secret), ("tls_secret", tls_secret)):
        if secret is not None and (len(secret) > 253 or not _DNS_LABEL.fullmatch(
                secret.replace(".", "-"))):
            raise ConfigError(f"{what}: not a valid Secret name: {secret!r}")
    _check_bootstrap(config.bootstrap_servers, allow_loopback)
    _check_secrets(config, sasl_secret)
    sec = deploy_security(config, sasl_secret, tls_secret, tls_client_cert, plaintext_sasl)
    if not image or any(c.isspace() for c in image):
        raise ConfigError(f"image: expected an image reference, got {image!r}")
    if not isinstance(partitions, int) or partitions < 1:
        raise ConfigError(f"partitions: must be >= 1, got {partitions!r}")
    scaler = scaler or DEFAULT_SCALER
    if autoscale is None and prometheus is not None:
        autoscale = Autoscale(check_server(prometheus), lag_threshold=scaler.lag_threshold)
    limit = config.rate_limit
    if (limit is not None and limit.scope == "pool" and max_replicas is None
            and autoscale is None):
        raise ConfigError(
            f"max_replicas: the pool is rate-limited ({limit.per_second:g}/s for all replicas): "
            "the lag its own limit causes would scale it to every partition, each new pod only "
            "waiting for tokens; say max_replicas (--max-replicas), the pods that reach the limit "
            "(ceil(per_second x handler seconds / concurrency), one more for failover); or "
            "pass prometheus (--prometheus): the pool then grows on drainable lag only, which "
            "a pool at its limit does not have")
    if config.mode == "share":
        top, low = _share_bounds(max_replicas, min_replicas,
                                 autoscale.prometheus if autoscale else prometheus)
    else:
        top = partitions if max_replicas is None else max_replicas
        low = 0 if min_replicas is None else min_replicas
        if top > partitions:
            raise ConfigError(
                f"max_replicas={top} > {partitions} partitions: a consumer beyond the partition "
                "count owns nothing and sits idle; add partitions instead")
    if top < 1 or not 0 <= low <= top:
        raise ConfigError(f"replica bounds: need 0 <= min_replicas <= max_replicas >= 1, got "
                          f"{low}..{top}")
    if not 1 <= metrics_port <= 65535:
        raise ConfigError(f"metrics_port: 1..65535, got {metrics_port}")
    if scaler.allow_idle_consumers:
        raise ConfigError("scaler: allowIdleConsumers would let KEDA run idle consumers")
    names = _Names(app, namespace)
    files = {
        "k8s/configmap.yaml": _configmap(config, names, sec),
        "k8s/deployment.yaml": _deployment(config, names, image, _command_target(module),
                                           metrics_port, sec,
                                           _resources(config, resources, brokers)),
        "keda/scaledobject.yaml": _scaledobject(config, names, scaler, low, top, sec,
                                                autoscale),
    }
    if sec.keda_auth:
        files["keda/triggerauthentication.yaml"] = _triggerauth(names, sec)
    return files


def render(
    config: WorkerConfig,
    *,
    image: str,
    app: str,
    module: str,
    partitions: int,
    namespace: str = "default",
    max_replicas: int | None = None,
    min_replicas: int | None = None,
    metrics_port: int = 9100,
    sasl_secret: str | None = None,
    scaler: ScalerSettings | None = None,
    resources: Resources | None = None,
    prometheus: str | None = None,
    tls_secret: str | None = None,
    tls_client_cert: bool = False,
    plaintext_sasl: bool = False,
    allow_loopback: bool = False,
    brokers: int | None = None,
    autoscale: Autoscale | None = None,
) -> dict[str, str]:
    """File name (``k8s/...`` or ``keda/...``) -> YAML text, for ``kworkers deploy render``.

    ``image``: the worker image; ``app``: names every object (a DNS label); ``module``:
    ``package.module[:attr]`` holding the ``Worker`` (``:worker`` when no attribute is given);
    ``partitions``: of the source topics; ``maxReplicaCount`` (``max_replicas``, default
    ``partitions``) may not exceed it (``ConfigError``); ``min_replicas`` (default) 0 lets KEDA
    scale to zero; ``sasl_secret``: a Secret with ``username`` and ``password`` keys (for
    OAUTHBEARER the client id and secret), used by the pods and by KEDA, over SASL_SSL unless
    the worker's settings say otherwise (SASL_PLAINTEXT is refused unless ``plaintext_sasl``);
    ``tls_secret``: a Secret with ``ca.crt`` (and with ``tls_client_cert``, ``tls.crt`` and
    ``tls.key`` for mTLS) mounted as files in the pods and read by KEDA
    (``kworkers.deploy.security``); ``scaler``: the Kafka trigger settings
    (``DEFAULT_SCALER``); ``resources``: container requests and limits (memory, unless
    given: the worker's worst case with ``brokers`` brokers to fetch from, by default the
    bootstrap list's count and at least ``kworkers.memory.DEFAULT_BROKERS``); ``prometheus``:
    the Prometheus server KEDA queries, so the pool grows on drainable lag in records
    (``autoscale`` says records or seconds and the targets; ``kworkers.deploy.autoscale``).

    The bootstrap address must be the cluster's: the default ``127.0.0.1:9092`` is refused,
    and so is any loopback address (in a pod it is the pod itself) unless ``allow_loopback``
    (a test that runs the pod's command on this machine).

    Share mode (``config.mode == "share"``): the main trigger is a Prometheus query over the
    workers' backlog gauge at ``prometheus`` (the server address, required); ``max_replicas``
    is required and not capped by the partitions (at most ``group.share.max.size``, 200 by
    default); ``min_replicas`` is at least 1 (default 1: see ``kworkers.keda``).
    """
    objs = manifests(config, image=image, app=app, module=module, partitions=partitions,
                     namespace=namespace, max_replicas=max_replicas, min_replicas=min_replicas,
                     metrics_port=metrics_port, sasl_secret=sasl_secret, scaler=scaler,
                     resources=resources, prometheus=prometheus, tls_secret=tls_secret,
                     tls_client_cert=tls_client_cert, plaintext_sasl=plaintext_sasl,
                     allow_loopback=allow_loopback, brokers=brokers, autoscale=autoscale)
    sec = deploy_security(config, sasl_secret, tls_secret, tls_client_cert, plaintext_sasl)
    memory = None
    if resources is None or resources.memory_limit is None:
        memory = config.memory_bound(_brokers(config, brokers)).describe()
    notes = comments(config.mode, sec, config.rate_limit, memory,
                     autoscale or (Autoscale(prometheus) if prometheus else None))
    return {name: dump(obj, notes[name]) for name, obj in objs.items()}


_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")
_IPV6 = re.compile(r"\[([0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?)\]")


def bootstrap_hosts(bootstrap: str) -> list[tuple[str, int]]:
    """Each ``HOST:PORT`` of a comma-separated bootstrap list (IPv6 as ``[addr]:port``, port
    1-65535, no scheme), as KEDA's Kafka scaler needs it: librdkafka would take ``kafka`` and
    mean ``kafka:9092``, the scaler would not. ``ConfigError`` naming the first bad entry."""
    out: list[tuple[str, int]] = []
    for raw in bootstrap.split(","):
        entry = raw.strip()
        why = _bad_entry(entry)
        if why is not None:
            raise ConfigError(f"bootstrap servers {bootstrap!r}: {entry!r} {why}")
        host, _, port = entry.rpartition(":")
        out.append((host.strip("[]"), int(port)))
    return out


def _bad_entry(entry: str) -> str | None:
    """Why ``entry`` is not ``HOST:PORT``, or None."""
    if not entry:
        return "is empty (a stray comma?)"
    if "://" in entry:
        return "has a scheme: give HOST:PORT (kafka:9092), no scheme"
    host, colon, port = entry.rpartition(":")
    if not colon:
        return "has no port: give HOST:PORT (KEDA's scaler needs the port, usually 9092)"
    if not host:
        return "has no host: give HOST:PORT"
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        return f"has port {port!r}: a port is a number from 1 to 65535"
    if host.startswith("["):
        return None if _IPV6.fullmatch(host) else "is not an IPv6 address as [addr]:port"
    if ":" in host:
        return "looks like an IPv6 address: write it as [addr]:port"
    return None if _HOST.fullmatch(host) else f"has host {host!r}, not a host name"


def _brokers(config: WorkerConfig, brokers: int | None) -> int:
    """Brokers the worker's consumers may fetch from at once (each one fetch ahead): as given,
    else the bootstrap list's count, at least ``DEFAULT_BROKERS`` (a bootstrap list need not
    name every broker)."""
    if brokers is not None:
        if not isinstance(brokers, int) or brokers < 1:
            raise ConfigError(f"brokers: must be >= 1, got {brokers!r}")
        return brokers
    return max(DEFAULT_BROKERS, len([b for b in config.bootstrap_servers.split(",") if b]))


def _resources(config: WorkerConfig, res: Resources | None, brokers: int | None) -> Resources:
    """``res`` with the memory it leaves unset from the worker's worst case."""
    res = res or Resources()
    if res.memory_request is not None and res.memory_limit is not None:
        return res
    need = kubernetes_quantity(config.memory_bound(_brokers(config, brokers)).total)
    return dataclasses.replace(res, memory_request=res.memory_request or need,
                               memory_limit=res.memory_limit or need)


def _check_bootstrap(bootstrap: str, allow_loopback: bool) -> None:
    """A pod must be told where the cluster is: never the default, never itself."""
    if bootstrap == DEFAULT_BOOTSTRAP:
        raise ConfigError(f"bootstrap servers: the worker's config names none (the default "
                          f"{DEFAULT_BOOTSTRAP} would be written into the ConfigMap and the "
                          "KEDA triggers): pass --bootstrap HOST:PORT (or "
                          "KWORKERS_BOOTSTRAP_SERVERS, or bootstrap.servers in --config)")
    hosts = [host.lower() for host, _port in bootstrap_hosts(bootstrap)]
    loopback = [h for h in hosts if h == "localhost" or h.startswith("127.") or h == "::1"]
    if loopback and not allow_loopback:
        raise ConfigError(f"bootstrap servers {bootstrap}: a loopback address in a pod is the "
                          "pod itself; pass the cluster's bootstrap address (--bootstrap)")


# ---------------------------------------------------------------------- objects


def _check_secrets(config: WorkerConfig, sasl_secret: str | None) -> None:
    """A secret in the config would be dropped from the manifests (a ConfigMap holds none):
    refuse, so a pool is never deployed without the credentials it runs with."""
    secrets = sorted(k for k in config.client_config if is_secret_key(k)
                     and (sasl_secret is None or k not in envvars.CREDENTIALS))
    creds = sorted(envvars.CREDENTIALS & set(config.client_config))
    if creds and sasl_secret is None:
        raise ConfigError(f"the worker's client settings hold {creds}: pass sasl_secret "
                          "(--sasl-secret), a Secret with keys username and password; "
                          "credentials never go into a ConfigMap")
    if secrets:
        raise ConfigError(f"the worker's client settings hold secrets {secrets} the manifests "
                          "cannot carry (a ConfigMap holds none); read them in the worker "
                          "module from a mounted Secret")


def _configmap(config: WorkerConfig, names: _Names, sec: DeploySecurity) -> dict[str, Any]:
    data = {**envvars.config_env(config), **sec.configmap_vars()}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": names.meta(names.configmap),
        "data": data,
    }


def _deployment(config: WorkerConfig, names: _Names, image: str, target: str, port: int,
                sec: DeploySecurity, res: Resources) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "worker",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["kworkers"],
        "args": ["run", target, "--metrics-port", str(port)],
        "ports": [{"name": "metrics", "containerPort": port, "protocol": "TCP"}],
        "envFrom": [{"configMapRef": {"name": names.configmap}}],
    }
    if sec.secret_env():
        container["env"] = sec.secret_env()
    mount, volume = sec.volume_mount(), sec.volume()
    if mount is not None:
        container["volumeMounts"] = [mount]
    container |= {
        "resources": {
            "requests": {"cpu": res.cpu_request, "memory": res.memory_request},
            "limits": {"cpu": res.cpu_limit, "memory": res.memory_limit},
        },
        # /healthz answers while the process serves HTTP, draining included, so a liveness
        # failure never cuts a drain short
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "initialDelaySeconds": 10, "periodSeconds": 10, "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
        # /readyz answers 200 once the worker consumes: a rolling update waits for it
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "metrics"},
            "periodSeconds": 5, "timeoutSeconds": 2, "failureThreshold": 3,
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    labels = names.labels()
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": names.meta(names.app),
        "spec": {
            # no `replicas`: KEDA (through its HPA) owns the count, and an apply must not reset it
            "selector": {"matchLabels": names.selector()},
            # keep consuming during a rollout: add the new pod before stopping an old one
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(port),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "terminationGracePeriodSeconds": grace_period(config),
                    "securityContext": {"runAsNonRoot": True, "runAsUser": POD_UID,
                                        "runAsGroup": POD_UID,
                                        # the mounted TLS Secret's files: this group's only
                                        **({"fsGroup": POD_UID} if volume else {})},
                    "containers": [container],
                    **({"volumes": [volume]} if volume else {}),
                },
            },
        },
    }


def _trigger(name: str, config: WorkerConfig, group: str, topic: str,
             settings: ScalerSettings, sec: DeploySecurity, auth: str) -> dict[str, Any]:
    meta = {
        "bootstrapServers": config.bootstrap_servers,
        "consumerGroup": group,
        "topic": topic,
        **settings.trigger_metadata(),
    }
    if sec.tls:
        meta["tls"] = "enable"
    sasl = sec.keda_sasl()
    if sasl is not None:
        meta["sasl"] = sasl
    if not sec.keda_auth:
        return {"type": "kafka", "name": name, "metadata": meta}
    return {"type": "kafka", "name": name, "metadata": meta,
            "authenticationRef": {"name": auth}}


def _trigger_name(*parts: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")


def _share_bounds(max_replicas: int | None, min_replicas: int | None,
                  prometheus: str | None) -> tuple[int, int]:
    """(max, min) replicas of a share-mode pool, or why not."""
    if not prometheus or any(c.isspace() for c in prometheus):
        raise ConfigError("prometheus: share mode scales on a Prometheus query of the workers' "
                          "backlog gauge (KEDA's Kafka scaler cannot read a share group): pass "
                          f"the server address, got {prometheus!r}")
    check_server(prometheus)
    if max_replicas is None:
        raise ConfigError("max_replicas: a share group is not capped by the partitions; say "
                          "how far the pool may grow")
    if max_replicas > SHARE_GROUP_MAX_SIZE:
        raise ConfigError(f"max_replicas={max_replicas} > {SHARE_GROUP_MAX_SIZE}: the broker "
                          "refuses members beyond group.share.max.size (raise it there first)")
    low = 1 if min_replicas is None else min_replicas
    if low < 1:
        raise ConfigError("min_replicas: a share-mode pool scales on a backlog its running "
                          "workers export; at zero replicas nobody exports it and KEDA never "
                          "scales up again: keep at least 1")
    return max_replicas, low


def _share_trigger(config: WorkerConfig, scaler: ScalerSettings,
                   prometheus: str) -> dict[str, Any]:
    return {"type": "prometheus", "name": _trigger_name("main", "share", config.group_id),
            "metadata": {
                "serverAddress": prometheus,
                "query": share_backlog_query(config.group_id),
                "threshold": str(scaler.lag_threshold),
                "activationThreshold": str(scaler.activation_lag_threshold),
            }}


def _scaledobject(config: WorkerConfig, names: _Names, scaler: ScalerSettings,
                  min_replicas: int, max_replicas: int, sec: DeploySecurity,
                  autoscale: Autoscale | None) -> dict[str, Any]:
    # Kafka triggers that only wake the pool: any lag activates, none asks for a 2nd replica
    wake = dataclasses.replace(scaler, lag_threshold=ACTIVATION_ONLY_LAG_THRESHOLD,
                               exclude_persistent_lag=False)
    groups: tuple[str, ...]
    if config.mode == "share":
        assert autoscale is not None  # _share_bounds
        triggers = [_share_trigger(config, scaler, autoscale.prometheus)]
        groups = (config.retry_group_id,)
    elif autoscale is not None:
        triggers = [_trigger(_trigger_name("wake", t), config, config.group_id, t, wake,
                             sec, names.auth) for t in config.topics]
        groups = (config.group_id, config.retry_group_id)
    else:  # raw lag, as KEDA's Kafka scaler counts it
        triggers = [_trigger(_trigger_name("main", t), config, config.group_id, t, scaler,
                             sec, names.auth) for t in config.topics]
        groups = ()
    triggers += [_trigger(_trigger_name("wake", t), config, config.retry_group_id, t, wake,
                          sec, names.auth)
                 for t in config.tier_topics()]
    if autoscale is not None and groups:
        triggers.append(_drain_trigger(config, autoscale, groups))
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                           "name": names.app},
        "pollingInterval": 30,
        "cooldownPeriod": 300,
        "minReplicaCount": min_replicas,
        "maxReplicaCount": max_replicas,
    }
    if autoscale is not None:
        spec["advanced"] = {"horizontalPodAutoscalerConfig": {"behavior": hpa_behavior()}}
    spec["triggers"] = triggers
    return {
        "apiVersion": KEDA_API,
        "kind": "ScaledObject",
        "metadata": names.meta(names.app),
        "spec": spec,
    }


def _drain_trigger(config: WorkerConfig, autoscale: Autoscale,
                   groups: tuple[str, ...]) -> dict[str, Any]:
    """The Prometheus trigger that grows the pool on drainable lag (records or seconds)."""
    return {"type": "prometheus",
            "name": _trigger_name("drain", autoscale.scale_on, config.group_id),
            "metadata": {
                "serverAddress": autoscale.prometheus,
                "query": autoscale.query(groups),
                "threshold": autoscale.threshold,
                "activationThreshold": "0",
            }}


def _triggerauth(names: _Names, sec: DeploySecurity) -> dict[str, Any]:
    return {
        "apiVersion": KEDA_API,
        "kind": "TriggerAuthentication",
        "metadata": names.meta(names.auth),
        "spec": sec.triggerauth_spec(names.configmap),
    }
