"""Deploying a worker pool: Kubernetes/KEDA manifests and the environment they configure.

``render(config, image=..., app=..., module=..., partitions=...)`` returns the manifests as
file name -> YAML text (what ``kworkers deploy render`` writes); ``config_from_env()`` is what a
worker module calls to read the ConfigMap those manifests mount. ``example_files()`` renders the
sample ``orders`` pool committed under ``deploy/k8s`` and ``deploy/keda`` (``python -m
kworkers.deploy`` rewrites them).
"""

from kworkers.deploy.env import config_env, config_from_env
from kworkers.deploy.manifests import DEFAULT_SCALER, Resources, grace_period, manifests, render
from kworkers.deploy.samples import EXAMPLE_ARGS, example_config, example_files
from kworkers.deploy.validate import (
    cross_problems,
    keda_problems,
    keda_schema_problems,
    validate_core,
)

__all__ = [
    "DEFAULT_SCALER",
    "EXAMPLE_ARGS",
    "Resources",
    "config_env",
    "config_from_env",
    "cross_problems",
    "example_config",
    "example_files",
    "grace_period",
    "keda_problems",
    "keda_schema_problems",
    "manifests",
    "render",
    "validate_core",
]
