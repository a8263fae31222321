"""``kworkers deploy render``: the worker's Kubernetes and KEDA manifests, from its own config.

Printed, the files are one multi-document YAML stream (each after a ``---`` line and a
``# <file>`` comment), so ``kworkers deploy render ... | kubectl apply -f -`` applies them all;
``--out DIR`` writes them as files instead.

The config is the one ``kworkers run`` would run: the worker module's, with the ``--config``
file, the ``KWORKERS_*`` environment and the flags applied (``kworkers.settings``), so what is
rendered is what would run. Rendering is ``kworkers.deploy``; no broker is contacted.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import click

from kworkers import settings
from kworkers.cli.options import bootstrap_option, config_option, property_option
from kworkers.errors import ConfigError
from kworkers.kafka.settings import env_var_of


def _check_carried(outside: settings.Layer) -> None:
    """What the operator gave here must reach the pods: a property without a variable of its
    own would be rendered nowhere (the pods read the ConfigMap, not this command line)."""
    lost = sorted(f"{table}: {key}" for table in settings.TABLES
                  for key in outside.get(table, {})
                  if table != "client_config" or env_var_of(key) is None)
    if lost:
        raise ConfigError(f"{', '.join(lost)} cannot travel in the rendered ConfigMap (only "
                          "settings with a KWORKERS_* variable do); set them in the worker "
                          "module's config")


@click.group()
def deploy() -> None:
    """Kubernetes and KEDA manifests for a worker."""


@deploy.command("render")
@click.argument("target", metavar="MODULE:WORKER")
@click.option("--image", required=True, help="The worker's container image.")
@click.option("--app", required=True, help="Name of the Deployment, ScaledObject and ConfigMap.")
@click.option("--partitions", type=click.IntRange(min=1), required=True,
              help="Partitions of the source topics (caps maxReplicaCount).")
@click.option("--namespace", default="default", show_default=True)
@click.option("--max-replicas", type=click.IntRange(min=1), default=None,
              help="At most the partition count (the default); share mode: required.")
@click.option("--prometheus", default=None,
              help="The Prometheus server KEDA queries (http://HOST:PORT): the pool grows on "
                   "drainable lag (share mode: required, for the backlog too).")
@click.option("--scale-on", type=click.Choice(["records", "seconds"]), default="records",
              show_default=True,
              help="With --prometheus: grow on drainable records (--lag-threshold per "
                   "replica) or on drainable time lag (a replica per partition behind "
                   "--time-lag-target).")
@click.option("--lag-threshold", type=int, default=None,
              help="Records of lag per replica (default 100).")
@click.option("--time-lag-target", default=None,
              help="With --scale-on seconds: how far behind a partition may fall before it "
                   "wants a replica of its own (30s, 2m; default 30s).")
@click.option("--sasl-secret", default=None,
              help="Secret holding SASL username/password (OAUTHBEARER: client id/secret), "
                   "used over SASL_SSL.")
@click.option("--tls-secret", default=None,
              help="Secret holding ca.crt (and tls.crt, tls.key with --tls-client-cert), "
                   "mounted as files in the pods.")
@click.option("--tls-client-cert", is_flag=True,
              help="mTLS: the pods present tls.crt/tls.key from --tls-secret.")
@click.option("--allow-plaintext-sasl", is_flag=True,
              help="Accept SASL over SASL_PLAINTEXT (the password in clear on the network).")
@click.option("--brokers", type=click.IntRange(min=1), default=None,
              help="Brokers the workers fetch from, for the pods' memory (the worst case "
                   "counts one fetch ahead per broker); default: the bootstrap list's count, "
                   "at least 3.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write the files under this directory instead of printing them.")
@click.option("--dashboard", is_flag=True,
              help="Also the Grafana dashboard for this worker's group: a ConfigMap for "
                   "Grafana's dashboard sidecar (label grafana_dashboard), and with --out the "
                   "JSON beside it (needs the dashboards extra).")
@click.option("--alerts", is_flag=True,
              help="With --out: also the Prometheus alert rules scoped to this worker's group "
                   "(prometheus/<app>-alerts.yml).")
@config_option
@bootstrap_option
@property_option
def deploy_render(target: str, image: str, app: str, partitions: int, namespace: str,
                  max_replicas: int | None, prometheus: str | None, scale_on: str,
                  lag_threshold: int | None, time_lag_target: str | None,
                  sasl_secret: str | None,
                  tls_secret: str | None, tls_client_cert: bool, allow_plaintext_sasl: bool,
                  brokers: int | None, out_dir: str | None, dashboard: bool, alerts: bool,
                  config_path: str | None, bootstrap: str | None,
                  properties: tuple[str, ...]) -> None:
    """Render the Deployment, ConfigMap, KEDA ScaledObject (and TriggerAuthentication) from
    the worker's own config, so the manifests never drift from the code.

    The cluster's bootstrap address is required (--bootstrap, KWORKERS_BOOTSTRAP_SERVERS or
    the --config file; never the default 127.0.0.1:9092). With --sasl-secret the pods use
    SASL_SSL unless -X security.protocol says otherwise; SASL_PLAINTEXT needs
    --allow-plaintext-sasl."""
    from kworkers.cli.run import configure
    from kworkers.deploy import render
    from kworkers.deploy.autoscale import Autoscale, check_server, parse_duration
    from kworkers.deploy.manifests import DEFAULT_SCALER

    if alerts and out_dir is None:
        raise ConfigError("--alerts writes a Prometheus rules file, not a manifest: pass --out")
    # the trigger settings first: a bad one is refused before the worker module is imported
    scaler = DEFAULT_SCALER
    if lag_threshold is not None:
        if lag_threshold < 1:
            raise ConfigError(f"--lag-threshold: a whole number of records >= 1, got "
                              f"{lag_threshold}")
        scaler = dataclasses.replace(scaler, lag_threshold=lag_threshold)
    lag_target = (parse_duration(time_lag_target) if time_lag_target is not None
                  else None)
    autoscale = None
    if prometheus is not None:
        autoscale = Autoscale(check_server(prometheus), "seconds" if scale_on == "seconds"
                              else "records", scaler.lag_threshold,
                              *(() if lag_target is None else (lag_target,)))
    elif scale_on == "seconds" or lag_target is not None:
        raise ConfigError("--scale-on seconds and --time-lag-target read the workers' "
                          "drainable time lag from Prometheus: pass --prometheus")
    flags = settings.client_flags(bootstrap, properties)
    _check_carried(settings.overrides(flags, os.environ, config_path))
    worker = configure(target, flags, os.environ, config_path)
    files = render(worker.config, image=image, app=app, module=target, partitions=partitions,
                   namespace=namespace, max_replicas=max_replicas, sasl_secret=sasl_secret,
                   prometheus=prometheus, tls_secret=tls_secret, tls_client_cert=tls_client_cert,
                   plaintext_sasl=allow_plaintext_sasl, brokers=brokers, scaler=scaler,
                   autoscale=autoscale)
    files.update(_observability(worker.config.group_id, app, namespace, dashboard,
                                alerts and out_dir is not None, out_dir is not None))
    for name, text in sorted(files.items()):
        if out_dir is None:  # one multi-document stream: `| kubectl apply -f -` takes it
            click.echo(f"---\n# {name}\n{text}", nl=False)
            continue
        path = Path(out_dir) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        click.echo(f"wrote {path}")


def _observability(group: str, app: str, namespace: str, dashboard: bool, alerts: bool,
                   raw: bool) -> dict[str, str]:
    """The dashboard (a ConfigMap Grafana's sidecar loads, and the JSON itself when written to
    files) and the alert rules, both for ``group`` (checked: ``kworkers.promql.quoted``)."""
    from kworkers.deploy.yamltext import dump

    out: dict[str, str] = {}
    if dashboard:
        from kworkers.observability.dashboard import render as render_dashboard

        board = render_dashboard(group)
        out["grafana/dashboard.yaml"] = dump(
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": f"{app}-dashboard", "namespace": namespace,
                          "labels": {"grafana_dashboard": "1",
                                     "app.kubernetes.io/name": app,
                                     "app.kubernetes.io/managed-by": "kworkers"}},
             "data": {f"{app}.json": board}},
            "The kworkers dashboard for this pool's group, for Grafana's dashboard sidecar\n"
            "(it loads ConfigMaps labelled grafana_dashboard). Generated by kworkers deploy\n"
            "render --dashboard (kworkers.observability).")
        if raw:
            out[f"grafana/{app}.json"] = board
    if alerts:
        from kworkers.observability.alerts import render_rules

        out[f"prometheus/{app}-alerts.yml"] = render_rules(group)
    return out
