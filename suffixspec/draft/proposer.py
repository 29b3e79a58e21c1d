"""`Proposer`: turns the longest matches of every source into a `DraftTree`, for many sessions.

Sources, each giving the longest suffix of the request's context it contains:

- the request itself (prompt + committed output), in its `session.Session`'s own automaton;
- past responses: `ResponseCache` (`response_cache.py`), closed sessions' outputs as whole
  documents in rotating generations of frozen automata, rebuilt on the closing request's time or
  the upkeep thread's (`upkeep.py`), never on a proposal's;
- corpora: any number of frozen automata or corpus indexes (`sources.py`).

Contract:

* The tree is grown best-first over every source at once (`_kernels/draft.py` for the scores): the
  `budget` most probable paths of the union of the sources' continuations, a path proposed by
  several sources scoring its best.
* Calls: a session hands the kernel the addresses of one int64 frame (its automaton's live frame,
  its cursors, the sources' table, the knobs) and of its thread's workspace frame. Trees are views
  of the thread's output arena (256 trees of the budget up to ARENA_NODES, at least 64; replaced
  when full; alive while any of its trees is). The knobs are fixed at construction (`params` is read-only).
* Threads: different sessions may propose concurrently (`propose` runs one nogil kernel call over
  the session's own automaton and immutable snapshots of the shared sources; the cache has its own
  lock). The learned counts and the sibling calibration are shared by the sessions and updated
  without a lock: concurrent extensions may lose an increment (`learn=False`: sessions are
  independent). `propose_batch` proposes every session in one kernel call; batches of one
  proposer are serialised, and a session may appear once per batch.
* `threads` = 1 (the default): the batch kernel is a plain loop, never touching the OpenMP runtime
  torch uses. More threads: a prange over sessions, parallel launches serialised process-wide, on
  numba's workqueue pool unless the process chose a threading layer.
"""

from __future__ import annotations

import os
import sys
import threading

import numba
import numpy as np

from .._kernels import draft as dk
from .._kernels import frozen as fk
from .._kernels import learn as lk
from .._kernels import propose as pk
from .._kernels import sam as sk
from .._kernels.address import address
from ..errors import BadInputError, BadInputTypeError
from ..tokenids import as_tokens
from .automaton import FrozenAutomaton, SuffixAutomaton
from .config import ProposerConfig
from .response_cache import ResponseCache
from .session import SRC_CORPUS, SRC_OTHER, Session
from .sources import Sources, corpus_sources
from .tree import DraftTree
from .upkeep import CacheUpkeep

_PARALLEL_LAUNCH = threading.Lock()
ARENA_NODES = 1 << 17  # an arena holds 256 trees of the budget up to this many nodes (40 bytes each)
_EMPTY = DraftTree.empty()


def _prefer_workqueue() -> None:
    """Before numba's first parallel launch, pick its own workqueue pool over its OpenMP layer:
    torch shares that OpenMP runtime, and a numba OpenMP region slows torch's passes after it.
    An explicit NUMBA_THREADING_LAYER is respected."""
    from numba.np.ufunc import parallel

    if (not getattr(parallel, "_is_initialized", False) and "NUMBA_THREADING_LAYER" not in os.environ
            and numba.config.THREADING_LAYER == "default"):
        numba.config.THREADING_LAYER = "workqueue"


class _LiveSlots:
    """The live automata (S, E, L, M) of sessions proposed in batches, in a numba typed list
    indexed by slot. Guarded by the proposer's batch lock; a slot is re-registered when its
    automaton reallocated an array, and holds tiny placeholders once its session closed."""

    def __init__(self):
        self.arrays = pk.new_live_list()
        self._blank = (np.zeros((1, sk.STATE_COLS), np.int32), np.zeros((1, 4), np.int32),
                       np.zeros((1, 5), np.int32), np.zeros(sk.META, np.int64))
        self._free: list[int] = []

    def register(self, slot: int, sam: SuffixAutomaton) -> int:
        if slot < 0:
            if self._free:
                slot = self._free.pop()
            else:
                slot = len(self.arrays)
                pk.list_append(self.arrays, self._blank)
        pk.list_set(self.arrays, slot, (sam._S, sam._E, sam._L, sam._M))
        return slot

    def release(self, slot: int) -> None:
        pk.list_set(self.arrays, slot, self._blank)
        self._free.append(slot)


