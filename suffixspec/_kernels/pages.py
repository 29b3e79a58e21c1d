"""Page-aligned anonymous memory for the corpus build, and scratch buffers kept between its shards.

Contract:
- `anonymous(n, dtype)`: an uninitialised dtype[n] in private anonymous pages of its own.
- `Scratch`: named buffers that a process keeps from one shard build to the next.
  `take(name, n, dtype)` returns an uninitialised dtype[n] over the buffer of that name (its
  contents are whatever the last shard left: every caller writes before it reads). The buffer is
  replaced by a larger one when it is too small. `release()` drops every buffer.
  A view stays valid after its buffer is replaced or released (it holds its own mapping), but two
  views taken under one name alias each other: a build takes each name once.

Why keep them: a shard's build touches about 85 bytes of scratch per token besides its output, and on
a virtual machine that hands freed memory back to its host the first touch of every fresh page is
expensive, a good part of a shard's build; a shard built on pages its process already holds skips it.
"""

import mmap

import numpy as np

__all__ = ["anonymous", "Scratch"]


def anonymous(n: int, dtype) -> np.ndarray:
    """An uninitialised dtype[n] in private anonymous pages of its own (page-aligned), not marked
    for transparent huge pages as numpy's large allocations are: they save TLB misses, but on a
    virtual machine that hands free memory back to its host a fresh huge page's first touch has
    the host fault in all of it, which cost more than they saved (the paired runs of
    bench/results/corpus_compact.jsonl, 2026-12-07)."""
    size = max(int(n) * np.dtype(dtype).itemsize, 1)
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(buf, dtype, count=int(n))


class Scratch:
    """Named anonymous buffers reused from one shard build to the next in a process."""

    def __init__(self):
        self._buffers: dict[str, mmap.mmap] = {}

    def take(self, name: str, n: int, dtype) -> np.ndarray:
        """An uninitialised dtype[n] over buffer `name` (page-aligned; see the module docstring)."""
        n = int(n)
        if n < 0:
            raise ValueError(f"Scratch.take({name!r}): expected a count >= 0, got {n}")
        size = max(n * np.dtype(dtype).itemsize, 1)
        buf = self._buffers.get(name)
        if buf is None or len(buf) < size:
            self._buffers.pop(name, None)  # (its pages go back once no view holds them)
            buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            self._buffers[name] = buf
        return np.frombuffer(buf, dtype, count=n)

    def release(self) -> None:
        """Drop every buffer (their pages go back once no view holds them)."""
        self._buffers.clear()

    @property
    def nbytes(self) -> int:
        """Bytes of address space the buffers hold (touched or not)."""
        return sum(len(b) for b in self._buffers.values())
