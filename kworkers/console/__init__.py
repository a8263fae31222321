"""The web console (``kworkers console``): groups and lag, dead letters, redrive.

Modules, pure ones first:

- ``settings``: what a console serves and the exposure rule (a token off loopback).
- ``auth``: the token, the loopback ``Host`` check and the CSRF token.
- ``dlq_filter``: the table's and the redrive's filter (a ``RedriveFilter``).
- ``dlq_pages``: bounded paging through a DLQ; ``record_view``: one record shown every way.
- ``breaker``: the breaker state from the workers' ``/metrics``.
- ``groups``, ``history``, ``redrive``, ``watermarks``: reading the broker for each page,
  through the CLI's own functions; ``workflows``: the workflow engine's tables.
- ``jobs``: redrives running on their threads; ``app``: the ASGI application;
  ``server``: binding and serving.

``app`` and ``server`` need the ``console`` extra (Starlette, Jinja2, uvicorn,
python-multipart); the rest needs nothing beyond kworkers.
"""

from kworkers.console.settings import ConsoleSettings

__all__ = ["ConsoleSettings"]
