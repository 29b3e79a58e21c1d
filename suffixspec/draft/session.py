"""`Session`: one request's drafting state, opened by `Proposer.start`.

A session holds the request itself (prompt + committed output) in a private, growable
`SuffixAutomaton` and one cursor into each frozen source of its proposer (corpus shards, the
cache's levels). Its match in its own text is the longest suffix that also occurred earlier (the
suffix link of the state of the whole text), exact and unbounded. It holds at most
`max_session_tokens` tokens: past that cap its automaton is rebuilt over the most recent half.
When the cache of past responses changes, a session keeps its cursors into unchanged automata and
re-finds its match over its last `resync_tokens` tokens in new ones, so a match into past
responses restarts at most that long and then grows token by token.

* `propose(budget)`: the draft tree, a view into the calling thread's output arena (the empty tree
  is one shared, read-only instance); `extend(tokens)`: commit tokens, judging the last tree and
  counting what the sources' matches did (`learn`); `close()`: the output joins the cache.
* Threads: a session's calls (`propose`, `extend`, `close`, its part of a batch) are serialised by
  its own lock, so no kernel reads an automaton that another thread is growing or freeing (the
  kernels read raw addresses). Lock order: the proposer's batch lock, then the session's.
* `Session` and `Proposer` share state both ways (the proposer's batch path reads a session's
  automaton, cursors and counts; a session reads its proposer's sources and workspaces): this
  module does not import the proposer's, which imports this one.
"""

from __future__ import annotations

import threading

import numpy as np

from .._kernels import draft as dk
from .._kernels import frozen as fk
from .._kernels import learn as lk
from .._kernels import merge as mk
from .._kernels import propose as pk
from .._kernels import recover as rk
from .._kernels import sam as sk
from .._kernels.address import address
from ..errors import BadInputError, InternalError
from .automaton import FrozenAutomaton, SuffixAutomaton
from .sources import RestrictedSource, Sources
from .tree import DraftTree

__all__ = ["SRC_CORPUS", "SRC_OTHER", "Session"]


SRC_CORPUS, SRC_OTHER = 0, 1  # rows of Proposer._source_tokens


def _source_counts(judged, committed: np.ndarray, counts: np.ndarray) -> None:
    """Add a judged tree's nodes to `counts` [source, (drafted, accepted)]: a node is the corpus's when
    a corpus part created it (its group, `lk.group`, is set only for corpus parts), and accepted when
    it lies on the committed path (its parent did, its token is the one committed at its depth)."""
    (tokens, parents, _depths, _scores, _shares, groups, _steps), a, e = judged
    tok, par, corpus = tokens[a:e], parents[a:e], groups[a:e] >= 0
    n_corpus = int(np.count_nonzero(corpus))
    counts[SRC_CORPUS, 0] += n_corpus
    counts[SRC_OTHER, 0] += (e - a) - n_corpus
    node = -1
    for token in committed.tolist():
        hit = np.flatnonzero((par == node) & (tok == token))
        if hit.shape[0] == 0:
            break
        node = int(hit[0])
        counts[SRC_CORPUS if corpus[node] else SRC_OTHER, 1] += 1


_tree = DraftTree.unchecked
_EMPTY = DraftTree.empty()
_propose_framed = pk.propose_framed
_tree_span = pk.tree_span
_TREE_SHIFT, _TREE_COUNT_MASK = pk.TREE_SHIFT, pk.TREE_COUNT_MASK
_CUR_STATE, _CUR_LEN, _CUR_ANCHOR = pk.CUR_STATE, pk.CUR_LEN, pk.CUR_ANCHOR
ANCHOR_MIN = 4  # a corpus match this long or longer may anchor the session (`_anchor`)
ANCHOR_TAIL, ANCHOR_STEPS = 16, 4  # `_start_cursor`
RECOVER_MIN = 4  # the shortest earlier match a copy is recovered from past a replaced or inserted token


def _anchor(fa: FrozenAutomaton, state: int, length: int, moved: int) -> int:
    """The session's anchor in corpus automaton `fa` (`dk.CUR_ANCHOR`) once its match is (state,
    length): where that match ends when it occurs once, or when its most recent end lies within
    NEAR_BACK of `moved` (the previous anchor moved on by the tokens committed since, -1: none);
    else `moved` (past the end of the text, an anchor is near no continuation: harmless)."""
    if state > 0 and length >= ANCHOR_MIN:
        last = fa.last_at(state)
        if fa.count_at(state) == 1 or (moved >= 0 and abs(last - moved) <= dk.NEAR_BACK):
            return last
    return moved


