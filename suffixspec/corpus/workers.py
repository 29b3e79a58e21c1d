"""A few forked worker processes that run one function call at a time each, and can be stopped at any
moment without hanging.

Why not `multiprocessing.Pool`: its workers share one task queue guarded by a lock, and an idle
worker waits on that queue holding the lock; a worker killed there (SIGTERM to the process group, as a
terminal or a supervisor sends it) leaves the lock held, and `Pool.terminate` then waits on it for
ever. Here every worker has a pipe of its own, so stopping is killing and reaping each one.

Workers ignore SIGINT (a terminal's Ctrl-C reaches the whole process group: the parent alone decides
what an interrupt means, and no worker prints a traceback) and die at once on SIGTERM (the default
action, whatever handler the parent installed before forking). `submit(fn, *args, fds=())` returns a
ticket; `first_done(tickets)` waits for the first of them to finish; `result(ticket)` waits for it and
re-raises the worker's exception; `stop()` kills and reaps every worker (any number of times). File
descriptors in `fds` travel beside the pickled call (SCM_RIGHTS over the worker's socket pair: memory
shared with the worker, a shard's tokens, is passed as a descriptor instead of being pickled); the
worker calls `fn(*args, *its_copies)` and closes its copies after.

Forking runs under `interrupts.signals_deferred` (SIGINT and SIGTERM blocked in the forking thread, so
each child starts with them blocked and unblocks them only once its own dispositions are set, and
recorded rather than handled meanwhile): a signal that another thread of the process takes while the
pool forks would otherwise run the caller's handler inside `Process.start` after a fork (a worker no one
knows of, never stopped, holding the caller's stderr) or inside an at-fork hook (its exception
swallowed). It is raised again once every worker is known, and the pool then stops them all before the
exception leaves the constructor; `stop()` runs under it too. Each child also closes every parent's end
of a pipe it inherited (its own included), so that a worker sees end-of-file and exits whenever the
parent is gone, however it died: no worker outlives the parent holding its stdout or stderr.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from multiprocessing.connection import wait
from multiprocessing.reduction import recv_handle, send_handle

from ..errors import InternalError
from ..interrupts import SIGNALS, signals_deferred

__all__ = ["WorkerPool"]


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
        fn, args, n_fds = task
        fds = [recv_handle(conn) for _ in range(n_fds)]
        try:
            conn.send(("ok", fn(*args, *fds)))
        except BaseException as exc:  # noqa: BLE001 - handed to the parent, which re-raises it
            conn.send(("error", exc))
        finally:
            for fd in fds:
                os.close(fd)
    os._exit(0)  # no atexit handlers or finalizers of the parent's state run in the child


class WorkerPool:
    """`jobs` forked workers (forked now: before the caller starts threads of its own)."""

    def __init__(self, jobs: int):
        self.workers = []  # (process, parent's end of its pipe)
        self.idle: list[int] = []
        self.tickets: dict[int, int] = {}  # ticket -> worker busy with it
        self.next_ticket = 0
        try:
            with signals_deferred():
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

    def submit(self, fn, *args, fds=()) -> int:
        """Run `fn(*args, *fds)` on an idle worker, with the worker's copies of the descriptors `fds`
        (the caller keeps at most `jobs` calls outstanding, and may close its own descriptors once this
        returns)."""
        if not self.idle:
            raise InternalError("WorkerPool.submit: every worker is busy; wait for a result first")
        worker = self.idle.pop()
        proc, conn = self.workers[worker]
        conn.send((fn, args, len(fds)))
        for fd in fds:
            send_handle(conn, fd, proc.pid)
        ticket = self.next_ticket
        self.next_ticket += 1
        self.tickets[ticket] = worker
        return ticket

    def first_done(self, tickets: list[int]) -> int:
        """One of `tickets` whose call has finished (its `result` will not wait), waiting for the first."""
        by_conn = {self.workers[self.tickets[t]][1]: t for t in tickets}
        return by_conn[wait(list(by_conn))[0]]

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
        # signals held back meanwhile: one handled inside a worker's waitpid would lose its exit status
        # (Popen then takes the reaped worker for a running one, and close() refuses it)
        with signals_deferred():
            for proc, _ in self.workers:
                proc.kill()  # (a no-op for a worker already reaped)
            for proc, conn in self.workers:
                proc.join()
                conn.close()
                proc.close()  # its sentinel pipe closed here, not by a finalizer at a random later moment
            self.workers, self.idle, self.tickets = [], [], {}
