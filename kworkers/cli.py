"""The ``kworkers`` command: run workers, manage their topics, inspect and redrive the DLQ.

    kworkers run MODULE:WORKER [--processes N] [--config kworkers.toml] ...
    kworkers topics plan|create --topic T [--tiers 1s,5s,30s,2m,10m] [--partitions N]
    kworkers dlq list|show|redrive --dlq T.dlq ...
    kworkers lag --group G [--topic T ...]
    kworkers demo flaky

Why every error is one line: an operator reads these in a terminal or a CI log, often half
awake. A wrong argument, a missing topic, an unknown DLQ, a bad tier label or an unreachable
broker each print ``kworkers: error: <what to fix>`` and exit 2; a failure while working (a
transaction refused, a read that timed out) prints one line and exits 1. No tracebacks: those
are for bugs, and ``KWORKERS_DEBUG=1`` shows them.

The commands are thin: the logic lives in ``kworkers.settings``, ``kworkers.cli_topics``,
``kworkers.dlq.reader``/``redrive``, ``kworkers.lag``/``cli_lag`` and ``kworkers.demo``, where it
is tested without a terminal.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
from confluent_kafka import KafkaException
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kworkers.errors import ConfigError, KworkersError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_TIERS = "1s,5s,30s,2m,10m"
FC = TypeVar("FC", bound=Callable[..., Any])


def console(stderr: bool = False) -> Console:
    """A console that keeps tables readable when the output is a pipe or a file (not 80 cols)."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS", "160"))
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


def _bootstrap_option(default: str | None = DEFAULT_BOOTSTRAP) -> Callable[[FC], FC]:
    return click.option(
        "--bootstrap", "-b", "bootstrap", envvar="KWORKERS_BOOTSTRAP_SERVERS", default=default,
        show_default=default is not None, metavar="HOST:PORT",
        help="Kafka bootstrap servers (env KWORKERS_BOOTSTRAP_SERVERS).")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def cli() -> None:
    """kworkers: Kafka consumer worker pools that never lose work nor apply an effect twice."""


# --- run ---------------------------------------------------------------------------------------


@cli.command()
@click.argument("target", metavar="MODULE:WORKER")
@click.option("--processes", "-p", type=click.IntRange(min=1), default=1, show_default=True,
              help="Worker processes; each is a full Worker (a member of the group).")
@click.option("--concurrency", "-c", type=click.IntRange(min=1), default=None,
              help="Handler executions at once per process (env KWORKERS_CONCURRENCY).")
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535), default=None,
              help="Serve /metrics, /healthz, /readyz; process i uses PORT+i.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              envvar="KWORKERS_CONFIG", help="A kworkers.toml settings file.")
@_bootstrap_option(default=None)
@click.option("--group", "group_id", default=None, help="Consumer group (env KWORKERS_GROUP_ID).")
@click.option("--topic", "topics_", multiple=True, help="Source topic; repeat for several.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def run(target: str, processes: int, concurrency: int | None, metrics_port: int | None,
        config_path: str | None, bootstrap: str | None, group_id: str | None,
        topics_: tuple[str, ...], log_level: str) -> int:
    """Run the Worker MODULE:WORKER (an instance, or a zero-argument factory returning one).

    Settings: flags > KWORKERS_* environment > --config TOML > the Worker's own config.
    SIGTERM or Ctrl-C drains in-flight work, commits and leaves the group; a second one
    exits at once.
    """
    from kworkers import cli_run

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    flags: dict[str, object] = {"concurrency": concurrency, "bootstrap_servers": bootstrap,
                                "group_id": group_id, "topics": topics_ or None}
    worker = cli_run.prepare(target, flags, os.environ, config_path)
    if processes == 1:
        return cli_run.run_one(worker, metrics_port)
    child: list[str] = [target, "--log-level", log_level]
    if config_path is not None:
        child += ["--config", config_path]
    for opt, value in (("--concurrency", concurrency), ("--bootstrap", bootstrap),
                       ("--group", group_id)):
        if value is not None:
            child += [opt, str(value)]
    for t in topics_:
        child += ["--topic", t]
    return cli_run.run_pool(child, processes, metrics_port)


