"""`SuffixSpecDraftModel`: suffixspec as llama-cpp-python's draft model (`Llama(draft_model=...)`).

    from llama_cpp import Llama
    from suffixspec.integrations.llama_cpp import SuffixSpecDraftModel
    llm = Llama(model_path="model.gguf", draft_model=SuffixSpecDraftModel(), logits_all=True)

Contract:
- `SuffixSpecDraftModel` is a `llama_cpp.llama_speculative.LlamaDraftModel` built on first access of
  the name (module `__getattr__`): importing this module, or suffixspec, never imports llama_cpp;
  `draft_model_class(base)` builds the same class over another base (tests use a stand-in);
- llama-cpp-python calls it once per evaluation with every token so far (prompt, output, the token
  just sampled) and checks the returned linear draft (np.intc, possibly empty) in its next
  evaluation; the given array is only read;
- one proposer session per sequence: a call whose ids extend the previous call's ids feeds only the
  new ids to the session; any other call closes the session (its output joins the proposer's
  response cache) and starts a new one; `finish()` closes it at once;
- the draft is the best root path of the session's tree, its length (at most `max_draft`) chosen to
  maximise expected tokens per unit of the evaluation's cost: a line in the drafted tokens fitted to
  the fastest recent time between calls per draft length (`RecentStepCost`; `step_cost`
  fixes it); a long draft the line refuses is still tried now and then (every `EXPLORE` steps,
  doubling while it keeps not paying), so a stall that once made drafts look dear is re-measured;
- the response cache takes a finished sequence inline (`cache_upkeep="inline"`): llama.cpp keeps
  every core busy, and a background thread would stall its evaluations;
- keywords: `corpus` (index path(s)), `filter` (document tags, needs a corpus), `max_draft`,
  `step_cost` and any `ProposerConfig` knob; the numba kernels are compiled and run in `__init__`;
- llama-cpp-python sizes its logits buffer by `n_batch` rows unless `logits_all=True` while a
  draft model makes every evaluation write a row per token: without `logits_all=True` (or
  `n_batch >= n_ctx`) a context longer than `n_batch` raises in `Llama.eval` (docs/serving.md).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time

import numpy as np

from .. import BadInputError, CorpusIndex, DraftTree, Proposer
from ..draft.config import ProposerConfig
from ..engine.warmup import warm_kernels
from .vllm_drafting import PRIOR_STEP_SECONDS, StepCost, path_values

# SuffixSpecDraftModel is built by __getattr__ on first access
__all__ = ["SuffixSpecDraftModel", "LlamaDrafter", "RecentStepCost", "draft_model_class", "DEFAULT_MAX_DRAFT"]  # noqa: F822

DEFAULT_MAX_DRAFT = 10
# before a drafted step is measured, a drafted token costs this share of a one-token evaluation
# (llama.cpp on a CPU: a small batch costs nearly a row of weights' arithmetic per token)
PRIOR_SLOPE = 0.3
EXPLORE = 16  # steps between tries of a long draft the cost line refuses (doubling up to EXPLORE_MAX)
EXPLORE_MAX = 256
_NO_VOCAB = np.iinfo(np.intc).max  # the tree's tokens come from the context and corpora: no cut
_EMPTY = np.zeros(0, np.intc)


@dataclasses.dataclass(frozen=True)
class _DraftBuffers:
    """One row's arrays for `path_values` (`_draft_of`), allocated once."""

    values: np.ndarray  # (1, k + 1) float64: the best path's expected tokens per length
    nodes: np.ndarray  # (1, k + 1) int64: that path's last node
    starts: np.ndarray  # (1,) int64: the row's first node (always 0: one tree)
    counts: np.ndarray  # (1,) int64: the tree's nodes
    limits: np.ndarray  # (1,) int64: the longest path offered

    @classmethod
    def of(cls, k: int) -> _DraftBuffers:
        one = functools.partial(np.zeros, 1, np.int64)
        return cls(np.empty((1, k + 1), np.float64), np.empty((1, k + 1), np.int64), one(), one(), one())