class _Arena:
    """An output arena (see `pk.set_arena`): its two arrays, their addresses and the blocks trees
    are views of; `baseline`: the reference counts of the arrays, the blocks and their tuple while
    nothing but this holds them (a tree's arrays are views of the arrays; a session's judged tree
    holds the tuple)."""

    __slots__ = ("i32", "f64", "addrs", "cap", "blocks", "baseline")

    def __init__(self, cap: int):
        # every page written now, not by a proposal's first writes
        self.i32, self.f64 = np.empty(4 * cap, np.int32), np.empty(3 * cap, np.float64)
        self.i32.fill(0)
        self.f64.fill(0.0)
        self.addrs = (address(self.i32, np.int32), address(self.f64, np.float64))
        self.cap = cap
        i32, f64 = self.i32, self.f64
        # tokens, parents, depths, scores, shares, groups, steps
        self.blocks = (i32[:cap], i32[cap : 2 * cap], i32[2 * cap : 3 * cap], f64[:cap], f64[cap : 2 * cap], i32[3 * cap :],
                       f64[2 * cap :])
        del i32, f64
        self.baseline = self._counts()

    def _counts(self) -> tuple:
        blocks = self.blocks
        return (sys.getrefcount(self.i32), sys.getrefcount(self.f64), sys.getrefcount(blocks)) + tuple(
            map(sys.getrefcount, blocks))

    def free(self) -> bool:
        """Whether nothing but this arena holds its arrays or blocks (no tree is alive)."""
        return self._counts() == self.baseline


class _Workspace:
    """One thread's kernel scratch (`dk.workspace_buffers`) and output arena (`pk.set_arena`),
    named by the int64 frame at `addr`; `blocks` are the current arena's (`tokens`, `parents`,
    `depths`, `scores`, which trees are views of, first; then each node's share, group and step,
    read by `learn.count_tree` through the session's judged tree). An arena is replaced when full (`new_arena`) and lives
    while any of its trees does. Two arenas take turns (`arena`, `spare`): made with the
    workspace (their pages written then, not by a proposal), the spare taken again once no tree
    views it, else replaced by a new one; a turn writes the frame's four arena fields."""

    __slots__ = ("budget", "n_sources", "buffers", "frame", "addr", "blocks", "tokens", "parents", "depths", "scores",
                 "arena", "spare")

    def __init__(self, budget: int, n_sources: int, max_children: int):
        self.budget, self.n_sources = budget, n_sources
        self.buffers = dk.workspace_buffers(budget, max_children, n_sources)
        self.frame = dk.workspace_frame(*self.buffers)
        self.addr = address(self.frame, np.int64)
        # a replacement runs cold code on a proposal's time: rare enough to stay out of the p99
        cap = max(4096, min(256 * budget, ARENA_NODES), 64 * budget)
        self.arena = None
        self.spare = _Arena(cap)
        self.new_arena()  # takes that spare as the first arena
        self.spare = _Arena(cap)

    def new_arena(self) -> None:
        """Another arena of the same size: the spare when no tree
        views it any more, else a new one."""
        spare = self.spare
        nxt = spare if spare is not None and spare.free() else _Arena(self.arena.cap)
        self.spare, self.arena = self.arena, nxt
        frame = self.frame
        frame[dk.WS_OUT_I32], frame[dk.WS_OUT_F64] = nxt.addrs
        frame[dk.WS_OUT_CAP], frame[dk.WS_OUT_OFF] = nxt.cap, 0
        self.blocks = nxt.blocks
        self.tokens, self.parents, self.depths, self.scores = nxt.blocks[:4]  # a tree's arrays (hot path)


