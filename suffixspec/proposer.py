"""`Proposer`: per-request sessions that turn the longest matches of every source into a
`DraftTree`, and the bounded global cache of past responses.

Sources, each giving the longest suffix of the request's context it contains:

- the request itself (prompt + committed output) in a private, growable `SuffixAutomaton`;
  its match is the longest suffix that also occurred earlier (the suffix link of the state
  of the whole text), exact and unbounded. A session holds at most `max_session_tokens`
  tokens: past that cap its automaton is rebuilt over the most recent half.
- past responses: `ResponseCache`, rotating generations. Closed sessions' outputs are added as
  documents to the newest generation; when it holds `cache_tokens / cache_generations` tokens
  it is frozen and a new one starts; beyond `cache_generations` the oldest generation is
  dropped whole (an automaton cannot delete). Counts therefore cover the responses of the
  generations still held. Sessions read frozen snapshots only; `add` (a session's `close`)
  re-freezes the newest generation, so that cost falls on the closing request, not on proposals.
  When the cache changes, a session re-finds its match over its last `resync_tokens` tokens, so
  a match into past responses restarts at most that long and then grows token by token.
- corpora: any number of frozen automata or corpus indexes.

Each source expands a best-first candidate tree (see `_kernels/draft.py` for the scores), and
the candidates are merged into one tree of at most `budget` nodes.

Threads: one session must not be used from two threads at once; different sessions may be
used concurrently (the kernels release the GIL, the cache is guarded by a lock and read as
immutable snapshots). `propose_batch` runs sessions on `threads` threads (default 1, so that
the proposer does not compete with the model for cores; on 2 cores, 2 threads were slower than
one for 64 sessions, the per-session Python work holding the GIL).
"""

from __future__ import annotations

import os
import pickle
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ._kernels import draft as dk
from ._kernels import sam as sk
from ._tokens import as_tokens
from .automaton import FrozenAutomaton, SuffixAutomaton
from .errors import BadInputError, IndexFormatError
from .tree import DraftTree

_CACHE_MAGIC = "suffixspec-response-cache"
_CACHE_VERSION = 1


class ResponseCache:
    """Bounded cache of past responses in rotating generations (see the module docstring)."""

    def __init__(self, max_tokens: int = 1 << 20, generations: int = 4):
        if max_tokens <= 0 or generations <= 0:
            raise BadInputError(f"ResponseCache: expected positive max_tokens and generations, got {max_tokens}, {generations}")
        self.max_tokens = int(max_tokens)
        self.generations = int(generations)
        self._lock = threading.Lock()
        self._frozen: list[tuple[int, FrozenAutomaton]] = []  # oldest first
        self._live = SuffixAutomaton()
        self._live_id = 0
        self._snapshot: tuple[int, FrozenAutomaton] | None = None
        self._version = 0  # bumps on every change, so sessions know to resync

    @property
    def generation_tokens(self) -> int:
        return max(1, self.max_tokens // self.generations)

    def add(self, tokens) -> None:
        toks = as_tokens(tokens)
        if toks.shape[0] == 0:
            return
        with self._lock:
            self._live.add_document(toks)
            # freeze now, on the closing request's time, not on the next proposal's
            snapshot = self._live.freeze()
            if len(self._live) >= self.generation_tokens:
                self._frozen.append((self._live_id, snapshot))
                self._live = SuffixAutomaton()
                self._live_id += 1
                self._snapshot = None
                del self._frozen[: max(0, len(self._frozen) - (self.generations - 1))]
            else:
                self._snapshot = (self._live_id, snapshot)
            self._version += 1

    def sources(self) -> tuple[int, list[tuple[int, FrozenAutomaton]]]:
        """(version, [(generation id, frozen automaton)...]) as of now."""
        with self._lock:
            if self._snapshot is None and len(self._live):  # e.g. just loaded from disk
                self._snapshot = (self._live_id, self._live.freeze())
            out = list(self._frozen)
            if self._snapshot is not None:
                out.append(self._snapshot)
            return self._version, out

    def __len__(self) -> int:
        with self._lock:
            return sum(len(a) for _, a in self._frozen) + len(self._live)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(a.nbytes for _, a in self._frozen) + self._live.nbytes

    def save(self, path) -> None:
        """Write atomically (temporary file in the same directory, then rename)."""
        path = Path(path)
        with self._lock:
            state = {
                "magic": _CACHE_MAGIC, "version": _CACHE_VERSION, "max_tokens": self.max_tokens,
                "generations": self.generations, "frozen": [(g, a.arrays()) for g, a in self._frozen],
                "live": self._live, "live_id": self._live_id,
            }
            fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent or ".")
            try:
                with os.fdopen(fd, "wb") as f:
                    pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise

    @classmethod
    def load(cls, path) -> ResponseCache:
        path = Path(path)
        try:
            with open(path, "rb") as f:
                state = pickle.load(f)
        except (pickle.UnpicklingError, EOFError, AttributeError, ValueError) as exc:
            raise IndexFormatError(f"{path}: not a readable response cache ({exc})") from None
        if not isinstance(state, dict) or state.get("magic") != _CACHE_MAGIC:
            raise IndexFormatError(f"{path}: not a suffixspec response cache (bad magic)")
        if state.get("version") != _CACHE_VERSION:
            raise IndexFormatError(f"{path}: response cache version {state.get('version')!r}, expected {_CACHE_VERSION}")
        cache = cls(state["max_tokens"], state["generations"])
        cache._frozen = [(g, FrozenAutomaton(**arrays)) for g, arrays in state["frozen"]]
        cache._live = state["live"]
        cache._live_id = state["live_id"]
        return cache


