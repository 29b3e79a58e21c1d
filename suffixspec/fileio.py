"""Files suffixspec writes for itself: the user cache directory and atomic writes.

Contract: `atomic_write_bytes` / `atomic_write_text` / `atomic_write_json` either leave the old
file untouched or replace it whole with the new content (written to a temporary file in the same
directory, flushed, fsynced, renamed, the directory fsynced). Temporary names start with
`.NAME.` and end with `.tmp`, so a dead writer's leftovers are recognisable. `cache_dir()` is the
one place that decides where cached artefacts (converted models, tokenizers, cost curves) live.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

__all__ = ["CACHE_ENV", "cache_dir", "atomic_write_bytes", "atomic_write_text", "atomic_write_json",
           "fsync_dir", "temp_name"]

CACHE_ENV = "SUFFIXSPEC_CACHE"


def cache_dir() -> Path:
    """``$SUFFIXSPEC_CACHE``, else ``$XDG_CACHE_HOME/suffixspec``, else ``~/.cache/suffixspec``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "suffixspec"


def temp_name(path: Path) -> Path:
    """A fresh temporary sibling of `path`: ``.NAME.<hex>.tmp`` in the same directory."""
    path = Path(path)
    return path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"


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
