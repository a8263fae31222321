"""The ``kworkers`` command line (``kworkers.cli.main``); one module per command group.

- ``main``: the ``kworkers`` group, one-line errors, the entry point;
- ``options``: ``--bootstrap`` / ``--config`` / ``-X`` (one ``ClientSettings``), output;
- ``run`` (and ``pool`` for ``--processes N``), ``topics``, ``dlq`` (printed by
  ``kworkers.dlq.format``), ``lag`` (read by ``kworkers.lag_reading``), ``deploy``,
  ``console`` (the web console, ``kworkers.console``).
"""

from kworkers.cli.main import cli, main, run_cli

__all__ = ["cli", "main", "run_cli"]
