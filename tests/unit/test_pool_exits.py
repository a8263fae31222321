"""How a ``kworkers run --processes`` child ended, in the parent's one line (issue #43, item 3):
a native abort (librdkafka's failed assertion after a broker pause) used to show as
``exited with -6``, and nothing else. The broker-level run is
``tests/faults/test_native_abort.py``."""

from __future__ import annotations

import signal

from kworkers.cli.pool import counted, exit_text


def test_a_signal_is_named_with_what_it_usually_means() -> None:
    assert exit_text(-signal.SIGABRT) == (
        "was killed by SIGABRT (signal 6) (a crash in native code: its Python stack, from "
        "faulthandler, is in its output)")
    assert exit_text(-signal.SIGSEGV).startswith("was killed by SIGSEGV (signal 11) (a crash")
    assert exit_text(-signal.SIGKILL) == (
        "was killed by SIGKILL (signal 9) (kill -9, or the kernel's OOM killer)")
    assert exit_text(-signal.SIGTERM) == "was killed by SIGTERM (signal 15)"


def test_an_exit_status_is_said_as_it_is() -> None:
    assert exit_text(1) == "exited with 1" and exit_text(143) == "exited with 143"
    assert exit_text(-200) == "was killed by signal 200"


def test_a_child_ended_by_the_signal_the_pool_sent_it_stopped_cleanly() -> None:
    """A child still starting (no handler yet) when the pool forwards SIGTERM dies of it: a
    stop, not a failure. Any other signal, or one the pool never sent, stays a failure."""
    term = int(signal.SIGTERM)
    assert counted(-term, {term}) == 0
    assert counted(-int(signal.SIGINT), {int(signal.SIGINT)}) == 0
    assert counted(-term, set()) == -term  # nobody here sent it: someone killed the child
    assert counted(-int(signal.SIGKILL), {term}) == -int(signal.SIGKILL)
    assert counted(-int(signal.SIGABRT), {term}) == -int(signal.SIGABRT)
    assert counted(1, {term}) == 1 and counted(0, {term}) == 0
