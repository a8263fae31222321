"""The progress bar of a long operator command (``kworkers dlq redrive``), with rate and ETA.

Why rate and ETA and not the bar alone: a redrive of a million dead letters runs for minutes,
and an operator deciding whether to wait, or to rerun it later with ``--rate``, needs how fast
it goes and when it ends, not only how far it is. Both are rich's own estimates over the last
30 s (``Task.speed``, ``Task.time_remaining``), so a pause (a broker stall, ``--rate``) shows.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class RateColumn(ProgressColumn):
    """``12,345/s``, the task's recent speed (``-/s`` until rich has two samples)."""

    def __init__(self, unit: str = "") -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        shown = "-" if speed is None else f"{speed:,.0f}"
        return Text(f"{shown}{self.unit}/s", style="progress.data.speed")


def progress_bar(out: Console, what: str, unit: str = "") -> Progress:
    """``<what> <description> ━━━━━ done/total · rate · elapsed · ETA`` (off when ``out`` is
    not a terminal: scripts read the summary line)."""
    return Progress(TextColumn(f"{what} {{task.description}}"), BarColumn(),
                    MofNCompleteColumn(), RateColumn(unit), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=out, transient=True,
                    disable=not out.is_terminal)
