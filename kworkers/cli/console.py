"""``kworkers console``: the web console for operators (``kworkers.console``).

Reaches the cluster like every command (``--bootstrap``, ``--config``, ``-X``, the
``KWORKERS_*`` environment). Serves on 127.0.0.1 unless told otherwise; any other address
needs a token (``KWORKERS_CONSOLE_TOKEN`` or ``--token-file``; never a flag, which ``ps``
would show). The web stack is the optional extra ``kworkers[console]``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from kworkers.cli.options import client_options, registry_options
from kworkers.console.settings import (
    DEFAULT_HOST,
    DEFAULT_PAGE_SIZE,
    DEFAULT_PORT,
    DEFAULT_SCAN_BOUND,
    TOKEN_ENV,
    ConsoleSettings,
    parse_tokens,
)
from kworkers.errors import ConfigError
from kworkers.kafka.settings import ClientSettings
from kworkers.keda import RENDERED_LAG_THRESHOLD
from kworkers.payloads.settings import RegistrySettings


def _token(token_file: str | None) -> tuple[str | None, dict[str, str]]:
    """(an unnamed token, named tokens) from --token-file (``parse_tokens``: one bare token,
    or ``NAME:TOKEN`` lines, one per operator) or KWORKERS_CONSOLE_TOKEN."""
    if token_file is not None:
        try:
            text = Path(token_file).read_text("utf-8")
        except OSError as exc:
            raise ConfigError(f"--token-file {token_file}: {exc.strerror or exc}") from None
        return parse_tokens(text, f"--token-file {token_file}")
    return os.environ.get(TOKEN_ENV, "").strip() or None, {}


def _schema(path: str | None) -> object | None:
    if path is None:
        return None
    from fastavro import parse_schema

    try:
        return parse_schema(json.loads(Path(path).read_text("utf-8")))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--avro-schema {path}: {exc}") from None
    except Exception as exc:  # fastavro's schema errors have no common base
        raise ConfigError(f"--avro-schema {path}: not an Avro schema: {exc}") from None


@click.command("console")
@client_options
@registry_options
@click.option("--host", default=DEFAULT_HOST, show_default=True,
              help="Address to listen on; anything but loopback needs a token.")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="Port (0: any free port; the line printed at start names it).")
@click.option("--read-only", is_flag=True, help="Show everything, redrive nothing.")
@click.option("--token-file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help=f"File holding the access token (or env {TOKEN_ENV}), or NAME:TOKEN "
                   "lines, one per operator (the redrive audit names them); at least 16 "
                   "chars each.")
@click.option("--metrics-url", "metrics_urls", multiple=True, metavar="URL",
              help="A worker's /metrics endpoint, for the breaker state (repeatable).")
@click.option("--group", "groups", multiple=True, metavar="GROUP",
              help="Show only this worker group (repeatable; default: every group).")
@click.option("--avro-schema", type=click.Path(dir_okay=False, exists=True), default=None,
              metavar="FILE.avsc", help="Decode dead-letter values with this Avro schema.")
@click.option("--scan-bound", type=click.IntRange(min=1), default=DEFAULT_SCAN_BOUND,
              show_default=True, help="Records one dead-letter page reads at most.")
@click.option("--page-size", type=click.IntRange(min=1), default=DEFAULT_PAGE_SIZE,
              show_default=True, help="Dead letters per page.")
@click.option("--lag-threshold", type=click.IntRange(min=1), default=RENDERED_LAG_THRESHOLD,
              show_default=True, help="KEDA trigger's lagThreshold, for the replica count "
              "shown (default: what `kworkers deploy render` writes).")
@click.option("--min-replicas", type=click.IntRange(min=0), default=0, show_default=True,
              help="KEDA's minReplicaCount.")
@click.option("--max-replicas", type=click.IntRange(min=1), default=None,
              help="KEDA's maxReplicaCount (default: the partition count).")
@click.option("--workflow-store", default=None, envvar="KWORKERS_STORE_URL", metavar="URL",
              help="The durable workflows' store (sqlite:/postgresql:; env KWORKERS_STORE_URL), "
                   "for the Workflows pages.")
@click.option("--workflow-tables", default="kworkers_wf", show_default=True, metavar="PREFIX",
              help="The workflow engine's table prefix (Engine(tables=...)).")
@click.option("--connect-timeout", type=click.FloatRange(min=0.1), default=10.0,
              show_default=True, metavar="SECONDS",
              help="How long a page waits for the broker before saying it is unreachable.")
def console_command(client: ClientSettings, registry: RegistrySettings | None, host: str,
                    port: int, read_only: bool,
                    token_file: str | None, metrics_urls: tuple[str, ...],
                    groups: tuple[str, ...], avro_schema: str | None, scan_bound: int,
                    page_size: int, lag_threshold: int, min_replicas: int,
                    max_replicas: int | None, workflow_store: str | None,
                    workflow_tables: str, connect_timeout: float) -> int:
    """Serve the web console: groups and lag, dead letters, redrive (Ctrl-C stops it)."""
    token, tokens = _token(token_file)
    settings = ConsoleSettings(
        client, host=host, port=port, read_only=read_only, token=token, tokens=tokens,
        metrics_urls=metrics_urls, groups=groups, avro_schema=_schema(avro_schema),
        registry=registry,
        scan_bound=scan_bound, page_size=page_size, lag_threshold=lag_threshold,
        min_replicas=min_replicas, max_replicas=max_replicas, connect_timeout=connect_timeout,
        workflow_store=workflow_store, workflow_tables=workflow_tables)
    try:
        from kworkers.console.server import serve
    except ImportError as exc:
        raise ConfigError(f"kworkers console needs its extra: pip install 'kworkers[console]' "
                          f"({exc.name} is missing)") from None
    serve(settings, lambda line: click.echo(line))
    return 0
