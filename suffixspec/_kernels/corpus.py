"""Occurrence layout and document-restricted queries of one corpus shard.

Besides the frozen automaton arrays (see frozen.py) a shard stores its *occurrence layout*:

- `occ` int32[n_tokens]: every end position of the shard, ordered by a depth-first preorder of
  the suffix-link tree (each position sits at the deepest state whose strings end there: the
  state of its whole document prefix), so the end positions of any state v are the contiguous
  range `occ[occ_start[v] : occ_start[v] + counts[v]]`;
- `occ_start` int32[n_states].

A document subset is a bool mask over global document ids (`mask[doc_base + local_doc]`);
positions map to local documents by binary search in `doc_starts`.

The arrays may be memory-mapped from a damaged file: every index read from an array is
range-checked first and the query kernels return CORRUPT (-2) instead of reading out of bounds.
"""

import numpy as np
from numba import njit

from .frozen import CORRUPT, transition

SAMPLE_SCAN_FACTOR = 8  # a range up to SAMPLE_SCAN_FACTOR * K long is searched for its K most recent positions


# -- building ------------------------------------------------------------------------------


@njit(cache=True)
def prefix_states(offsets, etok, eto, tokens, doc_starts):
    """State of each position's whole document prefix (-2 for a damaged automaton)."""
    n = tokens.shape[0]
    out = np.empty(n, np.int32)
    d = 0
    n_docs = doc_starts.shape[0]
    state = 0
    for p in range(n):
        if d < n_docs and doc_starts[d] == p:
            state = 0
            while d < n_docs and doc_starts[d] == p:
                d += 1
        state = transition(offsets, etok, eto, state, tokens[p])
        if state < 0:
            out[0] = CORRUPT
            return out
        out[p] = state
    return out


@njit(cache=True)
def occurrence_layout(links, counts, pstate):
    """(occ, occ_start, ok): end positions in suffix-link-tree preorder; ok is False when the
    subtree sums disagree with `counts` (an automaton that does not describe its tokens)."""
    n_states = links.shape[0]
    n = pstate.shape[0]
    own = np.zeros(n_states, np.int64)
    for p in range(n):
        own[pstate[p]] += 1
    # children of the suffix-link tree, CSR
    child_off = np.zeros(n_states + 1, np.int64)
    for v in range(1, n_states):
        child_off[links[v] + 1] += 1
    for v in range(n_states):
        child_off[v + 1] += child_off[v]
    fill = child_off[:-1].copy()
    children = np.empty(max(n_states - 1, 0), np.int32)
    for v in range(1, n_states):
        u = links[v]
        children[fill[u]] = v
        fill[u] += 1
    # preorder: own positions of v first, then its children's subtrees
    occ_start = np.empty(n_states, np.int32)
    order = np.empty(n_states, np.int32)
    stack = np.empty(n_states, np.int32)
    top = 0
    stack[0] = 0
    top = 1
    cursor = 0
    k = 0
    while top > 0:
        top -= 1
        v = stack[top]
        order[k] = v
        k += 1
        occ_start[v] = cursor
        cursor += own[v]
        for i in range(child_off[v + 1] - 1, child_off[v] - 1, -1):
            stack[top] = children[i]
            top += 1
    ok = k == n_states
    # check counts: subtree sums in reverse preorder
    sub = own.copy()
    for i in range(k - 1, 0, -1):
        v = order[i]
        sub[links[v]] += sub[v]
    for v in range(n_states):
        if sub[v] != counts[v]:
            ok = False
    occ = np.empty(n, np.int32)
    put = np.empty(n_states, np.int64)
    for v in range(n_states):
        put[v] = occ_start[v]
    for p in range(n):
        s = pstate[p]
        occ[put[s]] = p
        put[s] += 1
    return occ, occ_start, ok


# -- restricted queries ----------------------------------------------------------------------


@njit(cache=True, inline="always")
def _doc_of(doc_starts, pos):
    # last document whose start is <= pos
    lo = 0
    hi = doc_starts.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if doc_starts[mid] <= pos:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@njit(cache=True)
def _range(occ, occ_start, counts, state):
    """(lo, hi) of a state's positions in occ, or (-2, 0) when the arrays are damaged."""
    if state < 0 or state >= occ_start.shape[0] or state >= counts.shape[0]:
        return CORRUPT, 0
    lo = np.int64(occ_start[state])
    c = np.int64(counts[state])
    if lo < 0 or c < 0 or lo + c > occ.shape[0]:
        return CORRUPT, 0
    return lo, lo + c


@njit(cache=True)
def _sample(occ, lo, hi, k):
    """The positions of occ[lo:hi]: all when at most k, else the k most recent (largest) ones,
    or an evenly strided k-sample when the range is longer than SAMPLE_SCAN_FACTOR * k."""
    c = hi - lo
    if c <= k:
        return occ[lo:hi].copy()
    if c <= SAMPLE_SCAN_FACTOR * k:
        part = np.partition(occ[lo:hi].copy(), c - k)
        return part[c - k :].copy()
    out = np.empty(k, np.int32)
    step = c / k
    for i in range(k):
        out[i] = occ[lo + np.int64(i * step)]
    return out


@njit(cache=True)
def subset_any(occ, occ_start, counts, doc_starts, mask, doc_base, state):
    """1 when some end position of `state` lies in a masked document, 0 if none, CORRUPT."""
    lo, hi = _range(occ, occ_start, counts, state)
    if lo == CORRUPT:
        return CORRUPT
    if doc_starts.shape[0] == 0:
        return CORRUPT
    return _any_in(occ, lo, hi, doc_starts, mask, doc_base)