class Proposer:
    """Draft-tree proposer over the request, past responses and corpora.

    `corpus`: frozen automata or corpus indexes (`sources.corpus_sources`). The knobs are a
    `ProposerConfig` (`config`), or its fields as keyword arguments on top of it
    (`Proposer(max_depth=8)`); each field documents its knob. `config` keeps them, fixed for the
    proposer's life.

    Learning (`learn`, on by default): every committed token counts, per source class (the
    request, past responses, corpora) and matched-length bucket, whether that source's match
    continued; the confidence of a draft step is learned from those counts instead of
    L / (L + match_prior): the session's own counts shrunk toward the proposer's (weight
    `session_strength`), those toward the prior (weight `prior_strength`). See `_kernels/learn.py`.
    `learned()` returns the proposer's counts. Every committed token also judges the tree proposed
    before it: per sibling rank and step share, how many drafts were accepted against how many the
    shares expected; a node's step is multiplied by the learned ratio (never above 1, shrunk toward
    1 by `calibration_strength`), so that alternatives to a better sibling are weighed by what they
    were seen to be worth (`calibration()`; see `_kernels/draft.py`). The same judgement, per group
    of the corpus part that drafted a node (at the root: how many parts proposed its token; below
    it: one group per match level kind), gives a second factor, never above 1
    (`group_calibration()`): a stale corpus's lone guess at the next token is weighed by how often
    such guesses were accepted. `match_levels` defaults to 3: each source also drafts from its next
    shorter matches, which see more occurrences (a stale corpus's longest match often diverges
    where a shorter one continues).

    Cache upkeep (`cache_upkeep`): "inline" adds a closed session's output to the cache inside
    `close`; "background" queues it for one upkeep thread (`upkeep.py`), so a merge or a rotation
    of the cache never stalls the closing caller, e.g. a server's round; `wait_cache()` waits for
    what was queued.
    """

    def __init__(self, corpus=None, *, config: ProposerConfig | None = None, **knobs):
        cfg = self.config = ProposerConfig.of(config, knobs)
        self.learn = cfg.learn
        self._learned = lk.new_stats()  # the proposer's counts over every request (lk)
        self._calibration = lk.new_calibration()  # the proposer's judged drafts, by rank and share (lk)
        self._group_cal = lk.new_group_calibration()  # ... and by the group of the part that drafted them (lk)
        # judged draft nodes by source: [SRC_CORPUS, SRC_OTHER] x [drafted, accepted] (`source_tokens`)
        self._source_tokens = np.zeros((2, 2), np.int64)
        self.max_nodes = cfg.max_nodes
        self._min_match = cfg.min_match
        self.max_session_tokens = cfg.max_session_tokens
        self.resync_tokens = cfg.resync_tokens
        self.threads = cfg.threads
        self.vocab_size = cfg.vocab_size
        self._match_levels = cfg.match_levels
        self._recover = cfg.recover
        self.params = _kernel_params(cfg)  # read-only: sessions' kernel frames name this array
        self.corpora = corpus_sources(corpus)
        # every frozen automaton of the corpora, with the corpus entry it belongs to
        self._static: list[FrozenAutomaton] = []
        self._static_owner: list[int] = []
        for i, c in enumerate(self.corpora):
            fas = [c] if isinstance(c, FrozenAutomaton) else [shard.fa for shard in c.shards]
            self._static.extend(fas)
            self._static_owner.extend([i] * len(fas))
        self._null = _NoCache()  # the version holder of sessions while there is no cache
        self._cache: ResponseCache | None = None
        self.cache = ResponseCache(cfg.cache_tokens, cfg.cache_generations) if cfg.global_cache else None
        self._sources: Sources | None = None
        self._tops: dict = {}  # id(frozen automaton) -> (it, its fk.top_children or None)
        for fa in self._static:
            self._tops_of(fa)
            fa.edge_records()  # a shard's are mapped; an in-memory automaton's are built here, not on a first request
        self._sources_lock = threading.Lock()
        self._batch_lock = threading.Lock()
        self._slots = _LiveSlots()
        self._local = threading.local()  # per-thread scratch arrays for the kernels
        self._upkeep = CacheUpkeep(self._current_sources) if cfg.cache_upkeep == "background" else None

    @property
    def cache(self) -> ResponseCache | None:
        """The cache of past responses (None: no learning across sessions). Assignable, e.g. to
        a `ResponseCache.load`ed one: open sessions resync to it on their next call."""
        return self._cache

    @cache.setter
    def cache(self, value) -> None:
        if value is not None and not isinstance(value, ResponseCache):
            raise BadInputTypeError(f"cache: expected a ResponseCache or None, got {type(value).__name__}", param="cache")
        old = self._version_holder()
        self._cache = value
        old._touch()  # sessions compare versions with the holder they were built with: send them to resync

    def _keep(self, cache: ResponseCache, outputs: list[list[int]]) -> None:
        """Closed sessions' outputs join `cache`: at once (the closing caller's time, one add and
        one new snapshot of the sources for them all), or queued for the upkeep thread
        (`cache_upkeep="background"`)."""
        if self._upkeep is not None:
            self._upkeep.submit_many(cache, outputs)
            return
        cache.add_many(outputs)
        self._current_sources()  # the new snapshot's arrays, on this request's time

    def close_sessions(self, sessions) -> None:
        """Close every session of `sessions` (`Session.close`), their outputs joining the cache
        of past responses together: one cache add for them all, not one per session."""
        outputs = [session._finish() for session in sessions]
        cache = self.cache
        outputs = [out for out in outputs if out]
        if cache is not None and outputs:
            self._keep(cache, outputs)

    def wait_cache(self, timeout: float | None = None) -> bool:
        """Wait until every output of a session closed before this call is in the cache (at once
        with inline upkeep); False when `timeout` seconds passed first."""
        return True if self._upkeep is None else self._upkeep.wait(timeout)

    @property
    def cache_upkeep_failures(self) -> int:
        """Outputs the upkeep thread could not add (each logged with its error)."""
        return 0 if self._upkeep is None else self._upkeep.failures

    def source_tokens(self) -> dict[str, dict[str, int]]:
        """Draft nodes by the source that drafted them, counted only with corpora: {"corpus": ...,
        "other": ... (the request's own text and past responses)}, each {"drafted", "accepted"}.
        A tree counts when the tokens committed after it judge it (`Session.extend`); trees of
        document-filtered requests are not counted (their merge keeps no node's origin). Updated
        without a lock, like the learned counts."""
        t = self._source_tokens.tolist()
        return {name: {"drafted": t[row][0], "accepted": t[row][1]}
                for name, row in (("corpus", SRC_CORPUS), ("other", SRC_OTHER))}

    def learned(self) -> np.ndarray:
        """A copy of the proposer's learned counts, float64 [classes, length buckets, (hits, trials)]
        (`_kernels/learn.py`)."""
        return self._learned.copy()

    def calibration(self) -> np.ndarray:
        """A copy of the proposer's sibling calibration, float64 [ranks, share buckets, (hits,
        expected, trials)] (`_kernels/learn.py`)."""
        return self._calibration.copy()

    def group_calibration(self) -> np.ndarray:
        """A copy of the proposer's source calibration, float64 [groups, (hits, expected, trials)]
        (`_kernels/learn.py`: a group is a source class and, at the root, how many parts agreed)."""
        return self._group_cal.copy()

    def _version_holder(self):
        return self._cache if self._cache is not None else self._null

    # knobs the sessions' kernel frames copy: fixed at construction, like `params`
    @property
    def min_match(self) -> int:
        return self._min_match

    @property
    def match_levels(self) -> int:
        return self._match_levels

    @property
    def min_prob(self) -> float:
        return float(self.params[dk.P_MIN_PROB])

    def _workspace(self, budget: int, n_sources: int) -> _Workspace:
        """This thread's workspace, grown to fit `budget` nodes from `n_sources` parts."""
        ws = getattr(self._local, "ws", None)
        if ws is None or ws.budget < budget or ws.n_sources < n_sources:
            if ws is not None:  # grow, never shrink, either dimension
                budget, n_sources = max(budget, ws.budget), max(n_sources, ws.n_sources)
            ws = self._local.ws = _Workspace(max(budget, 64), max(n_sources, 4), int(self.params[dk.P_MAX_CHILDREN]))
        return ws

    def _tops_of(self, fa: FrozenAutomaton):
        """(row_of, `fk.top_rows`) of `fk.top_children` of `fa` for this proposer's `max_children`,
        kept while `fa` is a source (built once per automaton: the corpora's at construction, a new
        cache snapshot's on the closing request's time)."""
        got = self._tops.get(id(fa))
        if got is not None and got[0] is fa:
            return got[1]
        offsets, etok, eto, counts, lasts, _links, _lens = fa.kernel_arrays()
        width = int(self.params[dk.P_MAX_CHILDREN]) + 1
        tops = None
        if width <= dk.CHILD_BUF:
            row_of, top_edges, totals = fk.top_children(offsets, etok, eto, counts, fa.count_escapes, lasts, fa.plink.shape[0],
                                                        width, fk.top_min_children(width))
            tops = (row_of, fk.top_rows(top_edges, totals, fa.edge_records(), width))
        self._tops[id(fa)] = (fa, tops)
        return tops

    def _current_sources(self) -> Sources:
        src = self._sources
        version = self._version_holder()._version  # an int read: no lock needed
        if src is not None and src.version == version:
            return src
        if not self._sources_lock.acquire(blocking=src is None):
            return src  # another thread (the upkeep's) builds the new snapshot: read the last one meanwhile
        try:
            cache = self._cache
            if cache is not None:
                version, cached = cache.sources()
            else:
                version, cached = self._null._version, []
            if self._sources is None or self._sources.version != version:
                live = {id(fa) for fa in self._static} | {id(fa) for _, fa in cached}
                self._tops = {k: v for k, v in self._tops.items() if k in live}  # forget dropped snapshots'
                self._sources = Sources(self._static, version, cached, self._tops_of)
            return self._sources
        finally:
            self._sources_lock.release()

    def start(self, prompt_ids, request_id=None, filter=None) -> Session:
        """Open a session. `filter` restricts every corpus index to some documents: a dict of
        tags (`{"repo": "click"}`), a pyroaring BitMap of document indexes, or a Subset."""
        if filter is not None and not any(not isinstance(c, FrozenAutomaton) for c in self.corpora):
            raise BadInputError("filter: document filters need a corpus index (none was given)", param="filter")
        return Session(self, self._tokens(prompt_ids, "prompt_ids"), request_id, filter)

    def _tokens(self, ids, name: str) -> np.ndarray:
        """`as_tokens`, then ids < `vocab_size` when the proposer has one (BadInputError naming
        `name`, the range and the first id outside it)."""
        toks = as_tokens(ids, name)
        vocab = self.vocab_size
        if vocab is not None and toks.shape[0] and int(toks.max()) >= vocab:
            i = int(np.argmax(toks >= vocab))
            raise BadInputError(f"{name}: expected token ids in [0, {vocab - 1}] (vocab_size {vocab}), "
                                f"got {int(toks[i])} at index {i}")
        return toks

    def propose_batch(self, sessions, budgets=None) -> list[DraftTree]:
        """One tree per session, in one call of the batch kernel (on `threads` threads) for every
        session without document-restricted corpora; those go one by one. A session may appear at
        most once. Batches from several threads are serialised (the kernel itself is parallel)."""
        if budgets is None or isinstance(budgets, (int, np.integer)):
            budgets = [budgets] * len(sessions)
        if len(budgets) != len(sessions):
            raise BadInputError(f"budgets: expected one per session ({len(sessions)}), got {len(budgets)}", param="budgets")
        if len({id(s) for s in sessions}) != len(sessions):
            raise BadInputError("propose_batch: a session appears more than once")
        for s in sessions:
            if s.proposer is not self:
                raise BadInputError("propose_batch: a session of another proposer")
        trees: list[DraftTree | None] = [None] * len(sessions)
        src = self._current_sources()
        fast, fast_budgets, slots, slow = [], [], [], []
        held = []  # session locks, taken under the batch lock (never the other way round)
        with self._batch_lock:  # guards the live slots until the kernel has read them
            try:
                for i, (s, b) in enumerate(zip(sessions, budgets)):
                    s._guard.acquire()
                    held.append(s._guard)
                    b = self.max_nodes if b is None else int(b)
                    if b <= 0 or s._closed:
                        trees[i] = DraftTree.empty()
                        continue
                    if s._restricted:
                        slow.append((i, b))
                        continue
                    if s._src is not src:
                        s._sync(src)
                    sam = s._sam
                    if sam._mode != sk.MODE_ONLINE:
                        sam._start_online()
                    reg = s._registered
                    if reg is None or reg[0] is not sam._S or reg[1] is not sam._E or reg[2] is not sam._L or reg[3] is not sam._M:
                        s._slot = self._slots.register(s._slot, sam)
                        s._registered = (sam._S, sam._E, sam._L, sam._M)
                    fast.append(i)
                    fast_budgets.append(b)
                    slots.append(s._slot)
                if fast:
                    starts, outs, counts = self._batch_kernel(sessions, fast, fast_budgets, slots, src)
            finally:
                for g in held:
                    g.release()
        if fast:
            trusted = DraftTree.unchecked
            out_tok, out_par, out_depth, out_prob = outs[:4]
            learning = self.learn
            for i, a, k in zip(fast, starts.tolist(), counts.tolist()):
                e = a + k
                trees[i] = trusted(out_tok[a:e], out_par[a:e], out_depth[a:e], out_prob[a:e]) if k else _EMPTY
                sessions[i]._judged = (outs, a, a + k) if learning and k else None
        for i, b in slow:
            trees[i] = sessions[i].propose(b)
        return trees

    def _batch_kernel(self, sessions, fast, budgets, slots, src):
        """The batch kernel over sessions `fast` (registered in `slots`); under the batch lock.
        Returns (starts, (tokens, parents, depths, scores, shares), counts)."""
        budget_arr = np.array(budgets, np.int64)
        starts = np.zeros(len(fast), np.int64)
        np.cumsum(budget_arr[:-1], out=starts[1:])
        total = int(starts[-1] + budget_arr[-1])
        outs = (np.empty(total, np.int32), np.empty(total, np.int32), np.empty(total, np.int32), np.empty(total, np.float64),
                np.empty(total, np.float64), np.empty(total, np.int32), np.empty(total, np.float64))
        curs = np.stack([sessions[i]._cur for i in fast])
        recs = np.stack([sessions[i]._rec for i in fast])
        stats = np.stack([sessions[i]._stats for i in fast])
        threads = max(1, min(self.threads, len(fast), numba.config.NUMBA_NUM_THREADS))
        args = (self._slots.arrays, np.array(slots, np.int64), curs, recs, src.table, src.tops, src.classes, stats, self._learned,
                self._calibration, self._group_cal, budget_arr, self.params, self.min_match, self.match_levels)
        if threads == 1:
            counts = pk.propose_batch_serial(*args, starts, *outs)
        else:
            with _PARALLEL_LAUNCH:  # numba's workqueue pool takes one launch at a time
                _prefer_workqueue()
                numba.set_num_threads(threads)
                counts = pk.propose_batch(*args, threads, starts, *outs)
        return starts, outs, counts