def _corpus_sources(corpus) -> list:
    """Flatten `corpus` into FrozenAutomaton and corpus-index entries."""
    if corpus is None:
        return []
    items = corpus if isinstance(corpus, (list, tuple)) else [corpus]
    out = []
    for item in items:
        if isinstance(item, SuffixAutomaton):
            out.append(item.freeze())
        elif isinstance(item, FrozenAutomaton):
            out.append(item)
        elif hasattr(item, "shards") and hasattr(item, "query") and hasattr(item, "subset"):
            out.append(item)
        else:
            raise BadInputError(f"corpus: expected a FrozenAutomaton, SuffixAutomaton or CorpusIndex, got {type(item).__name__}")
    return out


class _RestrictedSource:
    """A corpus index queried within a document subset (or past deleted documents).

    Each round asks the index for the longest match of the last `window` context tokens within
    the subset, then drafts linear chains: for each of the best continuations, the text that
    followed its most recent selected occurrence. Slower than the automaton walk of an
    unrestricted source, and matches are capped at `window` tokens.
    """

    window = 256

    def __init__(self, index, subset):
        self.index = index
        self.subset = subset

    def candidates(self, context: np.ndarray, budget: int, params, min_match: int):
        m = self.index.query(context[-self.window :], self.subset)
        if m.length < min_match or len(m) == 0:
            return None
        total = float(m.counts.sum())
        recent = int(np.argmax(m.last_ends))
        rec = params[dk.P_RECENCY]
        prior = params[dk.P_MATCH_PRIOR]
        weights = m.counts.astype(np.float64) + np.where(np.arange(len(m)) == recent, rec * total, 0.0)
        order = np.argsort(-weights, kind="stable")[: int(params[dk.P_MAX_CHILDREN])]
        toks, pars, probs = [], [], []
        for i in order:
            p = weights[i] / (total * (1 + rec)) * m.length / (m.length + prior)
            if p < params[dk.P_MIN_PROB]:
                break
            chain = [int(m.tokens[i])] + self.index.following(int(m.last_ends[i]), budget - 1).tolist()
            length, parent = m.length + 1, -1
            for t in chain:
                if p < params[dk.P_MIN_PROB] or len(toks) >= budget * 2:
                    break
                toks.append(t)
                pars.append(parent)
                probs.append(p)
                parent = len(toks) - 1
                p *= length / (length + prior)
                length += 1
        return (np.array(toks, np.int32), np.array(pars, np.int32), np.array(probs, np.float64))


