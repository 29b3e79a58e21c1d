"""Holding SIGINT and SIGTERM back over a stretch of code that must not be cut at a random point.

Python runs a signal's handler in the main thread at the next check of its evaluation loop, wherever
that falls, and some code there swallows the handler's exception or leaves state no one can clean up:
an at-fork hook (its exception is only printed), `Process.start` between the fork and the new
process's registration, the initialisation of a Cython module (its `Sequence.register(...)` sits
inside a bare `except: pass`, so the CLI's interrupt vanished while the command ran on). Blocking the
signals in one thread does not stop another thread of the process from taking them.

`signals_deferred()`: inside it, SIGINT and SIGTERM are blocked in the calling thread and, when that
is the main thread, the process's handlers are replaced by recorders; on the way out (normally or
not) the mask and the handlers are restored and every recorded signal is raised again, so the
caller's handler runs right there, at a point the caller chose. Handlers installed outside Python
(`signal.getsignal` is None) are left alone.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

__all__ = ["SIGNALS", "signals_deferred"]

SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextmanager
def signals_deferred():
    """SIGINT and SIGTERM blocked in this thread and, on the main thread, recorded instead of handled;
    on the way out the mask and handlers are restored and each recorded signal is raised again (so
    the caller's handler runs there, once the body's state is consistent)."""
    held = []

    def record(signum, frame):
        held.append(signum)

    originals = {}
    try:
        if threading.current_thread() is threading.main_thread():  # (only it may set handlers)
            for sig in SIGNALS:
                if signal.getsignal(sig) is None:
                    continue  # a handler installed outside Python: it could not be put back, so it stays
                originals[sig] = signal.getsignal(sig)
                signal.signal(sig, record)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a pending signal reaches a recorder
    finally:
        _restore(originals, record)
        for sig in dict.fromkeys(held):
            signal.raise_signal(sig)


def _restore(originals: dict, record) -> None:
    """Put back the handlers that `record` replaced. `signal.signal` first runs the handlers of signals
    pending meanwhile: one already restored may raise there (the CLI's, which also sets SIG_IGN). Every
    other handler is still restored (unless that handler replaced our recorder itself), then its
    exception is raised: no recorder stays behind to swallow later signals."""
    error = None
    for sig, handler in originals.items():
        while signal.getsignal(sig) is record:
            try:
                signal.signal(sig, handler)
            except BaseException as exc:  # noqa: BLE001 - raised below, once every handler is back
                error = error or exc
    if error is not None:
        raise error
