"""Files suffixspec writes for itself: the user cache directory and atomic writes.

Contract: `atomic_write_bytes` / `atomic_write_text` / `atomic_write_json` either leave the old
file untouched or replace it whole with the new content (written to a temporary file in the same
directory, flushed, fsynced, renamed, the directory fsynced). Temporary names start with
`.NAME.` and end with `.tmp`, and carry their writer (`.NAME.<hex>.<pid>-<start>-<boot>-<pidns>.tmp`:
process id, its start time in clock ticks since boot, the boot id and the pid namespace), so
`owner_gone` can tell, without guessing, that a leftover's writer is dead: same boot and pid
namespace, and no process with that pid and start time (or another boot). `remove_stale_temps`
removes only such leftovers. `open_regular` opens a file for reading only when it is a regular
file (a FIFO, device, directory or symlink loop is refused before any read, never a hang).
`start_writeback(fd)` starts writing a file's dirty pages without waiting; `fsync_file(path)` makes a
file durable, `fsync_dir(directory)` a rename inside it.
`cache_dir()` is the one place that decides where cached artefacts (converted models,
tokenizers, cost curves) live; `cache_entry` names one artefact's folder there, keyed by its source
file's identity (path, size, modification time) and the conversion's version.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import stat
import uuid
from pathlib import Path

__all__ = ["CACHE_ENV", "cache_dir", "cache_entry", "atomic_write_bytes", "atomic_write_text", "atomic_write_json",
           "fsync_dir", "fsync_file", "start_writeback", "temp_name", "owner_tag", "owner_gone", "remove_stale_temps", "open_regular"]

CACHE_ENV = "SUFFIXSPEC_CACHE"


def cache_dir() -> Path:
    """``$SUFFIXSPEC_CACHE``, else ``$XDG_CACHE_HOME/suffixspec``, else ``~/.cache/suffixspec``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "suffixspec"


_OWNER = {}  # pid -> owner tag of this process (recomputed after a fork)


def cache_entry(kind: str, source: Path, name: str, version: int) -> Path:
    """The folder under `cache_dir()/kind` for an artefact converted from `source` (named `name`):
    a new source file (path, size or modification time) or conversion `version` is a new entry."""
    stat_ = source.stat()
    identity = f"{version}\0{source.resolve()}\0{stat_.st_size}\0{stat_.st_mtime_ns}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    safe_name = re.sub(r"[^\w.-]", "_", name)
    return cache_dir() / kind / f"{safe_name}-{key}"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _boot_id() -> str:
    return (_read("/proc/sys/kernel/random/boot_id") or "").strip().replace("-", "")[:12] or "noboot"


def _pid_ns() -> str:
    try:
        link = os.readlink("/proc/self/ns/pid")  # 'pid:[4026531836]'
    except OSError:
        return "nons"
    return "".join(c for c in link if c.isdigit()) or "nons"