class Proposer:
    """Draft-tree proposer over the request, past responses and corpora.

    Knobs: `max_nodes` (default budget), `max_depth` (0: unbounded), `min_match` (shortest
    matched suffix worth drafting from), `min_prob` (drop nodes less likely to be accepted),
    `match_prior` (confidence conf(L) = L / (L + match_prior)), `recency` (weight of the most
    recent continuation), `max_children` (branching per node), `global_cache` (learn from
    closed sessions), `cache_tokens`, `cache_generations`, `max_session_tokens`, `resync_tokens`
    (context re-matched against a changed cache snapshot), `threads` (for `propose_batch`),
    `match_levels` (how many matched suffixes per source are expanded: the longest, then the
    next shorter ones along suffix links, which see more occurrences).
    """

    def __init__(self, corpus=None, *, max_nodes: int = 64, max_depth: int = 0, min_match: int = 1,
                 min_prob: float = 0.0, match_prior: float = 1.0, recency: float = 0.5,
                 max_children: int = 4, global_cache: bool = True, cache_tokens: int = 1 << 20,
                 cache_generations: int = 4, max_session_tokens: int = 1 << 20,
                 resync_tokens: int = 1024, threads: int = 1, match_levels: int = 1):
        for name, value in (("max_nodes", max_nodes), ("min_match", min_match), ("max_children", max_children),
                            ("max_session_tokens", max_session_tokens), ("resync_tokens", resync_tokens), ("threads", threads),
                            ("match_levels", match_levels)):
            if int(value) < 1:
                raise BadInputError(f"{name}: expected a positive integer, got {value!r}")
        if max_depth < 0 or not 0.0 <= min_prob <= 1.0 or match_prior < 0 or recency < 0:
            raise BadInputError("Proposer: expected max_depth >= 0, 0 <= min_prob <= 1, match_prior >= 0, recency >= 0")
        self.max_nodes = int(max_nodes)
        self.min_match = int(min_match)
        self.min_prob = float(min_prob)
        self.max_session_tokens = int(max_session_tokens)
        self.resync_tokens = int(resync_tokens)
        self.threads = int(threads)
        self.match_levels = int(match_levels)
        self.params = np.zeros(dk.N_PARAMS, np.float64)
        self.params[dk.P_MATCH_PRIOR] = match_prior
        self.params[dk.P_RECENCY] = recency
        self.params[dk.P_MIN_PROB] = min_prob
        self.params[dk.P_MAX_DEPTH] = max_depth
        self.params[dk.P_MAX_CHILDREN] = max_children
        self.corpora = _corpus_sources(corpus)
        self.cache = ResponseCache(cache_tokens, cache_generations) if global_cache else None
        self._pool = None
        self._local = threading.local()  # per-thread scratch arrays for the kernels

    def _workspace(self, budget: int, n_sources: int):
        ws = getattr(self._local, "ws", None)
        if ws is None or ws[0].shape[0] < budget * int(self.params[dk.P_MAX_CHILDREN]) + 1 or ws[5].shape[0] < budget * n_sources:
            ws = self._local.ws = dk.make_workspace(max(budget, 64), int(self.params[dk.P_MAX_CHILDREN]), max(n_sources, 4))
        return ws

    def start(self, prompt_ids, request_id=None, filter=None) -> Session:
        """Open a session. `filter` restricts every corpus index to some documents: a dict of
        tags (`{"repo": "click"}`), a pyroaring BitMap of document indexes, or a Subset."""
        if filter is not None and not any(not isinstance(c, FrozenAutomaton) for c in self.corpora):
            raise BadInputError("filter: document filters need a corpus index (none was given)")
        return Session(self, as_tokens(prompt_ids, "prompt_ids"), request_id, filter)

    def propose_batch(self, sessions, budgets=None) -> list[DraftTree]:
        if budgets is None or isinstance(budgets, (int, np.integer)):
            budgets = [budgets] * len(sessions)
        if len(budgets) != len(sessions):
            raise BadInputError(f"budgets: expected one per session ({len(sessions)}), got {len(budgets)}")
        if self.threads == 1 or len(sessions) < 2:
            return [s.propose(b) for s, b in zip(sessions, budgets)]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="suffixspec-propose")
        return list(self._pool.map(lambda sb: sb[0].propose(sb[1]), zip(sessions, budgets)))


