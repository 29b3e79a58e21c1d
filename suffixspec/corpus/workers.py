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
"""

from __future__ import annotations

import multiprocessing
import os
import signal

from ..errors import InternalError

__all__ = ["WorkerPool"]


SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _serve(conn) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)  # (blocked by the parent around the fork)
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


class WorkerPool:
    """`jobs` forked workers (forked now: before the caller starts threads of its own)."""

    def __init__(self, jobs: int):
        ctx = multiprocessing.get_context("fork")
        self.workers = []  # (process, parent's end of its pipe)
        self.idle: list[int] = []
        self.tickets: dict[int, int] = {}  # ticket -> worker busy with it
        self.next_ticket = 0
        # Signals wait while forking: one arriving mid-fork would run the parent's handler inside the
        # fork hooks (where its exception is swallowed) or in a child that has not set its own yet.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        try:
            for i in range(jobs):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_serve, args=(child,), name=f"suffixspec-shard-{i}", daemon=True)
                proc.start()
                child.close()
                self.workers.append((proc, parent))
                self.idle.append(i)
        finally:
            try:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
                # a signal held back while forking is handled here, before the pool reaches its caller
                # (whose cleanup would never see it): its workers are stopped on the way out
                self._unblocked = True
            except BaseException:
                self.stop()
                raise

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
