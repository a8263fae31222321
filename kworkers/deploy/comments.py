"""The comments at the top of each rendered manifest: what it does and why, true for the
security and the mode it was rendered for (a comment that says ``sasl: plaintext`` over a
SASL_SSL pool is worse than none)."""

from __future__ import annotations

from collections.abc import Mapping

from kworkers.deploy.autoscale import ACTIVATION_ONLY_LAG_THRESHOLD, SCALE_DOWN_WINDOW_S, Autoscale
from kworkers.deploy.security import DeploySecurity
from kworkers.deploy.yamltext import wrap_words
from kworkers.kafka.settings import CLASSIC_SESSION_TIMEOUT_MS
from kworkers.pace.limit import RateLimit


def wrap(text: str, width: int = 92) -> str:
    return "\n".join(wrap_words(text, width) or [""])


def _keda_auth(sec: DeploySecurity) -> str:
    what = []
    if sec.sasl_secret is not None:
        what.append(f"the SASL credentials (the triggers' metadata says sasl: "
                    f"{sec.keda_sasl()}, KEDA's name for mechanism {sec.mechanism}"
                    f"{', and tls: enable' if sec.tls else ''}) from the Secret "
                    f"{sec.sasl_secret}, keys username and password")
    if sec.tls_secret is not None:
        files = "ca.crt, tls.crt, tls.key" if sec.client_certificate else "ca.crt"
        cert = " and client certificate" if sec.client_certificate else ""
        what.append(f"the CA{cert} from the Secret {sec.tls_secret} ({files})")
    if sec.oauth:
        what.append("the token endpoint (and scope) from the ConfigMap")
    return wrap("KEDA's credentials for the Kafka triggers: " + "; ".join(what) + ", the same "
                "the worker pods use.")


def comments(mode: str, sec: DeploySecurity,
             rate_limit: RateLimit | None = None, memory: str | None = None,
             autoscale: Autoscale | None = None) -> dict[str, str]:
    """File name -> its comment; ``memory``: the worst-case formula with the worker's numbers,
    when the container's memory was rendered from it; ``autoscale``: what the pool grows on
    (None: raw lag)."""
    texts = {**_COMMENTS, **(_SHARE_COMMENTS if mode == "share" else {})}
    if mode != "share" and autoscale is None:
        texts["keda/scaledobject.yaml"] = _RAW_LAG
    out = {name: text.format(security=wrap(sec.describe()), keda=_keda_auth(sec),
                             session_ms=CLASSIC_SESSION_TIMEOUT_MS,
                             session_s=CLASSIC_SESSION_TIMEOUT_MS // 1000,
                             wake=f"{ACTIVATION_ONLY_LAG_THRESHOLD:_}".replace("_", ","),
                             window=SCALE_DOWN_WINDOW_S,
                             drain=_drain(autoscale))
           for name, text in texts.items()}
    if rate_limit is not None:
        out["keda/scaledobject.yaml"] += _rate_limited(rate_limit, autoscale is not None)
    if memory is not None:
        out["k8s/deployment.yaml"] += wrap(
            f"Memory, request and limit alike: the worker's worst case, {memory} (kworkers."
            "memory: max_in_flight_bytes per loop, librdkafka's read-ahead sized with it, the "
            "hand-offs' copies in the producer, the idle process). A request below it lets the "
            "node promise the difference elsewhere and the kernel OOM-kills the pod under "
            "pressure; raise max_in_flight_bytes and this grows with it.") + "\n"
    return out


def _drain(autoscale: Autoscale | None) -> str:
    if autoscale is None:
        return ""
    if autoscale.scale_on == "records":
        return wrap(f"- drain-records-*: grows the pool to ceil(drainable records / "
                    f"{autoscale.lag_threshold}) replicas: sum over partitions (each once: the "
                    "largest any replica shows) of kworkers_drainable_lag, records that more "
                    "replicas could drain.", 90).replace("\n", "\n  ")
    return wrap(f"- drain-seconds-*: grows the pool to one replica per partition whose "
                f"drainable time lag (kworkers_drainable_time_lag_seconds: how long its oldest "
                f"record not completed has waited, where more replicas could drain it) exceeds "
                f"{autoscale.time_lag_target:g} s.", 90).replace("\n", "\n  ")


def _rate_limited(limit: RateLimit, drainable: bool) -> str:
    """Why a rate-limited pool's maxReplicaCount is what it is (``kworkers.pace``)."""
    if limit.scope == "pool" and drainable:
        return wrap(
            f"rate_limit: {limit.per_second:g} handler starts/s for the whole pool, shared "
            "through its store. While records wait for its tokens the workers report no "
            "drainable lag, so the pool does not grow on the lag its own limit causes "
            "(kworkers_rate_limit_waiting above 0 says it is at its limit).") + "\n"
    if limit.scope == "replica":
        return wrap(f"rate_limit: {limit.per_second:g}/s per pod (scope replica): each new pod "
                    "adds its own limit, so the pool's rate is the pods times it; "
                    "maxReplicaCount caps the pool's rate too.") + "\n"
    return wrap(
        f"rate_limit: {limit.per_second:g} handler starts/s for the whole pool, shared through "
        "its store. When records arrive faster, lag grows because of the limit itself and the "
        "Kafka triggers ask for more pods, which only wait for tokens: maxReplicaCount (given "
        "explicitly; render refuses to default it to the partitions) is the pods that reach "
        "the limit. kworkers_rate_limit_waiting above 0 says the pool is at its limit: more "
        "pods would not drain it faster.") + "\n"


