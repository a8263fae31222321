"""What every ``kworkers`` command shares: how it reaches the cluster, and how it prints.

``client_options`` gives a command ``--bootstrap``, ``--config FILE`` (a client properties
file, as Kafka's ``--command-config``, or a ``kworkers.toml``) and ``-X key=value`` (as kcat),
read over the same ``KWORKERS_*`` environment as ``kworkers run`` (``kworkers.settings``), and
hands the command one ``ClientSettings``. Whatever secret those settings hold is remembered so
that no error line the CLI prints can show it.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click
from rich.console import Console

from kworkers.kafka.settings import DEFAULT_BOOTSTRAP, MASK, ClientSettings

F = Callable[..., Any]

#: Secret values of the settings this process resolved: masked out of every error line.
_secrets: set[str] = set()


def console(stderr: bool = False) -> Console:
    """A console that keeps tables readable when the output is a pipe or a file (not 80 cols)."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS", "160"))
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


LOG_FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"


def log_level_option(fn: F) -> F:
    return click.option("--log-level", default="INFO", show_default=True,
                        type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"],
                                          case_sensitive=False))(fn)


def configure_logging(level: str) -> None:
    """What every long-running command logs: to stderr, each line with its time, process,
    level and logger (``kworkers run``, ``kworkers schedule run``)."""
    logging.basicConfig(level=level.upper(), stream=sys.stderr, format=LOG_FORMAT)


def remember(client: ClientSettings) -> ClientSettings:
    _secrets.update(client.secrets())
    return client


def registry_options(fn: F) -> F:
    """``--schema-registry URL`` and ``-S key=value``: the command receives ``registry``, a
    ``RegistrySettings`` or None (no registry: values are shown as text or hex)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, registry_url: str | None, registry_properties: tuple[str, ...],
                **kwargs: Any) -> Any:
        from kworkers.payloads.settings import registry_settings

        registry = registry_settings(registry_url, registry_properties, os.environ)
        if registry is not None:
            _secrets.update(registry.secrets())
        return fn(*args, registry=registry, **kwargs)

    with_properties = click.option(
        "-S", "registry_properties", multiple=True, metavar="KEY=VALUE",
        help="A schema registry client property, e.g. -S basic.auth.user.info=USER:PASSWORD "
             "(repeatable; env KWORKERS_SCHEMA_REGISTRY_USER_INFO).")(wrapper)
    return click.option(
        "--schema-registry", "registry_url", default=None, metavar="URL",
        help="Decode values through this Confluent-compatible schema registry (env "
             "KWORKERS_SCHEMA_REGISTRY_URL); needs the registry extra.")(with_properties)


def redact(text: str) -> str:
    """``text`` with every secret this process was given masked (longest first)."""
    for secret in sorted(_secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def bootstrap_option(fn: F) -> F:
    return click.option(
        "--bootstrap", "-b", "bootstrap", default=None, metavar="HOST:PORT",
        help=f"Kafka bootstrap servers (env KWORKERS_BOOTSTRAP_SERVERS; default "
             f"{DEFAULT_BOOTSTRAP}).")(fn)


def config_option(fn: F) -> F:
    return click.option(
        "--config", "config_path", type=click.Path(dir_okay=False), default=None,
        envvar="KWORKERS_CONFIG", metavar="FILE",
        help="Client properties (key=value, as Kafka's --command-config), or a kworkers.toml "
             "(env KWORKERS_CONFIG).")(fn)


def property_option(fn: F) -> F:
    return click.option(
        "-X", "properties", multiple=True, metavar="KEY=VALUE",
        help="A librdkafka property, e.g. -X security.protocol=SASL_SSL (repeatable; env "
             "KWORKERS_SASL_USERNAME, KWORKERS_SASL_PASSWORD, KWORKERS_SSL_CA_LOCATION, ...).")(fn)


def resolve_client(bootstrap: str | None, config_path: str | None,
                   properties: Sequence[str]) -> ClientSettings:
    """Flags > ``KWORKERS_*`` environment > ``--config`` file > the default address."""
    from kworkers import settings

    flags = settings.client_flags(bootstrap, properties)
    return remember(settings.client_settings(flags, os.environ, config_path))


def client_options(fn: F) -> F:
    """``--bootstrap``, ``--config``, ``-X``: the command receives ``client: ClientSettings``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, bootstrap: str | None, config_path: str | None,
                properties: tuple[str, ...], **kwargs: Any) -> Any:
        return fn(*args, client=resolve_client(bootstrap, config_path, properties), **kwargs)

    return bootstrap_option(config_option(property_option(wrapper)))
