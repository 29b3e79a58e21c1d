"""`DraftCore`: the state both vLLM front ends share (sessions tracked by content, the proposer and
its response cache, the step's measured cost) and the one batched step that drafts for a batch.

Contract:
- front ends (`vllm.py` for vLLM <= 0.33, `vllm_speculator.py` for >= 0.34) call
  `step(keys, sampled, lengths, table)`: per row a `key` (where the engine keeps the request), how many
  tokens it sampled this step (0: it drafts nothing) and its valid tokens `table[row, :lengths[row]]`;
- requests are tracked by content: a row continues the session its key held last step when it still
  holds that session's head and tail at the same length; otherwise its prefix hashes (additive,
  random per position) are compared with every live session's in one vectorised step and the longest
  session it extends continues, else a new session starts; a session goes to at most one row a step;
- sessions unseen for `timeout` steps, or the least recently seen beyond `max_sessions`, are closed
  (never on one step's absence; `finish(key)` closes one at once); a closed session's output joins
  the response cache on a background thread (`close_in_background`; `flush()` waits). `timeout` is
  the `session_timeout_steps` option where given, else it follows the engine: 2 steps (a request
  gone for two steps has most likely finished, and its output then serves the requests after it),
  raised to twice the longest absence a request was seen to come back from (a session, live or
  closed on a timeout, reappearing with no more than the step's sampled tokens added: a new turn
  extending a conversation adds more), at most `MAX_TIMEOUT_STEPS`;
- memory is bounded by `max_sessions` sessions of at most `max_session_tokens` tokens, the cache's
  `cache_tokens` and one hash table of `max_model_len` entries;
- each step is one `Proposer.propose_batch` call, then one linear draft per row chosen over the whole
  batch by expected accepted tokens per unit of the step's measured cost (the time between two
  `step` calls; steps where a row prefilled, joined, left or skipped are not measured); a request's
  expected accepted tokens are its tree's scores times its trust to the depth (`trust_factors` over
  what its verified drafts promised and got, each older draft counting `TRUST_MEMORY` as much)."""

from __future__ import annotations

import collections
import logging
import math
import threading
import time

import numpy as np

from .. import BadInputError, CorpusIndex, DraftTree, Proposer
from ..draft.config import KNOBS, ProposerConfig
from ..engine.warmup import warm_kernels
from .vllm_drafting import path_values, plan_lengths, step_cost_from, trust_factors, write_paths
from .vllm_options import VllmSetup

CHECK_TOKENS = 16  # head and tail tokens compared on the fast path
MAX_TIMEOUT_STEPS = 64  # the adaptive session timeout's ceiling
RECENT_CLOSED = 64  # sessions closed on a timeout remembered, to notice a request coming back
TRUST_MEMORY = 0.5  # per verified draft: how much of a request's record the next draft keeps

_M64 = np.uint64
log = logging.getLogger(__name__)


def _knobs(opts: dict, k: int) -> dict:
    """The proposer's knobs among `opts`, with the adapter's defaults (`KNOB_DEFAULTS`) where absent."""
    knobs = {name: opts[name] for name in KNOBS if name in opts}
    knobs["max_nodes"] = opts.get("max_nodes", max(16, 4 * k))
    knobs["max_depth"] = min(int(opts.get("max_depth", k) or k), k)
    knobs["min_prob"] = opts.get("min_prob", 0.0)
    knobs.setdefault("recency", 0.0)  # linear drafts: frequency alone (fewer steps on code-edit traces than 0.5)
    return knobs


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
    __slots__ = ("session", "slot", "key", "length", "head", "tail", "last_step", "last_draft",
                 "drafted", "last_scores", "promised", "accepted")