_COMMENTS: Mapping[str, str] = {
    "k8s/configmap.yaml": """\
Generated by `kworkers deploy render`; edit the WorkerConfig, not this file.
The worker's settings as KWORKERS_* variables: `kworkers run` applies them over the worker
module's own config (kworkers.settings), the security ones included. No credential is here.
{security}
""",
    "k8s/deployment.yaml": """\
Generated by `kworkers deploy render`; edit the WorkerConfig, not this file.
One Deployment runs both poll loops of the worker: the main group on the source topics and
the `<group>.retry` group on the retry-tier topics (Worker.run always starts both), so the one
ScaledObject in keda/ scales it on both groups' lag.
Stopping: the kubelet sends SIGTERM (no preStop hook needed); the worker stops fetching,
drains in-flight work (drain_timeout), commits and leaves the group. The grace period is
drain_timeout + revoke_timeout + 15 s so that SIGKILL never cuts a drain short.
Failover: a pod that dies without leaving (SIGKILL, OOM, a lost node) keeps its partitions
until the group's session timeout ends. With the classic protocol the client decides:
kworkers sets session.timeout.ms={session_ms} ({session_s} s; librdkafka's default is 45 s),
which its poll loop can afford because heartbeats never wait for a handler. With
group_protocol "consumer" (KIP-848) the broker decides: group.consumer.session.timeout.ms,
45 s by default and at least group.consumer.min.session.timeout.ms (45 s by default); only
the cluster's operator can lower it, not this Deployment. Static membership
(group.instance.id) does not fit a Deployment: its pods' names change on every rollout.
{security}
""",
    "keda/scaledobject.yaml": """\
Generated by `kworkers deploy render`; edit the WorkerConfig, not this file.
KEDA allows one ScaledObject per Deployment, and one Deployment runs both loops (see
k8s/deployment.yaml), so this one ScaledObject carries the triggers of both consumer groups;
the HPA follows whichever trigger asks for the most replicas (docs/AUTOSCALING.md).
{drain}
  Lag held on purpose counts 0 there: a breaker open, a pool-wide rate limit at its bound, a
  schema registry down, a fenced member, retries and scheduled records not yet due.
- wake-*: one Kafka trigger per source topic (main group) and per retry tier topic (retry
  group), lagThreshold {wake} (above any lag):
  each asks for 1 replica at most and never grows the pool. They wake it from zero
  (active on any lag, activationLagThreshold 0: with no worker running nobody exports the
  drainable lag, and KEDA's Prometheus scaler reads 0), and keep one replica while any
  record waits, retries not yet due included; KEDA scales to zero cooldownPeriod after the
  last of them went inactive.
  excludePersistentLag is "false": it leaves a partition out only while its committed offset
  stands still between two polls, and a tier loop commits as earlier records come due, so
  everything waiting behind them would count: it does not keep waiting retries out.
behavior: scale up at once (the Kubernetes defaults, written down); scale down after
{window} s of lower figures, at most half the pods a minute (no flapping on steady load, each
rebalance settles first).
offsetResetPolicy is "earliest" because the worker's consumers start from the earliest offset
when the group has no commit: KEDA then counts the whole partition as lag, as the worker will.
maxReplicaCount is at most the partition count: a consumer beyond it owns no partition.
""",
    "keda/triggerauthentication.yaml": """\
Generated by `kworkers deploy render`; edit the WorkerConfig, not this file.
{keda}
""",
}

#: without a Prometheus server: the main group's raw lag grows the pool
_RAW_LAG = """\
Generated by `kworkers deploy render`; edit the WorkerConfig, not this file.
No Prometheus server was given (--prometheus), so the pool grows on raw lag, as KEDA's Kafka
scaler counts it: lag held on purpose (a breaker open, a pool-wide rate limit at its bound, a
schema registry down) grows it too. Pass --prometheus to grow it on drainable lag only
(docs/AUTOSCALING.md).
- main-*: the main group's lag on each source topic: ceil(lag / lagThreshold) replicas.
- wake-*: the retry group's tier topics, lagThreshold {wake} (above any lag):
  each asks for 1 replica at most: waiting retries keep one pod alive (someone has to run them
  when due) and never grow the pool. excludePersistentLag would not do it: it leaves a
  partition out only while its committed offset stands still between two polls, and a tier
  loop commits as earlier records come due, so everything waiting behind them counts.
offsetResetPolicy is "earliest" because the worker's consumers start from the earliest offset
when the group has no commit: KEDA then counts the whole partition as lag, as the worker will.
maxReplicaCount is at most the partition count: a consumer beyond it owns no partition.
"""

#: share mode's ScaledObject says what differs
_SHARE_COMMENTS: Mapping[str, str] = {
    "keda/scaledobject.yaml": """\
Generated by `kworkers deploy render`; edit the WorkerConfig, not this file.
Share mode (KIP-932): the main group is a share group, which KEDA's Kafka scaler cannot read
(a share group has no committed offsets; KEDA issue 7920), so the main trigger is a
Prometheus query over the workers' own kworkers_share_backlog gauge: each worker exports, per
partition, the log end minus one past the highest offset it acquired; the query takes the
minimum per partition over replicas (the freshest view) and sums the partitions, never a sum
over replicas, which would count one backlog once per replica.
- main-share-*: ceil(backlog / threshold) replicas; not capped by the partition count (share
  groups lend records one by one to any number of members), only by maxReplicaCount and the
  broker's group.share.max.size (200 by default).
- wake-*, drain-*: the retry tiers stay on an ordinary consumer group, scaled as in
  partitioned mode: the tier topics' Kafka triggers only wake the pool, the Prometheus trigger
  grows it on the retry group's drainable lag (due records only).
minReplicaCount is at least 1: at zero replicas nobody exports the backlog and KEDA would
never scale the pool up again.
""",
}