def _kernel_params(cfg: ProposerConfig) -> np.ndarray:
    """The knobs the draft kernel reads, float64 [dk.N_PARAMS], read-only."""
    params = np.zeros(dk.N_PARAMS, np.float64)
    params[dk.P_MATCH_PRIOR] = cfg.match_prior
    params[dk.P_RECENCY] = cfg.recency
    params[dk.P_MIN_PROB] = cfg.min_prob
    params[dk.P_MAX_DEPTH] = cfg.max_depth
    params[dk.P_MAX_CHILDREN] = cfg.max_children
    params[dk.P_PRIOR_STRENGTH] = cfg.prior_strength
    params[dk.P_SESSION_STRENGTH] = cfg.session_strength
    params[dk.P_CAL_STRENGTH] = cfg.calibration_strength
    params[dk.P_CORPUS_LOCALITY] = cfg.corpus_locality
    params[dk.P_NEAR_BACK], params[dk.P_NEAR_AHEAD] = dk.NEAR_BACK, dk.NEAR_AHEAD
    params[dk.P_RECOVER] = cfg.recover
    params.flags.writeable = False
    return params


class _NoCache:
    """The version a proposer without a cache syncs to; changed when a cache is assigned (or
    taken away), so that open sessions notice. Negative, never a cache's version."""

    __slots__ = ("_version",)

    def __init__(self):
        self._version = 0

    def _touch(self) -> None:
        self._version -= 1
