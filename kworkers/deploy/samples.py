"""The sample ``orders`` pool whose rendered manifests are committed under ``deploy/``.

They are generated, never edited: a unit test renders them afresh and compares, so the files a
reader copies from always match what ``render`` produces today.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from kworkers.config import WorkerConfig
from kworkers.deploy.manifests import render


def example_config() -> WorkerConfig:
    return WorkerConfig(
        topics=("orders",),
        group_id="orders-workers",
        bootstrap_servers="kafka-bootstrap.kafka.svc:9092",
    )


#: the render arguments of the committed example (6 partitions, SASL over TLS: the SASL
#: credentials and the cluster's CA from Secrets; grown on drainable lag read from Prometheus)
EXAMPLE_ARGS: dict[str, Any] = {
    "image": "kworkers/worker:0.1.0",
    "app": "orders",
    "module": "kworkers.deploy.example:worker",
    "partitions": 6,
    "namespace": "default",
    "sasl_secret": "orders-kafka-sasl",
    "tls_secret": "orders-kafka-ca",
    "prometheus": "http://prometheus-operated.monitoring.svc:9090",
}


def example_files() -> dict[str, str]:
    return render(example_config(), **EXAMPLE_ARGS)


#: the same pool in share mode: what differs is its ScaledObject, committed beside the other
SHARE_EXAMPLE_ARGS: dict[str, Any] = {
    **EXAMPLE_ARGS, "max_replicas": 24,
}
SHARE_EXAMPLE_FILE = "keda/scaledobject-share.yaml"


def share_example_files() -> dict[str, str]:
    share = dataclasses.replace(example_config(), mode="share")
    return {SHARE_EXAMPLE_FILE: render(share, **SHARE_EXAMPLE_ARGS)["keda/scaledobject.yaml"]}


def write_examples(deploy_dir: Path) -> list[Path]:
    """Writes ``example_files()`` and ``share_example_files()`` under ``deploy_dir`` (the
    repository's ``deploy/``)."""
    written = []
    for name, text in {**example_files(), **share_example_files()}.items():
        path = deploy_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
