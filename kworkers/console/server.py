"""Serving the console: bind the socket first, say where, then hand it to uvicorn.

Binding here rather than in uvicorn means a port that is taken (or an address this machine
does not have) is one clear line before anything starts, and ``--port 0`` prints the port
the system chose, which is how tests and scripts find a console they started.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from kworkers.console.app import create_app
from kworkers.console.settings import ConsoleSettings
from kworkers.errors import ConfigError


def bind(host: str, port: int) -> socket.socket:
    name = host.strip("[]")
    family = socket.AF_INET6 if ":" in name else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((name, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def serve(settings: ConsoleSettings, announce: Callable[[str], None]) -> None:
    """Serve until SIGINT/SIGTERM; ``announce`` gets the one line that says where."""
    import uvicorn

    sock = bind(settings.host, settings.port)
    mode = "read-only" if settings.read_only else "redrive enabled"
    guard = "token required" if settings.token else "loopback only"
    announce(f"kworkers console: {url_of(sock)} (Kafka at {settings.client.bootstrap_servers}; "
             f"{mode}; {guard})")
    config = uvicorn.Config(create_app(settings), log_level="warning", access_log=False,
                            lifespan="off", server_header=False, proxy_headers=False)
    uvicorn.Server(config).run(sockets=[sock])