# --- topics ------------------------------------------------------------------------------------


@cli.group()
def topics() -> None:
    """Create (or plan) the retry tier and DLQ topics of source topics."""


def _topics_options(fn: Any) -> Any:
    fn = click.option("--replication-factor", type=int, default=-1, show_default=True,
                      help="Replicas per new topic (-1: the broker's default).")(fn)
    fn = click.option("--partitions", type=click.IntRange(min=1), default=None,
                      help="Create missing source topics with N partitions (tiers and the "
                           "DLQ always get the source's count).")(fn)
    fn = click.option("--tiers", default=DEFAULT_TIERS, show_default=True,
                      help="Retry tier delays, shortest first (500ms, 1s, 2m, 1h).")(fn)
    fn = click.option("--topic", "-t", "names", multiple=True, required=True,
                      help="Source topic; repeat for several.")(fn)
    return _bootstrap_option()(fn)


def _plan(bootstrap: str, names: Sequence[str], tiers: str, partitions: int | None) -> Any:
    from kworkers.cli_topics import plan_topics
    from kworkers.kafka.clients import list_topics
    from kworkers.settings import parse_tiers

    ladder = parse_tiers(tiers, "--tiers")
    return plan_topics(list_topics(bootstrap), names, ladder, partitions, bootstrap)


def _plan_table(plan: Sequence[Any], title: str) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    for col in ("topic", "role", "partitions", "action", "note"):
        t.add_column(col, no_wrap=col != "note")
    for p in plan:
        t.add_row(p.name, p.role, str(p.partitions), p.action, p.note)
    return t


@topics.command("plan")
@_topics_options
def topics_plan(bootstrap: str, names: tuple[str, ...], tiers: str, partitions: int | None,
                replication_factor: int) -> int:
    """Print the topics `topics create` would create; changes nothing."""
    plan = _plan(bootstrap, names, tiers, partitions)
    out = console()
    out.print(_plan_table(plan, f"topics plan on {bootstrap}"))
    todo = sum(p.action == "create" for p in plan)
    out.print(f"plan: create={todo} exists={len(plan) - todo} (nothing was changed)")
    return 0


@topics.command("create")
@_topics_options
def topics_create(bootstrap: str, names: tuple[str, ...], tiers: str, partitions: int | None,
                  replication_factor: int) -> int:
    """Create missing source (with --partitions), retry tier and DLQ topics."""
    from kworkers.admin import admin_client, create_topics
    from kworkers.cli_topics import specs

    plan = _plan(bootstrap, names, tiers, partitions)
    made = set(create_topics(admin_client(bootstrap), specs(plan, replication_factor)))
    out = console()
    for p in plan:
        what = "created" if p.name in made else "exists " if p.action == "exists" else "raced  "
        note = f"  ({p.note})" if p.note else ""
        out.print(f"{what} {p.name} ({p.partitions} partitions, {p.role}){note}")
    out.print(f"created={len(made)} exists={len(plan) - len(made)}")
    return 0


# --- dlq ---------------------------------------------------------------------------------------


@cli.group()
def dlq() -> None:
    """Inspect dead letters and redrive them, exactly once."""


def _dlq_option(fn: Any) -> Any:
    fn = click.option("--dlq", "dlq_topic", required=True, metavar="TOPIC.dlq",
                      help="The DLQ topic (the source topic's name + .dlq).")(fn)
    return _bootstrap_option()(fn)


@dlq.command("list")
@_dlq_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line, for scripts.")
def dlq_list(bootstrap: str, dlq_topic: str, as_json: bool) -> int:
    """List the dead letters of a DLQ: origin, key, attempts, error, last failure, age."""
    from kworkers.cli_dlq import as_json as to_json
    from kworkers.cli_dlq import list_table
    from kworkers.dlq.reader import read_dlq

    contents = read_dlq(bootstrap, dlq_topic)
    now = time.time()
    if as_json:
        for d in contents.dead_letters:
            click.echo(json.dumps(to_json(d, now)))
        return 0
    out = console()
    out.print(list_table(contents.dead_letters, now, f"{dlq_topic} on {bootstrap}"))
    out.print(f"{len(contents.dead_letters)} dead letters")
    for msg, why in contents.unreadable:
        out.print(f"not a kworkers dead letter: {msg.partition}@{msg.offset} ({why}); "
                  f"see `kworkers dlq show`", markup=False)
    return 0


