"""A ``WorkerConfig`` as ``KWORKERS_*`` environment variables (the ConfigMap), and back.

Why environment variables: in a cluster the settings arrive through a ConfigMap (``envFrom``)
and the SASL credentials through a Secret, so one image runs every environment. The variable
names and their parsing are ``kworkers.settings``'s (what ``kworkers run`` applies over the
worker module's own config), so there is one scheme, not two: ``config_env`` only writes each
setting in a form ``settings.from_env`` reads back, and a test round-trips them.

Not carried: ``consumer_config`` / ``producer_config`` (librdkafka tables; ``settings`` takes
them from the worker module or its TOML file only), and credentials, which come from the Secret
as ``KWORKERS_SASL_USERNAME`` / ``KWORKERS_SASL_PASSWORD`` and are turned into librdkafka's
``sasl.*`` settings by ``sasl_settings``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from kworkers import settings
from kworkers.config import WorkerConfig
from kworkers.errors import ConfigError
from kworkers.retry_tiers.tiers import TierLadder

BOOTSTRAP = settings.env_name("bootstrap_servers")
GROUP = settings.env_name("group_id")
TOPICS = settings.env_name("topics")
SECURITY_PROTOCOL = "KWORKERS_SECURITY_PROTOCOL"
SASL_MECHANISM = "KWORKERS_SASL_MECHANISM"
SASL_USERNAME = "KWORKERS_SASL_USERNAME"
SASL_PASSWORD = "KWORKERS_SASL_PASSWORD"


def _num(x: float) -> str:
    """1.0 -> "1", 0.25 -> "0.25": seconds as a person would write them in a ConfigMap."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _setting(config: WorkerConfig, name: str) -> Any:
    head, dot, field = name.partition(".")
    if not dot:
        return getattr(config, name)
    policy = getattr(config, head)
    if head == "retry":  # zero means "default" in a RetryPolicy; write what it means
        policy = policy.normalized()
    return getattr(policy, field)


def _text(value: Any) -> str | None:
    """The variable's value, or None to leave it out (nothing to say, e.g. an empty list)."""
    if value is None:
        return None
    if isinstance(value, TierLadder):
        return ",".join(_num(d) for d in value.delays)
    if isinstance(value, tuple):
        return ",".join(value) or None
    if isinstance(value, bool):
        raise TypeError("no boolean settings are expected")
    if isinstance(value, float):
        return _num(value)
    return str(value)


def config_env(config: WorkerConfig) -> dict[str, str]:
    """Every setting of ``config`` that a variable can carry (defaults included, so the
    ConfigMap shows each knob an operator may turn), named as ``kworkers.settings`` reads it."""
    env: dict[str, str] = {}
    for name in settings.FIELDS:
        if name in settings.TABLES:
            continue
        value = _setting(config, name)
        if name == "message_timeout" and value is None:
            text: str | None = "off"  # an empty variable would mean "not set"
        else:
            text = _text(value)
        if text is not None:
            env[settings.env_name(name)] = text
    return env


def config_from_env(env: Mapping[str, str] | None = None, base: WorkerConfig | None = None,
                    **overrides: Any) -> WorkerConfig:
    """The ``WorkerConfig`` the ``KWORKERS_*`` variables describe (``os.environ`` by default),
    over ``base`` when given; SASL variables become the client's ``sasl.*`` settings.

    ``overrides`` are ``WorkerConfig`` fields that win over everything. Without a ``base``,
    ``KWORKERS_TOPICS`` and ``KWORKERS_GROUP_ID`` are required (unless overridden).
    """
    env = os.environ if env is None else env
    layer = settings.from_env(env)
    if base is None:
        topics = overrides.get("topics", layer.pop("topics", None))
        group = overrides.get("group_id", layer.pop("group_id", None))
        if not topics:
            raise ConfigError(f"{TOPICS}: no topics (set it, comma-separated)")
        if not group:
            raise ConfigError(f"{GROUP}: no consumer group")
        base = WorkerConfig(topics=topics, group_id=group)
    config = settings.apply(base, layer)
    security = sasl_settings(env)
    if security:
        config = dataclasses.replace(config, client_config={**config.client_config, **security})
    return dataclasses.replace(config, **overrides) if overrides else config


def sasl_settings(env: Mapping[str, str]) -> dict[str, str]:
    """librdkafka security settings from the SASL variables (empty when none are set)."""
    user, password = env.get(SASL_USERNAME, ""), env.get(SASL_PASSWORD, "")
    protocol = env.get(SECURITY_PROTOCOL, "")
    if not (user or password):
        return {"security.protocol": protocol} if protocol else {}
    if not (user and password):
        raise ConfigError(f"{SASL_USERNAME} and {SASL_PASSWORD} go together; only one is set")
    return {
        "security.protocol": protocol or "SASL_PLAINTEXT",
        "sasl.mechanism": env.get(SASL_MECHANISM) or "PLAIN",
        "sasl.username": user,
        "sasl.password": password,
    }