class DraftCore:
    """Sessions, proposer and step cost shared by the vLLM front ends (see the module docstring).

    `stats` counts steps, sessions started / refound (rows that moved, skipped steps or resumed) /
    closed / evicted / finished, rows drafted, draft tokens, measured steps and the seconds spent in
    `step`. `clock()` gives those seconds (the perf counter; a replay sets a simulated clock)."""

    def __init__(self, setup: VllmSetup):
        opts = setup.options
        self.k = setup.k
        self.max_model_len = setup.max_model_len
        self.vocab_size = setup.vocab_size
        self.options = opts
        self.max_sessions = int(opts.get("max_sessions", max(256, 4 * setup.max_num_seqs)))
        given = opts.get("session_timeout_steps")
        self.adaptive_timeout = given is None
        self.timeout_steps = MAX_TIMEOUT_STEPS if given is None else int(given)  # the fixed timeout, or the ceiling
        if self.max_sessions < 1:
            raise BadInputError(f"max_sessions: expected a positive integer, got {self.max_sessions}", param="max_sessions")
        if self.timeout_steps < 2:
            raise BadInputError(f"session_timeout_steps: expected an integer >= 2, got {self.timeout_steps}", param="session_timeout_steps")
        self.cost = step_cost_from(opts.get("step_cost"), self.k)
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
        self.clock = time.perf_counter  # seconds at each step's start and end (the step's cost is their spacing)
        self.scores: list[list[float]] = []  # the last step's drafts' node scores, per row
        self._warm_up()
        self.proposer = Proposer(self.corpora or None, config=self.config)
        self._reset_tracking()

    # -- the step --------------------------------------------------------------------------
    def step(self, keys, sampled, lengths, table, limit_len: int | None = None, k: int | None = None,
             fixed_width: bool = False) -> list[list[int]]:
        """One draft (a list of Python ints, possibly empty) per row: row r, held at `keys[r]`, sampled
        `sampled[r]` tokens this step and holds `table[r, :lengths[r]]`; no draft is longer than `k`
        (default: the configured draft length) or reaches `limit_len` tokens (default: the model's
        length). `fixed_width`: the engine verifies k tokens a row whatever the draft, so every row
        takes its best path up to k (no cost cut). `scores` holds each row's draft's node scores."""
        n_rows = len(keys)
        drafts: list[list[int]] = [[] for _ in range(n_rows)]
        self.scores: list[list[float]] = [[] for _ in range(n_rows)]
        if n_rows == 0:
            return drafts
        k = min(int(k or self.k), self.k)
        t0 = self.clock()
        self._step += 1
        step = self._step
        self.stats["steps"] += 1
        limit_len = limit_len or self.max_model_len or table.shape[1]
        rows, tracked, limits = [], [], []
        taken = set()
        clean, verified = True, 0  # whether this step's cost is known, and its tokens
        for r in range(n_rows):
            m, n = int(sampled[r]), int(lengths[r])
            if m <= 0 or n <= 0 or n > table.shape[1]:
                clean = False
                continue
            t, how = self._track(keys[r], table[r], n, m, taken)
            clean &= how == "continued" and t.last_step == step - 1
            verified += 1 + t.last_draft
            if how != "started" and t.last_step == step - 1 and t.drafted:
                # the draft verified this step: what it promised, what it got (older drafts count less)
                t.promised = TRUST_MEMORY * t.promised + t.last_scores
                t.accepted = TRUST_MEMORY * t.accepted + min(m - 1, t.drafted)
            t.last_step = step
            t.last_draft = t.drafted = 0
            room = min(k, limit_len - n - 1)
            if room > 0:
                rows.append(r)
                tracked.append(t)
                limits.append(room)
        self._expire(step)
        if clean and self._last_end is not None and self._ended_step == step - 1:
            self.cost.observe(verified, t0 - self._last_end, len(taken))
            self.stats["steps_measured"] += 1
        if tracked:
            self._draft(rows, tracked, limits, drafts, n_rows, k if fixed_width else None)
        end = self.clock()
        self.stats["propose_seconds"] += end - t0
        self._last_end, self._ended_step = end, step
        return drafts

    @property
    def live_sessions(self) -> int:
        return len(self._lru)

    @property
    def timeout(self) -> int:
        """Steps a session may go unseen before it is closed (the module docstring says how it is set)."""
        if not self.adaptive_timeout:
            return self.timeout_steps
        return min(self.timeout_steps, max(2, 2 * (self._longest_absence + 1)))

    def _came_back(self, absent: int) -> None:
        """A request came back after `absent` steps away: the timeout must outlast such absences."""
        if absent > self._longest_absence:
            self._longest_absence = absent
            self.stats["session_timeout"] = self.timeout

    def forget(self, key) -> None:
        """The engine put a new request at `key`: the session it held there is no longer there (it
        stays live: a preempted request resumes elsewhere and is found by content)."""
        t = self._by_key.pop(key, None)
        if t is not None and t.key == key:
            t.key = None

    def finish(self, key) -> None:
        """The request at `key` finished: close its session now (its output joins the cache)."""
        t = self._by_key.pop(key, None)
        if t is not None and t.session is not None and t.key == key:
            self._close(t)
            self.stats["sessions_finished"] += 1

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
        self._by_key: dict = {}  # the engine's key -> the session it held last step
        self._last_end: float | None = None  # when the last step ended, and its number
        self._ended_step = 0
        self._rng = np.random.default_rng(0x5AFF15)
        self._rand = np.zeros(0, _M64)
        self._longest_absence = 0  # steps: the longest absence a request was seen to come back from
        # sessions closed on a timeout, newest last: length, hash of their tokens, last step seen
        self._closed: collections.deque = collections.deque(maxlen=RECENT_CLOSED)

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
        prefix = self._prefix_hashes(row, n)
        hit = cand[prefix[lens[cand]] == self._slot_hash[cand]]
        best = None
        for slot in hit[np.argsort(-lens[hit], kind="stable")].tolist():
            if slot not in taken:
                t = self._slots[slot]
                if self._continues(t, row, n):  # guards against a hash collision
                    best = t
                    break
        return best

    def _prefix_hashes(self, row: np.ndarray, n: int) -> np.ndarray:
        """uint64[n + 1]: [i] is the hash of row[:i]."""
        prefix = np.empty(n + 1, _M64)
        prefix[0] = 0
        w = self._weights(n)[:n]
        np.cumsum((row[:n].astype(_M64) + _M64(1)) * w, out=prefix[1:])
        return prefix

    def _closed_too_soon(self, row: np.ndarray, n: int, m: int) -> None:
        """A new row of `m` sampled tokens: when it holds a session closed on a timeout plus no more than
        those tokens, that request came back (a new turn extending a conversation adds more)."""
        if not self._closed:
            return
        prefix = self._prefix_hashes(row, n)
        for i in range(len(self._closed) - 1, -1, -1):
            length, h, last = self._closed[i]
            if n - m <= length <= n and prefix[length] == h:
                del self._closed[i]
                self.stats["sessions_closed_too_soon"] += 1
                self._came_back(self._step - last - 1)
                return

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
        t.key = None
        t.last_draft = t.drafted = 0
        t.last_scores = np.zeros(self.k)
        t.promised = np.zeros(self.k)
        t.accepted = 0.0
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
        if t.key is not None and self._by_key.get(t.key) is t:
            del self._by_key[t.key]
        t.key = None
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
            if step - t.last_step < self.timeout:
                break
            if self.adaptive_timeout:
                self._closed.append((t.length, self._slot_hash[slot], t.last_step))
            self._close(t)



    def _track(self, key, row: np.ndarray, n: int, m: int, taken: set):
        """The session row `row[:n]` (held at `key`, `m` tokens sampled) continues, extended to n
        tokens, and how it was found: "continued", "refound" or "started"."""
        t = self._by_key.get(key)
        how = "continued"
        if t is None or t.session is None or t.slot in taken or not self._continues(t, row, n):
            how = "refound"
            t = self._find(row, n, taken)
            if t is None:
                how = "started"
                if self.adaptive_timeout:
                    self._closed_too_soon(row, n, m)
                t = self._start(row, n, m)
        self.stats["sessions_" + how] += how != "continued"
        if how != "started" and t.last_step < self._step - 1 and n - t.length <= m:
            self._came_back(self._step - t.last_step - 1)  # away, and back with no more than this step's tokens
        if n > t.length:
            self._extend(t, row, n)
        if t.key is not None and t.key != key and self._by_key.get(t.key) is t:
            del self._by_key[t.key]  # the request moved: its old key no longer holds it
        t.key = key
        self._by_key[key] = t
        self._lru.move_to_end(t.slot)
        taken.add(t.slot)
        return t, how

    # -- drafting --------------------------------------------------------------------------
    def _draft(self, rows, tracked, limits, drafts, n_rows: int, width: int | None) -> None:
        trees = self.proposer.propose_batch([t.session for t in tracked], self.max_nodes)
        trust = trust_factors(np.array([t.promised for t in tracked]), np.array([t.accepted for t in tracked]))
        out_tok, out_score, lengths = self.linear_drafts(trees, limits, n_rows, fixed=width is not None, trust=trust)
        for i in np.flatnonzero(lengths).tolist():
            drafts[rows[i]] = out_tok[i, : lengths[i]].tolist()
            self.scores[rows[i]] = out_score[i, : lengths[i]].tolist()
        for i, t in enumerate(tracked):
            t.last_draft = int(lengths[i]) if width is None else width
            t.drafted = int(lengths[i])
            t.last_scores = out_score[i]
        self.stats["expected_accepted"] += float(out_score.sum())
        self.stats["rows_drafted"] += int(np.count_nonzero(lengths))
        self.stats["draft_tokens"] += int(lengths.sum())

    def linear_drafts(self, trees, limits, batch: int, fixed: bool = False, trust=None):
        """(tokens [b, k], scores [b, k], lengths [b]): each tree's linear draft, paths and lengths
        chosen together by expected accepted tokens per unit of the cost of a step of `batch` rows
        (`vllm_drafting`); `fixed`: a step costs the same whatever the drafts (the best path each).
        `trust` [b]: each row's node scores are planned as score * trust ** depth (`trust_factors`);
        scores are returned as the trees give them."""
        b = len(trees)
        counts = np.array([len(tr) for tr in trees], np.int64)
        starts = np.zeros(b, np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        out_tok = np.zeros((b, self.k), np.int64)
        out_score = np.zeros((b, self.k), np.float64)
        lengths = np.zeros(b, np.int64)
        if not int(counts.sum()):
            return out_tok, out_score, lengths
        cat = [np.concatenate([getattr(tr, f) for tr in trees]) for f in ("tokens", "parents", "depths", "scores")]
        raw = cat[3]
        if trust is not None:
            cat[3] = raw * np.repeat(np.asarray(trust, np.float64), counts) ** cat[2]
        values = np.empty((b, self.k + 1), np.float64)
        nodes = np.empty((b, self.k + 1), np.int64)
        path_values(cat[0], cat[1], cat[2], cat[3], starts, counts, np.array(limits, np.int64), self.vocab_size, values, nodes)
        # rows outside the drafting set (prefills) still take a token each in the step
        extra = batch - b
        if fixed:
            lengths = plan_lengths(values, lambda tokens: 1.0 + 1e-9 * np.asarray(tokens, np.float64))
        else:
            lengths = plan_lengths(values, lambda tokens: self.cost(np.asarray(tokens) + extra, batch))
        write_paths(cat[0], cat[1], starts, nodes, lengths, out_tok, out_score, raw)
        return out_tok, out_score, lengths

    def _warm_up(self) -> None:
        """Compile and run every kernel a step uses: the proposer's on a throwaway proposer of the same
        knobs (`warm_kernels`), then the adapter's own."""
        warm_kernels(self.corpora or None, filter=self.filter, config=self.config)
        self.linear_drafts([DraftTree.from_paths([[1, 2], [1, 3]]), DraftTree.empty()], [self.k, self.k], 2)
        if not math.isfinite(float(np.asarray(self.cost(1, 1))[()])):
            raise BadInputError("step_cost: the cost of a one-token step is not finite", param="step_cost")
