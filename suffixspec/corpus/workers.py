"""A few forked worker processes that run one function call at a time each, and can be stopped at any
moment without hanging.

Why not `multiprocessing.Pool`: its workers share one task queue guarded by a lock, and an idle
worker waits on that queue holding the lock; a worker killed there (SIGTERM to the process group, as a
terminal or a supervisor sends it) leaves the lock held, and `Pool.terminate` then waits on it for
ever. Here every worker has a pipe of its own, so stopping is killing and reaping each one.

Workers ignore SIGINT (a terminal's Ctrl-C reaches the whole process group: the parent alone decides
what an interrupt means, and no worker prints a traceback) and die at once on SIGTERM (the default
action, whatever handler the parent installed before forking). `submit(fn, *args)` returns a ticket;
`result(ticket)` waits for it and re-raises the worker's exception; `stop()` kills and reaps every
worker (any number of times).

Forking is shielded from SIGINT and SIGTERM: the forking thread blocks them (so each child starts with
them blocked, and unblocks them only once its own dispositions are set), and the process's Python
handlers are swapped for recorders meanwhile. Blocking alone is not enough: another thread of the
process (a tokenizer's, a library's) may take the signal, and Python then runs the handler in the
main thread at its next check, which may fall inside `Process.start` after the fork (the new worker
not yet known to anyone, so never stopped) or inside an at-fork hook (whose exception is swallowed).
A signal recorded meanwhile is raised again once every worker is known, and the pool then stops them
all before the exception leaves the constructor. Each child also closes every parent's end of a pipe
it inherited (its own included), so that a worker sees end-of-file and exits whenever the parent is
gone, however it died: no worker outlives the parent holding its stdout or stderr.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from contextlib import contextmanager

from ..errors import InternalError

__all__ = ["WorkerPool"]


SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _serve(conn, inherited) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)  # (blocked by the parent around the fork)
    for other in inherited:  # the parent's ends: only the parent may hold them, so its exit is our EOF
        other.close()
    while True:
        try:
            task = conn.recv()
        except EOFError:  # the parent is gone
            break
        if task is None:
            break
        fn, args = task
        try:
            conn.send(("ok", fn(*args)))
        except BaseException as exc:  # noqa: BLE001 - handed to the parent, which re-raises it
            conn.send(("error", exc))
    os._exit(0)  # no atexit handlers or finalizers of the parent's state run in the child


@contextmanager
def _signals_deferred():
    """SIGINT and SIGTERM blocked in this thread and, on the main thread, recorded instead of handled;
    on the way out the mask and handlers are restored and each recorded signal is raised again (so
    the caller's handler runs there, once the body's state is consistent)."""
    held = []
    handlers = {}
    if threading.current_thread() is threading.main_thread():  # (only it may set handlers)
        handlers = {sig: signal.signal(sig, lambda signum, frame: held.append(signum)) for sig in SIGNALS}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a pending signal reaches a recorder
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(held):
            signal.raise_signal(sig)


class WorkerPool:
    """`jobs` forked workers (forked now: before the caller starts threads of its own)."""

    def __init__(self, jobs: int):
        self.workers = []  # (process, parent's end of its pipe)
        self.idle: list[int] = []
        self.tickets: dict[int, int] = {}  # ticket -> worker busy with it
        self.next_ticket = 0
        try:
            with _signals_deferred():
                self._fork(jobs)
        except BaseException:
            # a signal raised again on leaving, or a failed fork: every worker forked so far is in
            # self.workers (no handler ran between a fork and its recording), and is stopped
            self.stop()
            raise

    def _fork(self, jobs: int) -> None:
        ctx = multiprocessing.get_context("fork")
        for i in range(jobs):
            parent, child = ctx.Pipe()
            inherited = [conn for _, conn in self.workers] + [parent]
            proc = ctx.Process(target=_serve, args=(child, inherited), name=f"suffixspec-shard-{i}", daemon=True)
            try:
                proc.start()
            except BaseException:
                parent.close()
                raise
            finally:
                child.close()
            self.workers.append((proc, parent))
            self.idle.append(i)

    def submit(self, fn, *args) -> int:
        """Run `fn(*args)` on an idle worker (the caller keeps at most `jobs` calls outstanding)."""
        if not self.idle:
            raise InternalError("WorkerPool.submit: every worker is busy; wait for a result first")
        worker = self.idle.pop()
        self.workers[worker][1].send((fn, args))
        ticket = self.next_ticket
        self.next_ticket += 1
        self.tickets[ticket] = worker
        return ticket

    def result(self, ticket: int):
        worker = self.tickets.pop(ticket)
        proc, conn = self.workers[worker]
        try:
            status, value = conn.recv()
        except EOFError:
            proc.join(1.0)
            raise InternalError(f"shard worker {proc.name} died (exit status {proc.exitcode})") from None
        self.idle.append(worker)
        if status == "error":
            raise value
        return value

    def stop(self) -> None:
        for proc, conn in self.workers:
            if proc.is_alive():
                proc.kill()
        for proc, conn in self.workers:
            proc.join()
            conn.close()
        self.workers, self.idle, self.tickets = [], [], {}
