"""Prompts read once: the engine's use of a `verify.prefix.PrefixPool`.

Contract (`Engine` calls these around its admissions and rounds):

* `match(rq)`: a newcomer's prompt is looked up (at most all but its last token: the last token's
  logits start the answer, so it is always read); its `pending` becomes the part the pool lacks and
  `stats.cached_tokens` the part it has. The match stays pinned until `seeded_state` or `unmatch`.
* `seeded_state(rows, new_state)`: a KV state whose rows start from their matches' keys and values.
* `shared_reads(newcomers, ...)`: newcomers admitted together whose prompts share a prefix beyond
  what the pool holds (the samples of one prompt, a burst over one document) have that prefix read
  once, in one row, into the pool; each then matches it. With the cache off the same happens
  through a scratch pool emptied after the admission, so samples of one prompt still read it once.
* `keep(state, rows, requests)`: after a committed pass, the rows' committed tokens (never a draft
  position, never past the request's context) go into the pool: after a prefill, when a request
  finishes, when it is cancelled.
* Exactness: the reused keys and values are those the model computed for the same tokens at the
  same positions; greedy outputs equal plain decoding's as with chunked prefill.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..draft.tree import DraftTree
from ..errors import BadInputError
from ..verify.prefix import PrefixMatch, PrefixPool
from .lifecycle import Request

__all__ = ["PrefixReuse", "SharedRead", "MIN_SHARED", "default_prefix_cache_bytes", "make_prefix_pool"]

MIN_SHARED = 16  # tokens two different prompts must share beyond the pool to be read once together
SCRATCH_BYTES = 1 << 62  # a scratch pool's bound: it lives for one admission only


@dataclass
class SharedRead:
    """Newcomers whose prompts share their first `length` tokens, that prefix to be read once."""

    members: list[Request]
    length: int
    cached: int = 0  # of which the pool held


@dataclass
class PrefixReuse:
    """The engine's prefix pool (None: off) and the matches of newcomers being admitted."""

    pool: PrefixPool | None
    _matches: dict[int, PrefixMatch] = field(default_factory=dict)
    _scratch: PrefixPool | None = None  # with the cache off: shared reads of one admission
    _paid: dict[int, int] = field(default_factory=dict)  # tokens a shared read fed for the member it names

    @property
    def enabled(self) -> bool:
        return self.pool is not None

    def _lookup(self) -> PrefixPool | None:
        return self.pool if self.pool is not None else self._scratch

    # ---------------------------------------------------------------------------------- matching

    def match(self, rq: Request) -> int:
        """Look `rq`'s prompt up; returns the cached tokens (its pending is the rest)."""
        self.unmatch(rq)
        pool = self._lookup()
        prompt = rq.prompt
        if pool is None or len(prompt) < 2:
            return 0
        found = pool.match(prompt, len(prompt) - 1)
        if found.length == 0:
            found.release()
            return 0
        self._matches[rq.index] = found
        rq.pending = prompt[found.length :]
        # the first member of a shared read counts what it fed as read, not reused
        rq.stats.cached_tokens = max(0, found.length - self._paid.pop(rq.index, 0)) if self.pool is not None else 0
        return found.length

    def unmatch(self, rq: Request) -> None:
        """Forget `rq`'s match (it goes back to the queue): it reads its whole prompt again."""
        found = self._matches.pop(rq.index, None)
        if found is not None:
            found.release()
            rq.pending = list(rq.prompt)
            rq.stats.cached_tokens = 0

    def seeded_state(self, rows: list[Request], new_state: Callable[[int], Any]):
        """A state of `len(rows)` rows, each starting from its match's keys and values."""
        state = new_state(len(rows))
        prefixes = []
        for rq in rows:
            found = self._matches.pop(rq.index, None)
            if found is None:
                prefixes.append([])
                continue
            prefixes.append(PrefixPool.fetch(found))
            found.release()
        if any(prefixes):
            state.seed(prefixes)
        return state

    def count(self, rows: list[Request]) -> None:
        """The pool's counters learn what admitted `rows` reused and read."""
        pool = self.pool
        if pool is not None:
            for rq in rows:
                pool.counters.hit_tokens += rq.stats.cached_tokens
                pool.counters.miss_tokens += rq.stats.prompt_tokens - rq.stats.cached_tokens

    # ---------------------------------------------------------------------------------- shared reads

    def plan_shared(self, newcomers: list[Request]) -> list[SharedRead]:
        """Runs of newcomers (in prompt order) whose prompts share at least `MIN_SHARED` tokens (all of
        them but the last when the prompts are equal) beyond the pool's match of that prefix."""
        if len(newcomers) < 2:
            return []
        pool = self._lookup()
        order = sorted(newcomers, key=lambda rq: rq.prompt)
        arrays = [np.asarray(rq.prompt, np.int64) for rq in order]
        plans, run, shared = [], [order[0]], None
        for prev, cur, rq in zip(arrays, arrays[1:], order[1:]):
            n = min(len(prev), len(cur))
            diff = np.flatnonzero(prev[:n] != cur[:n])
            common = int(diff[0]) if len(diff) else n
            if common >= 1:
                run.append(rq)
                shared = common if shared is None else min(shared, common)
                continue
            plans.extend(self._worth(run, shared, pool))
            run, shared = [rq], None
        plans.extend(self._worth(run, shared, pool))
        return plans

    @staticmethod
    def _worth(run: list[Request], shared: int | None, pool: PrefixPool | None) -> list[SharedRead]:
        if len(run) < 2 or not shared:
            return []
        length = min(shared, min(len(rq.prompt) for rq in run) - 1)
        equal = all(rq.prompt == run[0].prompt for rq in run)
        cached = 0
        if pool is not None:
            found = pool.match(run[0].prompt, length)
            cached = found.length
            found.release()
        if length - cached < (1 if equal else MIN_SHARED):
            return []
        return [SharedRead(sorted(run, key=lambda rq: rq.index), length, cached)]

    def begin_admission(self) -> None:
        """With the cache off, shared reads go through a scratch pool for this admission."""
        if self.pool is None:
            self._scratch = PrefixPool(SCRATCH_BYTES)

    def end_admission(self) -> None:
        self._scratch = None
        self._paid.clear()

    def read_shared(self, plan: SharedRead, new_state: Callable[[int], Any]) -> int:
        """Read `plan`'s prefix once (from what the pool holds of it) into the pool; returns the tokens
        fed to the model."""
        pool = self._lookup()
        head = plan.members[0]
        prefix = head.prompt[: plan.length]
        found = pool.match(prefix)
        state = new_state(1)
        if found.length:
            state.seed([PrefixPool.fetch(found)])
        found.release()
        fed = plan.length - found.length
        state.forward([prefix[found.length :]], [DraftTree.empty()])
        state.commit([[]])
        pool.insert(prefix, lambda start, end: state.row_kv(0, start, end))
        self._paid[head.index] = fed
        return fed

    # ---------------------------------------------------------------------------------- keeping

    def keep(self, state, rows: list[int], requests: list[Request]) -> None:
        """Rows `rows` of `state` (committed, no pass in flight), the rows of `requests`, go into the pool
        up to what both their cache and their context hold."""
        pool = self.pool
        if pool is None:
            return
        for r, rq in zip(rows, requests):
            n = min(int(state.n_cached[r]), len(rq.context))
            if n > 0:
                pool.insert(rq.context[:n], lambda start, end, r=r: state.row_kv(r, start, end))


def default_prefix_cache_bytes(model) -> int:
    """The pool's default bound: on a GPU a quarter of the memory free after loading the model; on
    a CPU an eighth of the machine's memory, at most 1 GiB."""
    import torch

    try:
        device = next(model.parameters()).device
    except (StopIteration, AttributeError):
        device = torch.device("cpu")
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free // 4)
    try:
        import os

        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 8 << 30
    return int(min(1 << 30, total // 8))


def make_prefix_pool(max_bytes: int | None, model) -> PrefixPool | None:
    """A pool of `max_bytes` (None: `default_prefix_cache_bytes`; 0: no pool, None returned)."""
    if max_bytes is None:
        max_bytes = default_prefix_cache_bytes(model)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, np.integer)) or max_bytes < 0:
        raise BadInputError(f"prefix_cache_bytes: expected a number of bytes >= 0 (0: no prefix cache), got "
                            f"{max_bytes!r}", param="prefix_cache_bytes")
    return PrefixPool(int(max_bytes)) if max_bytes else None
