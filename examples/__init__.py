"""Runnable examples of kworkers (each has a ``python -m examples.<name>`` entry point)."""