def _start_cursor(fa: FrozenAutomaton, prompt: np.ndarray) -> tuple[int, int, int]:
    """(state, length, anchor) of a corpus row after the prompt. The anchor is looked for at
    ANCHOR_STEPS points of the prompt's last ANCHOR_TAIL tokens too: a prompt often ends inside
    what the corpus holds as one token (a line break before its indentation), where the match is
    short and no anchor is found."""
    n = prompt.shape[0]
    state, length, anchor, at = 0, 0, -1, 0
    for end in range(max(0, n - ANCHOR_TAIL), n + 1, ANCHOR_TAIL // ANCHOR_STEPS):
        state, length = fa._advance(state, length, prompt[at:end])
        anchor = _anchor(fa, state, length, anchor + (end - at) if anchor >= 0 else -1)
        at = end
    if at < n:
        state, length = fa._advance(state, length, prompt[at:])
        anchor = _anchor(fa, state, length, anchor + (n - at) if anchor >= 0 else -1)
    return state, length, anchor


class Session:
    """One request: its own automaton, cursors into the shared frozen sources, and its output.

    Opened by `Proposer.start` (`proposer`: the proposer that opened it, whose sources, learned
    counts, workspaces and cache it reads and updates)."""

    def __init__(self, proposer, prompt: np.ndarray, request_id=None, filter=None):
        self.proposer = proposer
        self.request_id = request_id
        self.prompt_len = int(prompt.shape[0])
        self._sam = SuffixAutomaton(prompt)
        self._output: list[int] = []
        self._closed = False
        self._slot = -1  # live-automaton slot of batched proposals ...
        self._registered = None  # ... and the arrays registered there
        self._restricted: list[RestrictedSource] = []
        restricted_owner = set()
        for i, c in enumerate(proposer.corpora):
            if isinstance(c, FrozenAutomaton) or (filter is None and not len(c.deleted)):
                continue
            restricted_owner.add(i)
            if isinstance(filter, dict):
                self._restricted.append(RestrictedSource(c, c.subset(tags=filter)))
            else:
                self._restricted.append(RestrictedSource(c, c.subset(filter) if filter is not None else None))
        # one cursor row (pk.CUR_STATE, pk.CUR_LEN, pk.CUR_ANCHOR) per source of self._automata;
        # state -1: not used
        self._automata: list[FrozenAutomaton] = list(proposer._static)
        self._cur = np.zeros((len(self._automata), pk.CUR_COLS), np.int64)
        for j, (fa, owner) in enumerate(zip(self._automata, proposer._static_owner)):
            if owner in restricted_owner:
                self._cur[j] = (-1, 0, -1)
            else:
                self._cur[j] = _start_cursor(fa, prompt)
        self._cls = np.full(len(self._automata), lk.CLS_CORPUS, np.int64)  # each row's source class
        self._stats = lk.new_stats()  # this request's learned counts (lk)
        # the recovery row (rk.RROW_*; rk.recovery_row, after each extension when the proposer recovers)
        self._rec = np.full(rk.RROW_COLS, -1, np.int64)
        # the last tree proposed, judged by the next extension (lk.count_tree): (the arena's blocks
        # (tokens, parents, depths, scores, shares, groups, steps), its first node, its end), or None
        self._judged = None
        self._src: Sources | None = None  # the sources self._automata mirrors, once synced
        # pk.session_frame of the current _sam, _cur, _src (None: to rebuild); _hot: its address
        # while propose may use it after checking only the cache version (unrestricted sessions)
        self._frame = self._hot = None
        self._guard = threading.Lock()  # serialises this session's calls (module docstring)
        # the set-up a first proposal would otherwise pay: sources synced, counts online, the frame
        # and this thread's workspace built
        self._sync()
        self._sam._start_online()
        self._build_frame()
        proposer._workspace(proposer.max_nodes, self._n_sources)
        if not self._restricted:
            self._hot = self._frame_addr

    @property
    def output(self) -> list[int]:
        return list(self._output)

    def __len__(self) -> int:
        return self.prompt_len + len(self._output)

    def extend(self, tokens) -> None:
        """Commit tokens (accepted drafts and the target's own token)."""
        with self._guard:
            if self._closed:
                raise BadInputError("session is closed")
            toks = self.proposer._tokens(tokens, "tokens")
            if toks.shape[0] == 0:
                return
            self._output.extend(toks.tolist())
            p = self.proposer
            learning = p.learn
            judged = self._judged
            if judged is not None:
                self._judged = None
                if learning:
                    (tokens, parents, _depths, _scores, shares, groups, steps), a, e = judged
                    lk.count_tree(tokens, parents, shares, groups, steps, a, e, toks, p._calibration, p._group_cal)
                if p._static:
                    _source_counts(judged, toks, p._source_tokens)
            if learning:
                sam = self._sam
                lk.count_own(sam._S, sam._E, sam._H, sam._M, toks, p.min_match, self._stats, p._learned)
            if p._recover > 0:
                self._extend_recovering(toks)
            else:
                self._sam._extend_valid(toks)
            if len(self._sam) > self.proposer.max_session_tokens:
                keep = self.proposer.max_session_tokens // 2
                self._sam = SuffixAutomaton(self._sam.tokens[-keep:])
                self._rec[rk.RROW_STATE] = -1  # names a state of the automaton dropped
                self._frame = self._hot = None
            cur = self._cur
            n_static = len(p._static)
            for j, fa in enumerate(self._automata):
                if cur[j, _CUR_STATE] < 0:
                    continue
                if not learning:
                    state, length = fa._advance(int(cur[j, _CUR_STATE]), int(cur[j, _CUR_LEN]), toks)
                else:
                    offsets, etok, eto, _counts, _lasts, links, lens = fa.kernel_arrays()
                    text, plink, _big = fa.implicit_arrays()
                    state, length = lk.count_frozen(offsets, etok, eto, links, lens, text, plink, int(cur[j, _CUR_STATE]),
                                                    int(cur[j, _CUR_LEN]), toks, p.min_match, int(self._cls[j]),
                                                    self._stats, p._learned)
                    if state == fk.CORRUPT:
                        fa._corrupt("while matching")
                anchor = int(cur[j, _CUR_ANCHOR])
                if j < n_static:  # a corpus row: its anchor follows (`_anchor`)
                    anchor = _anchor(fa, state, length, anchor + toks.shape[0] if anchor >= 0 else -1)
                cur[j] = (state, length, anchor)

    def _extend_recovering(self, toks: np.ndarray) -> None:
        """Extend the automaton by `toks`, the recovery row set from the text before their last
        token (`rk.recovery_row`)."""
        sam = self._sam
        if toks.shape[0] > 1:
            sam._extend_valid(toks[:-1])
        rk.recovery_row(sam._S, sam._E, sam._L, sam._M, int(sam._M[sk.LAST_STATE]), int(toks[-1]), RECOVER_MIN,
                        self._rec)
        sam._extend_valid(toks[-1:])

    def _sync(self, src: Sources | None = None) -> None:
        """Mirror `src` (default: the proposer's current sources). Corpus rows and generations
        that did not change keep their cursors; a new snapshot of the same (growing) generation
        keeps the state ids, so its cursor carries over (normalised past clones that took its
        shorter strings: a still valid, possibly not longest, match that grows token by token);
        a new generation re-finds the match of the last `resync_tokens` tokens (at most its
        longest document's length of them: no match is longer)."""
        src = src if src is not None else self.proposer._current_sources()
        old = self._src
        if src is old:
            return
        n_static = src.n_static
        cur = np.empty((len(src.automata), pk.CUR_COLS), np.int64)
        cur[:n_static] = self._cur[:n_static]
        by_object, by_generation = {}, {}
        if old is not None:
            for j in range(old.n_static, len(old.automata)):
                by_object[id(old.automata[j])] = self._cur[j]
                by_generation[old.generations[j]] = self._cur[j]
        tail = None
        for j in range(n_static, len(src.automata)):
            fa = src.automata[j]
            row = by_object.get(id(fa))
            if row is None and src.generations[j] in by_generation:
                state, length, _anchor_pos = by_generation[src.generations[j]]
                row = (pk.normalize_frozen(fa.links, fa.lens, state, length), length, -1)
            if row is None:
                if tail is None:
                    tail = self._sam.tokens[-self.proposer.resync_tokens :]
                # no match is longer than the automaton's longest document: re-reading more is waste
                row = fa._advance(0, 0, tail[max(0, tail.shape[0] - fa.longest_document) :]) + (-1,)
            cur[j] = row
        self._cur = cur
        self._automata = src.automata
        self._cls = src.classes
        self._src = src
        self._frame = self._hot = None

    def propose(self, budget=None) -> DraftTree:
        """The tree of at most `budget` nodes (default: the proposer's `max_nodes`)."""
        with self._guard:
            hot = self._hot  # the frame's address, when nothing but the cache version needs checking
            if hot is not None and type(budget) is int and budget > 0 and self._cache._version == self._version:
                # the hot path, inlined (each call or attribute lookup here shows in the p50): what
                # _kernel_tree does when the workspace fits and the arena has room
                ws = getattr(self._tls, "ws", None)
                if ws is not None:
                    r = _propose_framed(hot, ws.addr, budget)
                    if r >= 0:  # else the workspace or the arena is too small: _kernel_tree grows it
                        a = r >> _TREE_SHIFT  # _tree_span(r), without a call
                        e = a + (r & _TREE_COUNT_MASK)
                        if a == e:
                            self._judged = None
                            return _EMPTY
                        blocks = ws.blocks
                        self._judged = (blocks, a, e)
                        return _tree(ws.tokens[a:e], ws.parents[a:e], ws.depths[a:e], ws.scores[a:e])
                return self._kernel_tree(budget)
            p = self.proposer
            budget = p.max_nodes if budget is None else int(budget)
            if budget <= 0 or self._closed:
                return DraftTree.empty()
            src = p._sources
            if src is None or src is not self._src or src.version != p._version_holder()._version:
                self._sync()
            if self._sam._mode != sk.MODE_ONLINE:
                self._sam._start_online()
            if self._restricted:
                return self._propose_restricted(budget)
            tree = self._propose_sources(budget)
            self._hot = self._frame_addr
            return tree

    def _build_frame(self) -> None:
        """The kernel's frame of the current automaton, cursors and sources (see pk.session_frame)."""
        p = self.proposer
        self._params = p.params  # kept alive while the frame names it
        self._frame = pk.session_frame(self._sam._live, self._cur, self._src.table, self._params, p.min_match,
                                       p.match_levels, self._src.classes, self._stats, p._learned, p._calibration,
                                       self._src.tops, p._group_cal, self._rec)
        self._frame_addr = address(self._frame, np.int64)
        self._n_sources = (1 + len(self._automata)) * p.match_levels + pk.RECOVERY_PARTS
        self._version = self._src.version
        self._cache = p._version_holder()
        self._tls = p._local

    def _propose_sources(self, budget: int) -> DraftTree:
        """The tree over the session's automaton sources (its own, corpora, past responses)."""
        if self._frame is None:
            self._build_frame()
        return self._kernel_tree(budget)

    def _kernel_tree(self, budget: int) -> DraftTree:
        """The propose kernel's tree, a view into this thread's output arena."""
        ws = self.proposer._workspace(budget, self._n_sources)
        r = pk.propose_framed(self._frame_addr, ws.addr, budget)
        if r < 0:  # the arena is full
            ws.new_arena()
            r = pk.propose_framed(self._frame_addr, ws.addr, budget)
            if r < 0:
                raise InternalError(f"propose: the kernel refused a fitted workspace (budget {budget})")
        a, e = _tree_span(r)
        if a == e:
            self._judged = None
            return _EMPTY
        self._judged = (ws.blocks, a, e)
        return _tree(ws.tokens[a:e], ws.parents[a:e], ws.depths[a:e], ws.scores[a:e])

    def _propose_restricted(self, budget: int) -> DraftTree:
        """The kernel's tree over the automaton sources, merged with the restricted corpus chains."""
        p, sam = self.proposer, self._sam
        tree = self._propose_sources(budget)
        toks, pars, probs = [tree.tokens], [tree.parents], [tree.scores]
        n = len(tree)
        context = sam.tokens[-RestrictedSource.window :]
        for src in self._restricted:
            cand = src.candidates(context, budget, p.params, p.min_match)
            if cand is not None and cand[0].shape[0]:
                toks.append(cand[0])
                pars.append(np.where(cand[1] >= 0, cand[1] + n, -1).astype(np.int32))
                probs.append(cand[2])
                n += cand[0].shape[0]
        if len(toks) == 1:
            return tree
        self._judged = None  # a merged tree has no shares
        t, pa, d, s = mk.merge(np.concatenate(toks), np.concatenate(pars), np.concatenate(probs), budget, p.min_prob)
        return _tree(t, pa, d, s)

    def close(self) -> None:
        """End the request; its output joins the global cache of past responses. Waits for a
        proposal or extension of this session running in another thread; later proposals are
        empty and later extensions raise."""
        output = self._finish()
        cache = self.proposer.cache
        if cache is not None and output:
            self.proposer._keep(cache, [output])

    def _finish(self) -> list[int] | None:
        """Close without keeping: the output to keep (None when the session was closed already)."""
        with self._guard:
            if self._closed:
                return None
            self._closed = True
            self._frame = self._hot = None
            self._sam = None  # a batch slot keeps its arrays referenced until released below
            self._src = None
            slot, self._slot = self._slot, -1
            self._registered = None
        if slot >= 0:
            with self.proposer._batch_lock:  # after the lock: lock order is batch lock, then session
                self.proposer._slots.release(slot)
        return self._output

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