@njit(cache=True)
def subset_count(occ, occ_start, counts, doc_starts, mask, doc_base, state, k):
    """(hits, sampled, last_end): end positions of `state` in masked documents among `sampled`
    examined ones (all of them when counts[state] <= k), most recent such position or -1.
    hits == CORRUPT on damaged arrays."""
    lo, hi = _range(occ, occ_start, counts, state)
    if lo == CORRUPT or doc_starts.shape[0] == 0:
        return CORRUPT, 0, -1
    sample = _sample(occ, lo, hi, k)
    n = mask.shape[0]
    hits = 0
    last = -1
    for i in range(sample.shape[0]):
        p = sample[i]
        d = _doc_of(doc_starts, p)
        if d < 0 or doc_base + d >= n:
            return CORRUPT, 0, -1
        if mask[doc_base + d]:
            hits += 1
            if p > last:
                last = p
    return hits, sample.shape[0], last


@njit(cache=True)
def subset_next_tokens(occ, occ_start, counts, doc_starts, tokens, mask, doc_base, state, k):
    """(next_tokens, next_ends, sampled, ok): for each sampled end position p of `state` in a
    masked document and not at its document's end, the token at p + 1 and p + 1. The root (the
    empty string) is followed by every token: there q = p itself."""
    shift = 0 if state == 0 else 1
    lo, hi = _range(occ, occ_start, counts, state)
    if lo == CORRUPT or doc_starts.shape[0] == 0:
        return np.empty(0, np.int32), np.empty(0, np.int64), 0, False
    sample = _sample(occ, lo, hi, k)
    n = mask.shape[0]
    n_docs = doc_starts.shape[0]
    n_tok = tokens.shape[0]
    toks = np.empty(sample.shape[0], np.int32)
    ends = np.empty(sample.shape[0], np.int64)
    m = 0
    for i in range(sample.shape[0]):
        p = np.int64(sample[i])
        d = _doc_of(doc_starts, p)
        if d < 0 or doc_base + d >= n or p >= n_tok:
            return np.empty(0, np.int32), np.empty(0, np.int64), 0, False
        if not mask[doc_base + d]:
            continue
        stop = doc_starts[d + 1] if d + 1 < n_docs else n_tok
        if p + shift >= stop or p + shift >= n_tok:
            continue
        toks[m] = tokens[p + shift]
        ends[m] = p + shift
        m += 1
    return toks[:m].copy(), ends[:m].copy(), sample.shape[0], True


@njit(cache=True)
def _any_in(occ, lo, hi, doc_starts, mask, doc_base):
    n = mask.shape[0]
    for i in range(hi - 1, lo - 1, -1):
        d = _doc_of(doc_starts, occ[i])
        if d < 0 or doc_base + d >= n:
            return CORRUPT
        if mask[doc_base + d]:
            return 1
    return 0


@njit(cache=True)
def subset_match(offsets, etok, eto, links, lens, occ, occ_start, counts, doc_starts, mask, doc_base, state, length):
    """Walk up the suffix links from (state, length) to the longest suffix with an end position
    in a masked document: all strings of a state share their end positions. A parent's range
    of `occ` contains its child's (preorder), so only the part outside the child's is scanned."""
    n = links.shape[0]
    if doc_starts.shape[0] == 0:
        return CORRUPT, 0
    steps = 0
    seen_lo = np.int64(0)
    seen_hi = np.int64(0)
    while state != 0:
        lo, hi = _range(occ, occ_start, counts, state)
        if lo == CORRUPT:
            return CORRUPT, 0
        if seen_hi > seen_lo and lo <= seen_lo and seen_hi <= hi:
            r = _any_in(occ, lo, seen_lo, doc_starts, mask, doc_base)
            if r == 0:
                r = _any_in(occ, seen_hi, hi, doc_starts, mask, doc_base)
        else:
            r = _any_in(occ, lo, hi, doc_starts, mask, doc_base)
        if r == CORRUPT:
            return CORRUPT, 0
        if r == 1:
            return state, length
        seen_lo, seen_hi = lo, hi
        p = links[state]
        steps += 1
        if p < 0 or p >= n or steps > n:
            return CORRUPT, 0
        state = p
        length = lens[p]
        if length < 0:
            return CORRUPT, 0
    return 0, 0


@njit(cache=True)
def merge_sorted(toks, cnts, ends):
    """Reduce (token, count, end) rows sorted by token: counts summed, ends maximised."""
    m = toks.shape[0]
    out_t = np.empty(m, np.int32)
    out_c = np.empty(m, np.int64)
    out_e = np.empty(m, np.int64)
    k = -1
    for i in range(m):
        if k >= 0 and out_t[k] == toks[i]:
            out_c[k] += cnts[i]
            if ends[i] > out_e[k]:
                out_e[k] = ends[i]
        else:
            k += 1
            out_t[k] = toks[i]
            out_c[k] = cnts[i]
            out_e[k] = ends[i]
    return out_t[: k + 1].copy(), out_c[: k + 1].copy(), out_e[: k + 1].copy()


@njit(cache=True)
def doc_lengths(doc_starts, n_tokens):
    n = doc_starts.shape[0]
    out = np.empty(n, np.int64)
    for i in range(n):
        stop = doc_starts[i + 1] if i + 1 < n else n_tokens
        out[i] = stop - doc_starts[i]
    return out