class RecentStepCost:
    """An evaluation's seconds as a line a + c x in its x drafted tokens, fitted to the fastest of the
    last `window` measured steps of each draft length (weighted by how many each holds; c >= 0,
    a > 0). Lengths never measured leave the slope to `prior_slope` (relative to a). Something else
    on the machine only ever slows a step: the fastest recent step of a length is its cost without
    the stall, so one stall-free measurement outvotes any number of stalls."""

    def __init__(self, k: int, window: int = 5, prior_slope: float = PRIOR_SLOPE):
        self.k = int(k)
        self.prior_slope = float(prior_slope)
        self.times = [collections.deque(maxlen=int(window)) for _ in range(self.k + 1)]
        self.observed = 0
        self._line: tuple[float, float] | None = None

    def observe(self, tokens: int, seconds: float, batch: int = 1) -> None:
        """One evaluation of `tokens` tokens (the sampled one and tokens - 1 drafted) in `seconds`."""
        if not (tokens >= 1 and seconds > 0 and np.isfinite(seconds)):
            return
        kept = self.times[min(int(tokens) - 1, self.k)]
        before = (len(kept), min(kept)) if kept else None
        kept.append(float(seconds))
        self.observed += 1
        if (len(kept), min(kept)) != before:  # the fit reads each length's count and fastest step only
            self._line = None

    def line(self, batch: int = 1) -> tuple[float, float]:
        """(a, c): an evaluation drafting x tokens costs a + c x seconds."""
        if self._line is None:
            self._line = self._fit()
        return self._line

    def _fit(self) -> tuple[float, float]:
        # plain floats: at most k + 1 points, refitted on many calls (numpy's per-call cost dominates)
        pts = [(float(x), min(t), float(len(t))) for x, t in enumerate(self.times) if t]
        if not pts:
            return PRIOR_STEP_SECONDS, PRIOR_STEP_SECONDS * self.prior_slope
        if len(pts) == 1:  # one length measured: the prior's slope through it
            a = pts[0][1] / (1.0 + self.prior_slope * pts[0][0])
            return a, a * self.prior_slope
        w = sum(p[2] for p in pts)
        mx = sum(p[0] * p[2] for p in pts) / w
        my = sum(p[1] * p[2] for p in pts) / w
        c = sum(p[2] * (p[0] - mx) * (p[1] - my) for p in pts) / sum(p[2] * (p[0] - mx) ** 2 for p in pts)
        a = my - c * mx
        if c < 0.0:
            c, a = 0.0, my
        if a < 0.02 * my:
            a = 0.02 * my
            c = max(sum(p[2] * p[0] * (p[1] - a) for p in pts) / sum(p[2] * p[0] * p[0] for p in pts), 0.0)
        return a, c

    def __call__(self, tokens, batch: int = 1) -> np.ndarray:
        a, c = self.line()
        return a + c * np.maximum(np.asarray(tokens, np.float64) - 1.0, 0.0)


