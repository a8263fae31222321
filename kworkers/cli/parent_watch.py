"""A pool's child stops when its parent is gone: ``kworkers run --processes N``.

Why: the parent puts each child in a session of its own (``kworkers.cli.pool``: a terminal's
Ctrl-C must reach the pool once), so nothing ends the children when the parent dies without
forwarding a signal (SIGKILL, the OOM killer, a crash). They went on as members of the group,
unsupervised: a restarted pool then ran beside them, and a test that SIGKILLed a pool left two
workers per CI run polling a broker that was gone. A child given ``--parent-pid`` watches its
parent and, once it is gone, stops as a forwarded SIGTERM would stop it: it finishes what it
started, commits, and leaves the group.

How it tells: the parent's pid is handed down on the command line, and the child compares it
with its own parent's pid each second; an orphan is re-parented (to init or a subreaper), so
the two differ from then on. Polling, not Linux's ``PR_SET_PDEATHSIG``: the same on every
platform, and a pure rule to test.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

log = logging.getLogger("kworkers.cli")

#: the hidden ``kworkers run`` option a pool's child is told its parent's pid by
PARENT_OPTION = "--parent-pid"
#: how often a child looks for its parent
CHECK_S = 1.0


def orphaned(parent: int, getppid: Callable[[], int] = os.getppid) -> bool:
    """The process that started this one (``parent``) is no longer its parent."""
    return getppid() != parent


def stop_self() -> None:
    """What a forwarded SIGTERM does: the worker's own handler drains and leaves."""
    os.kill(os.getpid(), signal.SIGTERM)


def watch(parent: int, stopped: threading.Event, *, every: float = CHECK_S,
          getppid: Callable[[], int] = os.getppid,
          on_orphan: Callable[[], None] = stop_self) -> None:
    """Until ``stopped``: once the parent is gone, ``on_orphan`` (once) and return."""
    while not stopped.wait(every):
        if orphaned(parent, getppid):
            log.warning("the pool's parent process (pid %d) is gone: stopping this worker "
                        "process as a forwarded SIGTERM would", parent)
            on_orphan()
            return


def start(parent: int) -> threading.Event:
    """The watch on a daemon thread; set the returned event to end it."""
    stopped = threading.Event()
    threading.Thread(target=watch, args=(parent, stopped), name="kworkers-parent-watch",
                     daemon=True).start()
    return stopped
