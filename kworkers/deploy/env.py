"""A ``WorkerConfig`` as ``KWORKERS_*`` environment variables (the ConfigMap), and back.

Why environment variables: in a cluster the settings arrive through a ConfigMap (``envFrom``)
and the SASL credentials through a Secret, so one image runs every environment. There is one
scheme, ``kworkers.settings``'s, read by ``kworkers run`` and by ``config_from_env`` alike:
``config_env`` only writes each setting in a form ``settings.from_env`` reads back (a test
round-trips them), and the client properties that have a variable of their own
(``kworkers.kafka.settings.ENV_PROPERTIES``: ``security.protocol``, ``sasl.mechanism``,
``ssl.*``) travel the same way.

Not carried: the librdkafka tables' other properties (they stay in the worker module's code),
and credentials, which come from the Secret as ``KWORKERS_SASL_USERNAME`` /
``KWORKERS_SASL_PASSWORD`` (OAUTHBEARER: ``KWORKERS_SASL_OAUTHBEARER_CLIENT_ID`` /
``..._CLIENT_SECRET``): a ConfigMap never holds a secret (``kworkers.deploy.security``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from kworkers import settings
from kworkers.config import WorkerConfig
from kworkers.errors import ConfigError
from kworkers.kafka.settings import env_var_of, is_secret_key
from kworkers.memory import parse_bytes, show_bytes
from kworkers.retry_tiers.tiers import TierLadder

BOOTSTRAP = settings.env_name("bootstrap_servers")
GROUP = settings.env_name("group_id")
TOPICS = settings.env_name("topics")


def _var(prop: str) -> str:
    var = env_var_of(prop)
    assert var is not None, prop
    return var


SECURITY_PROTOCOL = _var("security.protocol")
SASL_MECHANISM = _var("sasl.mechanism")
SASL_USERNAME = _var("sasl.username")
SASL_PASSWORD = _var("sasl.password")
OAUTH_CLIENT_ID = _var("sasl.oauthbearer.client.id")
OAUTH_CLIENT_SECRET = _var("sasl.oauthbearer.client.secret")
OAUTH_TOKEN_ENDPOINT = _var("sasl.oauthbearer.token.endpoint.url")
OAUTH_SCOPE = _var("sasl.oauthbearer.scope")
SSL_CA_LOCATION = _var("ssl.ca.location")
SSL_CERTIFICATE_LOCATION = _var("ssl.certificate.location")
SSL_KEY_LOCATION = _var("ssl.key.location")
#: What the SASL Secret carries: never written into a ConfigMap.
CREDENTIALS = frozenset({"sasl.username", "sasl.password", "sasl.oauthbearer.client.id",
                         "sasl.oauthbearer.client.secret"})
#: The files a TLS Secret mounted in the pod provides.
TLS_FILES = frozenset({"ssl.ca.location", "ssl.certificate.location", "ssl.key.location"})


def _num(x: float) -> str:
    """1.0 -> "1", 0.25 -> "0.25": seconds as a person would write them in a ConfigMap."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _setting(config: WorkerConfig, name: str) -> Any:
    head, dot, field = name.partition(".")
    if not dot:
        return getattr(config, name)
    policy = getattr(config, head)
    if policy is None:  # an optional policy switched off (the breaker): nothing to write
        return None
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
        return "true" if value else "false"
    if isinstance(value, float):
        return _num(value)
    return str(value)


def carried_client_properties(config: WorkerConfig) -> dict[str, str]:
    """The worker's shared client properties a variable carries, credentials and secrets
    left out (those come from the Secret)."""
    return {_var(k): _text(v) or "" for k, v in config.client_config.items()
            if env_var_of(k) is not None and k not in CREDENTIALS and not is_secret_key(k)}


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
        elif settings.FIELDS[name] is parse_bytes:
            text = show_bytes(value)  # 64MiB, not 67108864
        else:
            text = _text(value)
        if text is not None:
            env[settings.env_name(name)] = text
    env.update(carried_client_properties(config))
    return env


def config_from_env(env: Mapping[str, str] | None = None, base: WorkerConfig | None = None,
                    **defaults: Any) -> WorkerConfig:
    """The ``WorkerConfig`` the ``KWORKERS_*`` variables describe (``os.environ`` by default),
    over ``base`` when given: exactly what ``kworkers run`` applies (``settings.from_env``),
    the SASL and TLS variables included.

    One precedence everywhere (flags > environment > file > code): ``defaults`` are
    ``WorkerConfig`` fields the code sets, and a variable that names the same field wins over
    them, as it wins over the worker's own config under ``kworkers run``. (Until issue #26 these
    keyword arguments won over the environment; a caller that relied on that passes the value
    after the call: ``dataclasses.replace(config_from_env(), field=value)``.) Without a
    ``base``, topics and group come from ``KWORKERS_TOPICS`` / ``KWORKERS_GROUP_ID`` or the
    ``defaults``, and one of the two is required.
    """
    env = os.environ if env is None else env
    layer = settings.from_env(env)
    if base is None:
        code_topics, code_group = defaults.pop("topics", None), defaults.pop("group_id", None)
        topics = layer.pop("topics", None) or code_topics
        group = layer.pop("group_id", None) or code_group
        if not topics:
            raise ConfigError(f"{TOPICS}: no topics (set it, comma-separated)")
        if not group:
            raise ConfigError(f"{GROUP}: no consumer group")
        base = WorkerConfig(topics=topics, group_id=group, **defaults)
    elif defaults:
        base = dataclasses.replace(base, **defaults)
    return settings.apply(base, layer)