def _start_ticks(pid: int) -> str | None:
    """Start time of process `pid` (clock ticks since boot), None when there is no such process."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # after the command name, which may hold spaces
    return fields[19] if len(fields) > 19 else None


def owner_tag() -> str:
    """``<pid>-<start>-<boot>-<pidns>`` of this process: names it uniquely across time on this host."""
    pid = os.getpid()
    if pid not in _OWNER:
        _OWNER.clear()
        _OWNER[pid] = f"{pid}-{_start_ticks(pid) or 'nostart'}-{_boot_id()}-{_pid_ns()}"
    return _OWNER[pid]


def temp_name(path: Path) -> Path:
    """A fresh temporary sibling of `path`: ``.NAME.<hex>.<owner tag>.tmp`` in the same directory."""
    path = Path(path)
    return path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.{owner_tag()}.tmp"


def owner_gone(name: str) -> bool:
    """True only when the writer named in temporary file name `name` is provably dead: the tag
    parses, its boot id and pid namespace are ours, and no process with its pid and start time
    runs (or its boot id is not the current boot's). Untagged or foreign names: False."""
    if not (name.startswith(".") and name.endswith(".tmp")):
        return False
    tag = name[:-4].rsplit(".", 1)[-1]
    parts = tag.split("-")
    if len(parts) != 4 or not parts[0].isdigit():
        return False
    pid, start, boot, ns = parts
    if boot != _boot_id():
        return boot != "noboot" and _boot_id() != "noboot"  # written before this boot: nobody runs it now
    if ns != _pid_ns() or ns == "nons" or start == "nostart":
        return False  # another pid namespace (container) or no proof available
    return _start_ticks(int(pid)) != start


def remove_stale_temps(directory: Path, prefix: str = ".", *, everything: bool = False) -> list[Path]:
    """Remove the temporary files and folders (``.*.tmp`` starting with `prefix`) in `directory`
    whose writer is provably gone (`owner_gone`), or all of them when `everything` (the caller
    proves nobody else writes there, e.g. by holding the directory's writer lock). Returns them."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(prefix) and name.startswith(".") and name.endswith(".tmp")):
            continue
        if not (everything or owner_gone(name)):
            continue
        p = Path(directory) / name
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except FileNotFoundError:
            continue
        except OSError:
            continue  # not ours to fight over (permissions): left in place
        removed.append(p)
    return removed


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def open_regular(path, *, error=OSError, missing=None) -> tuple[int, os.stat_result]:
    """(fd, stat) of `path` opened read-only, only if it is a regular file (symlinks followed).
    Anything else raises `error(message)`: a FIFO, device, socket or directory (checked with
    stat before opening, and again on the opened descriptor: opened non-blocking, so a FIFO
    swapped in between cannot hang), a symlink loop, no permission. A missing file raises
    `missing(message)` (default `error`)."""
    path = str(path)
    fd = None
    for step in ("stat", "open"):
        try:
            if step == "stat":
                st = os.stat(path)
            else:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise (missing or error)(f"{path}: missing file") from None
        except OSError as exc:
            what = "a symlink loop" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
            raise error(f"{path}: cannot open ({what})") from None
        if step == "stat" and not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: is {_kind(st.st_mode)}, expected a regular file")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: is {_kind(st.st_mode)}, expected a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular(path, *, error=OSError, what: str = "file") -> bytes:
    """The whole of `path`, a regular file only (`open_regular`'s checks); a file that grows while
    read, or a read that fails, raises `error` naming `what`."""
    fd, st = open_regular(path, error=lambda message: error(f"{message} (reading the {what})"))
    chunks, total = [], 0
    try:
        while True:
            chunk = os.read(fd, 1 << 22)
            if not chunk:
                break
            total += len(chunk)
            if total > st.st_size:  # growing under us: whatever it is, it is not a saved file
                raise error(f"{path}: the file grew while being read")
            chunks.append(chunk)
    except OSError as exc:
        raise error(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def _sync_file_range():
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # not Linux: writeback starts when the kernel decides
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_WRITEBACK = []  # [sync_file_range or None], looked up on first use


def start_writeback(fd: int) -> None:
    """Ask the kernel to start writing the file's dirty pages to disk now, without waiting (Linux's
    sync_file_range WRITE; elsewhere nothing): an `fsync_file` later then waits for less. Durability
    still needs that fsync."""
    if not _WRITEBACK:
        _WRITEBACK.append(_sync_file_range())
    if _WRITEBACK[0] is not None:
        _WRITEBACK[0](fd, 0, 0, 2)  # SYNC_FILE_RANGE_WRITE; a failure only leaves it to the fsync


def fsync_file(path: Path) -> None:
    """Make a file's content durable (fsync); errors raise (OSError naming the path)."""
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    """Make a rename inside `directory` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(str(directory), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path, data: bytes, *, durable: bool = True) -> Path:
    """Replace `path` with `data` atomically; returns the path."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)
    return path


def atomic_write_text(path, text: str, *, durable: bool = True) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), durable=durable)


def atomic_write_json(path, obj, *, durable: bool = True, **dumps) -> Path:
    return atomic_write_text(path, json.dumps(obj, **dumps), durable=durable)
