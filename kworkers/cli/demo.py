"""``kworkers demo flaky``: on its way out of the shipped package (to ``examples/`` and
``scripts/demo``); kept here only until that move lands, so ``scripts/demo`` keeps working."""

from __future__ import annotations

import click

from kworkers.cli.options import console


@click.group()
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