class LlamaDrafter:
    """The draft model's state and `__call__` (module docstring), without llama_cpp's base class.

    `stats` counts calls, sessions started, calls measured, draft tokens and `call_seconds`, the
    time spent inside `__call__`; `cost` is the evaluation's cost line (`cost.line(1)`: seconds at
    no draft, seconds per drafted token)."""

    def __init__(self, *, corpus=None, filter=None, max_draft: int = DEFAULT_MAX_DRAFT, step_cost=None, **knobs):
        if isinstance(max_draft, bool) or not isinstance(max_draft, (int, np.integer)) or max_draft < 1:
            raise BadInputError(f"max_draft: expected a positive integer, got {max_draft!r}", param="max_draft")
        self.k = int(max_draft)
        paths = [corpus] if isinstance(corpus, str) else list(corpus or [])
        self.corpora = [c if isinstance(c, CorpusIndex) else CorpusIndex.open(c) for c in paths]
        if filter is not None and not self.corpora:
            raise BadInputError("filter: a filter needs a corpus (none was given)", param="filter")
        self.filter = filter
        knobs.setdefault("max_nodes", max(16, 4 * self.k))
        knobs["max_depth"] = min(int(knobs.get("max_depth") or self.k), self.k)
        knobs.setdefault("recency", 0.0)  # linear drafts: frequency alone, as the vLLM adapter
        knobs.setdefault("cache_upkeep", "inline")  # no thread beside llama.cpp's (module docstring)
        self.config = ProposerConfig.of(None, knobs)
        self.cost = RecentStepCost(self.k) if step_cost is None else StepCost(step_cost)
        self._evaluated = np.arange(1, self.k + 2)  # an evaluation's tokens at each draft length
        self._buf = _DraftBuffers.of(self.k)
        self._explore = EXPLORE if step_cost is None else 0  # steps between tries of a refused long draft
        self._since_long = 0  # steps since a draft of the longest length offered was measured
        warm_kernels(self.corpora or None, filter=filter, config=self.config)
        self._draft_of(DraftTree.from_paths([[1, 2], [1, 3]]), self.k)  # the adapter's own kernel
        self.proposer = Proposer(self.corpora or None, config=self.config)
        self.stats = collections.Counter()
        self._session = None
        self._ids = np.zeros(1024, np.intc)  # the session's tokens so far, [:_length]
        self._length = 0
        self._last_draft = 0
        self._last_end: float | None = None

    def __call__(self, input_ids, /, **kwargs) -> np.ndarray:
        """The draft that follows `input_ids` (every token so far), as an np.intc array."""
        if kwargs:  # llama-cpp-python 0.3.36 passes none; any other is refused by name, never ignored
            raise BadInputError(f"SuffixSpecDraftModel takes only input_ids; got unsupported keyword argument(s) "
                                f"{', '.join(sorted(kwargs))}", param=sorted(kwargs)[0])
        t0 = time.perf_counter()
        ids = np.asarray(input_ids)
        if ids.ndim != 1:
            raise BadInputError(f"input_ids: expected a 1-d array of token ids, got shape {ids.shape}")
        n = ids.shape[0]
        self.stats["calls"] += 1
        if n == 0:
            self.finish()
            return _EMPTY.copy()
        if self._extends(ids, n):
            if n > self._length:
                if self._last_end is not None:
                    self.cost.observe(1 + self._last_draft, t0 - self._last_end, 1)
                    self.stats["calls_measured"] += 1
                self._feed(ids, n)
        else:
            self._start(ids, n)
        draft = self._draft_of(self._session.propose(self.config.max_nodes), self.k)
        self._last_draft = draft.shape[0]
        self.stats["draft_tokens"] += draft.shape[0]
        end = time.perf_counter()
        self._last_end = end
        self.stats["call_seconds"] += end - t0
        return draft

    def finish(self) -> None:
        """Close the current sequence's session now (its output joins the response cache)."""
        session, self._session = self._session, None
        self._length = 0
        self._last_end = None
        if session is not None:
            session.close()

    def _extends(self, ids: np.ndarray, n: int) -> bool:
        L = self._length
        if self._session is None or n < L:
            return False
        if ids.dtype == np.intc:  # llama-cpp-python's own arrays: one memcmp (cold caches: see _draft_of)
            return ids[:L].tobytes() == self._ids[:L].tobytes()
        return np.array_equal(ids[:L], self._ids[:L])

    def _store(self, ids: np.ndarray, start: int, n: int) -> None:
        if self._ids.shape[0] < n:
            grown = np.zeros(max(n, 2 * self._ids.shape[0]), np.intc)
            grown[:start] = self._ids[:start]
            self._ids = grown
        self._ids[start:n] = ids[start:n]
        self._length = n

    def _start(self, ids: np.ndarray, n: int) -> None:
        """A new sequence: the prompt is every token but the one just sampled, then that token."""
        self.finish()
        cut = n - 1 if n > 1 else n
        self._session = self.proposer.start(ids[:cut], filter=self.filter)
        self._store(ids, 0, cut)
        self.stats["sessions"] += 1
        if n > cut:
            self._feed(ids, n)

    def _feed(self, ids: np.ndarray, n: int) -> None:
        L = self._length
        self._session.extend(ids[L:n])  # validated there (as_tokens: int32, in range)
        self._store(ids, L, n)

    def _draft_of(self, tree: DraftTree, limit: int) -> np.ndarray:
        """The best root path of `tree` of the length that pays most for one evaluation's cost.
        Every call runs right after llama.cpp's evaluation has flushed the caches, where each numpy
        call costs tens of microseconds: the buffers are the drafter's own, reused across calls."""
        count = len(tree)
        if count == 0 or limit <= 0:
            return _EMPTY.copy()
        buf = self._buf
        buf.counts[0] = count
        buf.limits[0] = limit
        path_values(tree.tokens, tree.parents, tree.depths, tree.scores, buf.starts, buf.counts, buf.limits,
                    _NO_VOCAB, buf.values, buf.nodes)
        values = buf.values[0].tolist()
        length = self._best_length(values)
        if self._explore:
            length = self._explored(values, length)
        if length == 0:
            return _EMPTY.copy()
        draft = np.empty(length, np.intc)  # the root path ending at its best node, walked backwards
        node, tokens, parents = int(buf.nodes[0, length]), tree.tokens, tree.parents
        for j in range(length - 1, -1, -1):
            draft[j] = tokens[node]
            node = parents[node]
        return draft

    def _best_length(self, values: list[float]) -> int:
        """`plan_lengths` for one row: the first length maximising (1 + expected tokens) / the cost
        of an evaluation of 1 + length tokens (`values[L]`, -inf where no path is that long)."""
        costs = np.asarray(self.cost(self._evaluated, 1), np.float64).tolist()
        best, length = -np.inf, 0
        for L, v in enumerate(values):
            if v != -np.inf and v == v:
                gain = (1.0 + v) / costs[L]
                if gain > best:
                    best, length = gain, L
        return length

    def _explored(self, values: list[float], chosen: int) -> int:
        """`chosen`, or now and then the longest path expected to yield a token when the line refuses
        it: every `_explore` such steps, the interval doubling while long drafts keep not paying."""
        longest = 0
        for L, v in enumerate(values):  # -inf and nan compare false
            if v >= 1.0:
                longest = L
        if longest <= chosen:
            self._since_long = 0
            if chosen > 0:
                self._explore = EXPLORE
            return chosen
        self._since_long += 1
        if self._since_long < self._explore:
            return chosen
        self._since_long = 0
        self._explore = min(2 * self._explore, EXPLORE_MAX)
        self.stats["explored"] += 1
        return longest


def draft_model_class(base: type) -> type:
    """`SuffixSpecDraftModel` over `base` (llama_cpp's `LlamaDraftModel`, or a stand-in)."""
    return type("SuffixSpecDraftModel", (LlamaDrafter, base), {
        "__module__": __name__,
        "__doc__": "llama-cpp-python draft model over suffixspec's proposer (`suffixspec.integrations.llama_cpp`).",
    })


def __getattr__(name: str):
    if name == "SuffixSpecDraftModel":
        from llama_cpp.llama_speculative import LlamaDraftModel

        cls = globals()["SuffixSpecDraftModel"] = draft_model_class(LlamaDraftModel)
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
