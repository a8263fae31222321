"""What a console serves and how it is exposed: one frozen value, and the exposure rule.

Why the rule lives here and not in the server: a console can replay dead letters into
production topics, so who can reach it matters as much as what it shows. Bound to a loopback
address it is reachable only from this machine (and ``Host`` is checked, so a web page cannot
reach it through DNS rebinding); bound to anything else it needs a token. That is decided
before a socket is opened, from the address alone, and tested without a server.

Pure: nothing here imports the web stack or a client library.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from kworkers.errors import ConfigError
from kworkers.kafka.settings import MASK, ClientSettings

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
#: Records one dead-letter page reads from the broker at most, across its partitions.
DEFAULT_SCAN_BOUND = 2_000
DEFAULT_PAGE_SIZE = 50
#: A token shorter than this is refused: it guards replays into production topics.
MIN_TOKEN_LENGTH = 16
TOKEN_ENV = "KWORKERS_CONSOLE_TOKEN"


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` keeps the console on this machine.

    ``localhost`` and loopback addresses are; the wildcard addresses (``0.0.0.0``, ``::``)
    and every other name or address are not (a name could resolve anywhere).
    """
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str | None) -> None:
    """Refuse a console reachable from other machines without a token, or a weak token."""
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"console token: at least {MIN_TOKEN_LENGTH} characters, got "
                          f"{len(token)}")
    if token is None and not is_loopback(host):
        raise ConfigError(f"binding the console to {host} makes it reachable from other "
                          f"machines: set a token ({TOKEN_ENV} or --token-file), or bind to "
                          "127.0.0.1")


@dataclass(frozen=True, repr=False)
class ConsoleSettings:
    """Everything ``kworkers console`` was told; the token never appears in ``repr``.

    ``metrics_urls``: worker ``/metrics`` endpoints the Groups page reads the breaker state
    from. ``groups``: show only these worker groups (default: every group). ``avro_schema``:
    the parsed writer schema dead-letter values are decoded with, when one is configured.
    KEDA's trigger: ``lag_threshold``, ``min_replicas``, ``max_replicas`` (None: the
    partition count, the most replicas that can have work). ``workflow_store``: where the
    Workflows pages read the engine's tables (None: the pages say how to configure it).
    """

    client: ClientSettings
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    read_only: bool = False
    token: str | None = None
    metrics_urls: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    avro_schema: object | None = None
    scan_bound: int = DEFAULT_SCAN_BOUND
    page_size: int = DEFAULT_PAGE_SIZE
    lag_threshold: int = 10
    min_replicas: int = 0
    max_replicas: int | None = None
    connect_timeout: float = 10.0
    #: the durable workflows' store URL (may hold a password: never shown) and table prefix
    workflow_store: str | None = None
    workflow_tables: str = "kworkers_wf"

    def __post_init__(self) -> None:
        check_exposure(self.host, self.token)
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port: 0..65535, got {self.port}")
        if self.page_size < 1 or self.scan_bound < self.page_size:
            raise ConfigError(f"scan bound ({self.scan_bound}) must be >= page size "
                              f"({self.page_size}) >= 1")
        if self.lag_threshold < 1 or self.min_replicas < 0 or (
                self.max_replicas is not None and self.max_replicas < max(1, self.min_replicas)):
            raise ConfigError("KEDA settings: need lag threshold >= 1 and 0 <= min <= max, "
                              "max >= 1")
        for url in self.metrics_urls:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"metrics URL {url!r}: expected http(s)://host:port/metrics")

    @property
    def loopback_only(self) -> bool:
        return is_loopback(self.host)

    def __repr__(self) -> str:
        token = None if self.token is None else MASK
        return (f"ConsoleSettings({self.client!r}, host={self.host!r}, port={self.port}, "
                f"read_only={self.read_only}, token={token!r})")
