"""The ``kworkers`` command: run workers, manage their topics, inspect and redrive the DLQ.

    kworkers run MODULE:WORKER [--processes N] [--config FILE] ...
    kworkers topics plan|create --topic T [--tiers 1s,5s,30s,2m,10m] [--partitions N]
    kworkers dlq list|show|redrive --dlq T.dlq ...
    kworkers lag --group G [--topic T ...]
    kworkers produce --topic T [--workflow-id W --activity-id A] VALUE ...
    kworkers deploy render MODULE:WORKER --image I --app A --partitions N
    kworkers console [--host H --port P --read-only --metrics-url URL ...]

Every command reaches the cluster the same way: ``--bootstrap``, ``--config FILE`` (client
properties as Kafka's ``--command-config``, or a ``kworkers.toml``), ``-X key=value`` (as
kcat), over the ``KWORKERS_*`` environment (``KWORKERS_SASL_USERNAME``, ...) that ``kworkers
run`` and the rendered Deployment use.

Why every error is one line: an operator reads these in a terminal or a CI log, often half
awake. A wrong argument, a missing topic, an unknown DLQ, a bad tier label, an unreachable
broker or refused credentials each print ``kworkers: error: <what to fix>`` and exit 2; a
failure while working (a transaction refused, a read that timed out) prints one line and exits
1. No tracebacks: those are for bugs, and ``KWORKERS_DEBUG=1`` shows them. No secret: every
secret of the settings the command resolved is masked out of the line.

The commands are thin: the logic lives in ``kworkers.settings``, ``kworkers.kafka``,
``kworkers.dlq``, ``kworkers.lag`` and ``kworkers.deploy``, where it is tested without a
terminal; each command group is a module of this package.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import click

from kworkers.cli.console import console_command
from kworkers.cli.deploy import deploy
from kworkers.cli.dlq import dlq
from kworkers.cli.lag import lag
from kworkers.cli.options import redact
from kworkers.cli.produce import produce
from kworkers.cli.run import run
from kworkers.cli.schedule import schedule
from kworkers.cli.topics import topics
from kworkers.errors import ConfigError, KworkersError
from kworkers.kafka.errors import client_errors
from kworkers.workflow.cli import workflow_cli


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kworkers")
    except PackageNotFoundError:  # run from a clone that was never installed
        return "unknown (not installed: pip install -e .)"


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(_version(), "--version", "-V", prog_name="kworkers",
                      message="%(prog)s %(version)s")
def cli() -> None:
    """kworkers: Kafka consumer worker pools that never lose work nor apply an effect twice."""


for command in (run, topics, dlq, lag, produce, deploy, workflow_cli, console_command,
                schedule):
    cli.add_command(command)


# --- entry point -------------------------------------------------------------------------------


def _fail(message: str, code: int) -> int:
    line = redact(" ".join(str(message).split()))  # one line, whatever the message
    click.echo(f"kworkers: error: {line}", err=True)
    return code


def run_cli(argv: Sequence[str] | None = None) -> int:
    """The CLI as a function returning its exit code (``main`` exits with it)."""
    debug = bool(os.environ.get("KWORKERS_DEBUG"))
    try:
        with client_errors():  # a client exception no command turned into one of ours
            rv = cli.main(args=list(argv) if argv is not None else None, prog_name="kworkers",
                          standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        # `kworkers` or `kworkers dlq` alone asks what there is: the help, as --help prints it
        click.echo(exc.ctx.get_help() if exc.ctx is not None else cli.get_help(
            click.Context(cli, info_name="kworkers")))
        return 0
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "kworkers"
        return _fail(f"{exc.format_message()} (see '{where} --help')", 2)
    except click.Abort:
        return _fail("aborted", 130)
    except click.ClickException as exc:
        return _fail(exc.format_message(), exc.exit_code)
    except ConfigError as exc:
        if debug:
            raise
        return _fail(str(exc), 2)
    except (KworkersError, TimeoutError) as exc:  # a ClientError reads "KafkaException: ..."
        if debug:
            raise
        return _fail(str(exc), 1)
    except KeyboardInterrupt:
        return 130
    return rv if isinstance(rv, int) else 0


def main() -> None:
    """Console script entry point (``kworkers``)."""
    sys.exit(run_cli())