@dlq.command("show")
@_dlq_option
@click.option("--partition", "-p", type=click.IntRange(min=0), required=True)
@click.option("--offset", "-o", type=click.IntRange(min=0), required=True)
def dlq_show(bootstrap: str, dlq_topic: str, partition: int, offset: int) -> int:
    """Show one DLQ record in full: failure, headers, key and value.

    The value is decoded as a kworkers task envelope when it is one, else shown as text or
    hex.
    """
    from kworkers.cli_dlq import show_lines
    from kworkers.dlq.record import DeadLetter
    from kworkers.kafka.clients import require_topic
    from kworkers.kafka.reader import read_record
    from kworkers.retry_tiers.headers import HeaderError

    require_topic(bootstrap, dlq_topic, hint="is the DLQ name <topic>.dlq?")
    msg = read_record(bootstrap, dlq_topic, partition, offset)
    dead: DeadLetter | None = None
    problem = None
    try:
        dead = DeadLetter.from_message(msg)
    except HeaderError as exc:
        problem = str(exc)
    out = console()
    for line in show_lines(msg, dead, problem, time.time()):
        out.print(line, markup=False)
    return 0


def _when(value: str | None, name: str) -> float | None:
    if value is None:
        return None
    try:
        t = dt.datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"expected an ISO-8601 time such as 2025-01-31T14:00:00Z, "
                                 f"got {value!r}", param_hint=name) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)  # a time without a zone is UTC, like the DLQ headers
    return t.timestamp()


@dlq.command("redrive")
@_dlq_option
@click.option("--to", "target", default=None, metavar="TOPIC",
              help="Replay to this topic (default: each dead letter's original topic).")
@click.option("--error-type", default=None, help="Only dead letters with this error type.")
@click.option("--key", default=None, help="Only dead letters with this key (UTF-8).")
@click.option("--since", default=None, metavar="ISO", help="Dead-lettered at or after.")
@click.option("--until", default=None, metavar="ISO", help="Dead-lettered before.")
@click.option("--min-offset", type=click.IntRange(min=0), default=None,
              help="Lowest DLQ offset (inclusive).")
@click.option("--max-offset", type=click.IntRange(min=0), default=None,
              help="Highest DLQ offset (inclusive).")
@click.option("--dry-run", is_flag=True, help="Show what would be replayed; produce nothing.")
@click.option("--rate", default=None, metavar="R/s", help="At most R replays per second.")
@click.option("--crash-after", type=click.IntRange(min=1), default=None, hidden=True,
              envvar="KWORKERS_REDRIVE_CRASH_AFTER")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, hidden=True)
