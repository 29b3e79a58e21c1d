"""One writer at a time per index: an exclusive advisory lock, and cleaning up after dead writers.

Contract. Every change of an existing index (append, delete, merge into it, a build over it)
runs while holding `WriterLock(index)`: an exclusive `fcntl.flock` on `INDEX/lock` (created on
first use; readers never take it). A second writer polls for up to `wait` seconds, then raises
`IndexLockedError` naming the index and the holder's pid. The lock is the open file's, so it
goes with the process: a writer killed with SIGKILL releases it, and a child forked while it is
held closes its copy (the parent's lock stays). After the lock is taken, the lock file is checked
to still be the one in the directory (an index removed and re-created meanwhile is locked anew).
Holding the lock proves that nobody else writes inside the index, so `clean(directory, meta)`
then removes what dead writers left there: temporary files (`.*.tmp`) and shard or bitmap files
that the current manifest does not name. Readers that opened an older manifest are unaffected:
their files are mapped, and `CorpusIndex.open` retries when a swap removes a file it was opening.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from ..errors import BadInputError, IndexFormatError, SuffixSpecError
from ..fileio import remove_stale_temps
from .manifest import index_files, is_index_file

__all__ = ["LOCK_FILE", "IndexLockedError", "WriterLock", "clean", "check_wait"]

LOCK_FILE = "lock"
POLL_S = (0.002, 0.05)  # first and largest pause between tries
HELD: set = set()  # descriptors of the locks this process holds (closed in forked children)


class IndexLockedError(SuffixSpecError, TimeoutError):
    """Another writer holds the index's lock and did not let go within the wait."""


def _close_held_in_child() -> None:
    for fd in list(HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_held_in_child)


def check_wait(wait) -> float:
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not wait >= 0 or wait == float("inf"):
        raise BadInputError(f"wait: expected a number of seconds >= 0, got {wait!r}")
    return float(wait)


class WriterLock:
    """Context manager: the exclusive writer lock of the index directory `path` (which must exist)."""

    def __init__(self, path, wait: float = 0.0):
        self.path = Path(path)
        self.wait = check_wait(wait)
        self.fd = None

    def __enter__(self) -> WriterLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        try:
            import fcntl  # POSIX only: importing the package elsewhere must still work
        except ImportError:
            raise IndexFormatError(f"{self.path}: changing an index needs POSIX file locks (fcntl), not available here") from None
        deadline = time.monotonic() + self.wait
        pause = POLL_S[0]
        lock_path = self.path / LOCK_FILE
        while True:
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            except FileNotFoundError:
                raise IndexFormatError(f"{self.path}: no such index") from None
            except OSError as exc:
                raise IndexFormatError(f"{self.path}: cannot take the writer lock ({exc.strerror or exc})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise IndexFormatError(f"{self.path}: cannot take the writer lock ({exc.strerror or exc})") from None
                if time.monotonic() >= deadline:
                    raise IndexLockedError(
                        f"{self.path}: another writer{self._holder()} is changing this index; gave up after "
                        f"{self.wait:g} s (wait longer with --wait SECONDS, or wait= in Python)") from None
                time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
                pause = min(pause * 2, POLL_S[1])
                continue
            try:
                same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
            except OSError:
                same = False
            if not same:  # the directory was replaced while we waited: lock the new one
                os.close(fd)
                continue
            HELD.add(fd)
            self.fd = fd
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError:
                pass  # the pid is a courtesy for the message above
            return

    def _holder(self) -> str:
        try:
            with open(self.path / LOCK_FILE, encoding="ascii") as f:
                pid = f.read(32).strip()
        except (OSError, UnicodeDecodeError):
            return ""
        return f" (pid {pid})" if pid.isdigit() else ""

    def release(self) -> None:
        if self.fd is not None:
            HELD.discard(self.fd)
            try:
                os.ftruncate(self.fd, 0)
            except OSError:
                pass
            os.close(self.fd)  # closing the only descriptor releases the lock
            self.fd = None


def clean(directory: Path, meta: dict | None) -> list[Path]:
    """Under the writer lock: remove dead writers' leftovers inside the index `directory`
    (temporary files, and shard / bitmap files the manifest `meta` does not name), and the
    temporary siblings of the index (`.NAME.*.tmp`) whose writer is provably gone."""
    directory = Path(directory)
    removed = remove_stale_temps(directory.parent, prefix=f".{directory.name}.")
    removed += remove_stale_temps(directory, everything=True)
    if meta is None:
        return removed  # no valid manifest: nothing proves which index files are unused
    named = set(index_files(meta))
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if is_index_file(name) and name not in named:
            p = Path(directory) / name
            try:
                p.unlink()
                removed.append(p)
            except OSError:
                pass
    return removed
