"""``python -m kworkers.cli``: the ``kworkers`` command (how ``--processes N`` starts children)."""

from kworkers.cli.main import main

main()