class Session:
    """One request: its own automaton, cursors into the shared sources, and its output."""

    def __init__(self, proposer: Proposer, prompt: np.ndarray, request_id=None, filter=None):
        self.proposer = proposer
        self.request_id = request_id
        self.prompt_len = int(prompt.shape[0])
        self._sam = SuffixAutomaton(prompt)
        self._output: list[int] = []
        self._closed = False
        self._frozen: list[FrozenAutomaton] = []  # unrestricted corpus automata, one cursor each
        self._restricted: list[_RestrictedSource] = []
        for c in proposer.corpora:
            if isinstance(c, FrozenAutomaton):
                self._frozen.append(c)
            elif filter is None and not len(c.deleted):
                self._frozen.extend(shard.fa for shard in c.shards)
            elif isinstance(filter, dict):
                self._restricted.append(_RestrictedSource(c, c.subset(tags=filter)))
            else:
                self._restricted.append(_RestrictedSource(c, c.subset(filter) if filter is not None else None))
        self._corpus_cursors = [fa.cursor() for fa in self._frozen]
        for cur in self._corpus_cursors:
            cur.advance(prompt)
        self._cache_version = -1
        self._cache_cursors: list[tuple[FrozenAutomaton, object]] = []

    @property
    def output(self) -> list[int]:
        return list(self._output)

    def __len__(self) -> int:
        return self.prompt_len + len(self._output)

    def extend(self, tokens) -> None:
        """Commit tokens (accepted drafts and the target's own token)."""
        if self._closed:
            raise BadInputError("session is closed")
        toks = as_tokens(tokens)
        if toks.shape[0] == 0:
            return
        self._output.extend(toks.tolist())
        self._sam.extend(toks)
        if len(self._sam) > self.proposer.max_session_tokens:
            keep = self.proposer.max_session_tokens // 2
            self._sam = SuffixAutomaton(self._sam.tokens[-keep:])
        for cur in self._corpus_cursors:
            cur.advance(toks)
        for _, cur in self._cache_cursors:
            cur.advance(toks)

    def _sync_cache(self) -> None:
        cache = self.proposer.cache
        if cache is None or cache._version == self._cache_version:  # an int read: no lock needed
            return
        version, sources = cache.sources()
        if version == self._cache_version:
            return
        tail = self._sam.tokens[-self.proposer.resync_tokens :]
        self._cache_cursors = []
        for _, automaton in sources:
            cur = automaton.cursor()
            cur.advance(tail)
            self._cache_cursors.append((automaton, cur))
        self._cache_version = version

    def propose(self, budget=None) -> DraftTree:
        budget = self.proposer.max_nodes if budget is None else int(budget)
        if budget <= 0 or self._closed:
            return DraftTree.empty()
        p = self.proposer
        self._sync_cache()
        frozen = list(zip(self._frozen, self._corpus_cursors)) + self._cache_cursors
        ws = p._workspace(budget, (1 + len(frozen)) * p.match_levels + len(self._restricted))
        n = 0        # nodes written into the workspace outputs so far
        parts = 0    # expansions that wrote something
        sam = self._sam
        last = int(sam._M[sk.LAST_STATE])
        state = int(sam._S[last, sk.LINK]) if last > 0 else 0
        length = int(sam._S[state, sk.LEN]) if state > 0 else 0
        if length >= p.min_match:
            if sam._mode != sk.MODE_ONLINE:
                sam._start_online()
            for level in range(p.match_levels):
                k, sam._stack = dk.expand_live(sam._S, sam._E, sam._L, sam._M, sam._stack,
                                               state, length, budget, p.params, ws, n)
                n, parts = n + k, parts + (k > 0)
                if level + 1 == p.match_levels:
                    break
                state = int(sam._S[state, sk.LINK])
                length = int(sam._S[state, sk.LEN]) if state > 0 else 0
                if length < p.min_match:
                    break
        for automaton, cur in frozen:
            state, length = cur.state, cur.length
            for level in range(p.match_levels):
                if length < p.min_match:
                    break
                k = dk.expand_frozen(automaton.offsets, automaton.etok, automaton.eto, automaton.counts,
                                     automaton.lasts, state, length, budget, p.params, ws, n)
                n, parts = n + k, parts + (k > 0)
                if level + 1 == p.match_levels:
                    break
                state = automaton.state_link(state)
                length = automaton.state_length(state) if state > 0 else 0
        out_tok, out_par, out_prob, out_depth = ws[5:]
        if self._restricted:
            context = sam.tokens[-_RestrictedSource.window :]
            for src in self._restricted:
                cand = src.candidates(context, budget, p.params, p.min_match)
                if cand is not None and cand[0].shape[0]:
                    k = min(cand[0].shape[0], out_tok.shape[0] - n)
                    out_tok[n : n + k] = cand[0][:k]
                    out_par[n : n + k] = np.where(cand[1][:k] >= 0, cand[1][:k] + n, -1)
                    out_prob[n : n + k] = cand[2][:k]
                    n, parts = n + k, parts + 2  # chains are not best-first ordered: always merge
        if parts == 0:
            return DraftTree.empty()
        if parts == 1:  # one expansion is already a best-first tree
            return DraftTree._trusted(out_tok[:n].copy(), out_par[:n].copy(), out_depth[:n].copy(), out_prob[:n].copy())
        t, pa, d, s = dk.merge(out_tok[:n], out_par[:n], out_prob[:n], budget, p.min_prob)
        return DraftTree._trusted(t, pa, d, s)

    def close(self) -> None:
        """End the request; its output joins the global cache of past responses."""
        if self._closed:
            return
        self._closed = True
        if self.proposer.cache is not None and self._output:
            self.proposer.cache.add(self._output)
        self._sam = None
        self._cache_cursors = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