def dlq_redrive(bootstrap: str, dlq_topic: str, target: str | None, error_type: str | None,
                key: str | None, since: str | None, until: str | None, min_offset: int | None,
                max_offset: int | None, dry_run: bool, rate: str | None,
                crash_after: int | None, batch_size: int | None) -> int:
    """Replay dead letters (attempt 1 again), each exactly once even across crashes.

    Replayed dead letters are recorded in the compacted topic <dlq>.redriven, in the same
    Kafka transaction as the replay, so running a redrive twice, or again after a crash,
    never replays a dead letter twice. Ends with `redriven=N skipped_already=M selected=S`.
    """
    from kworkers.dlq.redrive import BATCH_SIZE
    from kworkers.dlq.redrive import redrive as do_redrive
    from kworkers.dlq.redrive_plan import RedriveFilter
    from kworkers.settings import parse_rate

    flt = RedriveFilter(
        error_type=error_type, key=None if key is None else key.encode("utf-8"),
        since=_when(since, "--since"), until=_when(until, "--until"),
        min_offset=min_offset, max_offset=max_offset)
    per_second = None if rate is None else parse_rate(rate)
    out = console()
    with Progress(TextColumn("redrive {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=out, transient=True,
                  disable=not out.is_terminal) as bar:
        task = bar.add_task(dlq_topic, total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        summary = do_redrive(bootstrap, dlq_topic, target, flt, dry_run, per_second, progress,
                             batch_size=batch_size or BATCH_SIZE, crash_after=crash_after)
    if summary.targets:
        verb = "would replay" if dry_run else "replayed"
        for topic, n in sorted(summary.targets.items()):
            out.print(f"{verb} {n} to {topic}", markup=False)
    if summary.unreadable:
        out.print(f"left {summary.unreadable} records that are not kworkers dead letters")
    click.echo(summary.line())
    return 0


# --- lag ---------------------------------------------------------------------------------------


@cli.command()
@_bootstrap_option()
@click.option("--group", "-g", required=True, help="The workers' consumer group.")
@click.option("--topic", "-t", "names", multiple=True,
              help="Source topic (default: the topics the group committed offsets for).")
@click.option("--offset-reset-policy", type=click.Choice(["latest", "earliest"]),
              default="latest", show_default=True,
              help="KEDA's offsetResetPolicy: the lag of a partition with no commit.")
@click.option("--scale-to-zero-on-invalid-offset", is_flag=True,
              help="KEDA's scaleToZeroOnInvalidOffset: no commit counts as lag 0.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
@click.option("--waiting-scan-limit", type=click.IntRange(min=1), default=None, hidden=True)
def lag(bootstrap: str, group: str, names: tuple[str, ...], offset_reset_policy: str,
        scale_to_zero_on_invalid_offset: bool, as_json: bool,
        waiting_scan_limit: int | None) -> int:
    """Per-partition lag as KEDA's Kafka scaler computes it, with the retry tiers apart.

    The group's lag is what KEDA scales on. The retry tier group <group>.retry is shown
    separately, its lag split into records still waiting for their due time and records
    due now (read from the committed offset, at most 10,000 per partition).
    """
    from kworkers.cli_lag import read_lag
    from kworkers.lag import WAITING_SCAN_LIMIT, GroupLag, ResetPolicy

    policy: ResetPolicy = "earliest" if offset_reset_policy == "earliest" else "latest"
    main, retry = read_lag(bootstrap, group, names, policy, scale_to_zero_on_invalid_offset,
                           waiting_scan_limit or WAITING_SCAN_LIMIT)

    def rows(g: GroupLag) -> list[dict[str, Any]]:
        return [{"topic": p.topic, "partition": p.partition, "committed": p.committed,
                 "latest": p.latest, "lag": p.lag, "waiting": p.waiting, "due": p.due,
                 "truncated": p.truncated} for p in g.partitions]

    if as_json:
        click.echo(json.dumps({
            "group": main.group, "lag": main.total, "partitions": rows(main),
            "retry_group": retry.group, "retry_lag": retry.total,
            "retry_waiting": retry.waiting, "retry_truncated": retry.truncated,
            "retry_partitions": rows(retry)}, indent=2))
        return 0
    out = console()
    t = Table(title=f"group {main.group} (what KEDA scales on)", title_justify="left",
              header_style="bold")
    for col in ("topic", "partition", "committed", "latest", "lag"):
        t.add_column(col, justify="left" if col == "topic" else "right")
    for p in main.partitions:
        t.add_row(p.topic, str(p.partition), "-" if p.committed is None else str(p.committed),
                  str(p.latest), str(p.lag))
    out.print(t)
    out.print(f"lag group={main.group} total={main.total}")
    if retry.partitions:
        r = Table(title=f"retry tier group {retry.group} (not KEDA's lag)",
                  title_justify="left", header_style="bold")
        for col in ("topic", "partition", "committed", "latest", "lag", "waiting", "due"):
            r.add_column(col, justify="left" if col == "topic" else "right")
        for p in retry.partitions:
            waiting = f"≥{p.waiting}" if p.truncated else str(p.waiting)
            r.add_row(p.topic, str(p.partition),
                      "-" if p.committed is None else str(p.committed), str(p.latest),
                      str(p.lag), waiting, str(p.due))
        out.print(r)
        more = " (truncated: at least)" if retry.truncated else ""
        out.print(f"retry group={retry.group} lag={retry.total} waiting={retry.waiting}"
                  f"{more} due={retry.total - retry.waiting}")
    else:
        out.print(f"retry group={retry.group}: no retry tier topics found")
    return 0


# --- demo --------------------------------------------------------------------------------------


@cli.group()
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
              help="At most the partition count (the default).")
@click.option("--sasl-secret", default=None, help="Secret holding SASL username/password.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write the files under this directory instead of printing them.")
def deploy_render(target: str, image: str, app: str, partitions: int, namespace: str,
                  max_replicas: int | None, sasl_secret: str | None,
                  out_dir: str | None) -> None:
    """Render the Deployment, ConfigMap, KEDA ScaledObject (and TriggerAuthentication) from
    the worker's own config, so the manifests never drift from the code."""
    from pathlib import Path

    from kworkers.cli_run import load_target
    from kworkers.deploy import render

    worker = load_target(target)
    files = render(worker.config, image=image, app=app, module=target, partitions=partitions,
                   namespace=namespace, max_replicas=max_replicas, sasl_secret=sasl_secret)
    for name, text in sorted(files.items()):
        if out_dir is None:
            click.echo(f"# --- {name}\n{text}")
            continue
        path = Path(out_dir) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        click.echo(f"wrote {path}")


@cli.group()
def demo() -> None:
    """Demonstrations on a real broker."""


@demo.command("flaky")
@click.option("--activities", "-n", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--fail-rate", type=click.FloatRange(0.0, 0.95), default=0.5, show_default=True,
              help="Chance that an attempt fails (retryable).")
@click.option("--kills", "-k", type=click.IntRange(min=0), default=3, show_default=True,
              help="SIGKILLs of a random worker at random moments.")
@click.option("--processes", "-p", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--bootstrap", "-b", default=None, metavar="HOST:PORT",
              help="Use this broker (default: start one, and remove it at the end).")
@click.option("--timeout", type=click.FloatRange(min=10), default=300.0, show_default=True,
              help="Give up (exit 1) after this many seconds.")
@click.option("--seed", type=int, default=None, help="Seed for the kill schedule.")
def demo_flaky(activities: int, fail_rate: float, kills: int, processes: int,
               bootstrap: str | None, timeout: float, seed: int | None) -> int:
    """A flaky worker pool under SIGKILL: every activity applied exactly once.

    Produces N activities, runs worker processes that fail at --fail-rate (retry tiers,
    then the DLQ), SIGKILLs workers, redrives the DLQ once the failures stop, and prints a
    report it verified against the effects ledger. Exit 0 only when nothing was lost or
    applied twice.
    """
    from kworkers.demo import FlakyOptions, run_flaky

    opts = FlakyOptions(activities=activities, fail_rate=fail_rate, kills=kills,
                        processes=processes, bootstrap=bootstrap, timeout=timeout, seed=seed)
    return run_flaky(opts, console())


# --- entry point -------------------------------------------------------------------------------


def _fail(message: str, code: int) -> int:
    line = " ".join(str(message).split())  # one line, whatever the message
    click.echo(f"kworkers: error: {line}", err=True)
    return code


def run_cli(argv: Sequence[str] | None = None) -> int:
    """The CLI as a function returning its exit code (``main`` exits with it)."""
    debug = bool(os.environ.get("KWORKERS_DEBUG"))
    try:
        rv = cli.main(args=list(argv) if argv is not None else None, prog_name="kworkers",
                      standalone_mode=False)
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
    except (KworkersError, KafkaException, TimeoutError) as exc:
        if debug:
            raise
        return _fail(f"{type(exc).__name__}: {exc}" if isinstance(exc, KafkaException)
                     else str(exc), 1)
    except KeyboardInterrupt:
        return 130
    return rv if isinstance(rv, int) else 0


def main() -> None:
    """Console script entry point (``kworkers``)."""
    sys.exit(run_cli())


if __name__ == "__main__":
    main()
