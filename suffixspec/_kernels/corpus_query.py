"""Document-restricted queries over a corpus shard's occurrence layout (corpus_build.py).

A document subset reaches these kernels as *runs*: sorted, disjoint position ranges
`[run_lo[i], run_hi[i])` of the shard covering exactly its selected documents (neighbouring
selected documents merged, `selected_runs`), so testing a position is a binary search over few
runs (often one: a repository's files are contiguous). `doc_starts` is searched only to find where
the document of a selected position ends.

- `subset_match`: the longest suffix of a match with an end position in the runs;
- `subset_sample`: the continuations of a state within the runs, from a bounded sample;
- `merge_sorted`, `doc_lengths`: small reductions over the results and the document table.

The arrays may be memory-mapped from a damaged file: every index read from an array is
range-checked first and the kernels return CORRUPT (-2) instead of reading out of bounds.
"""

import numpy as np
from numba import njit

from .frozen import CORRUPT, count_of, link_of

SAMPLE_SCAN_FACTOR = 8  # a range up to SAMPLE_SCAN_FACTOR * K long is searched for its K most recent positions


@njit(cache=True, inline="always")
def _doc_of(doc_starts, pos):
    # last index whose start is <= pos (-1 if none): the document holding pos
    lo = 0
    hi = doc_starts.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if doc_starts[mid] <= pos:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@njit(cache=True, inline="always")
def _selected(run_lo, run_hi, pos):
    # is pos inside one of the runs? (the last run starting at or before pos)
    k = _doc_of(run_lo, pos)
    return k >= 0 and pos < run_hi[k]


@njit(cache=True)
def selected_runs(doc_starts, n_tokens, selected):
    """(run_lo, run_hi) int64: the position ranges of the shard's `selected` documents (bool per
    local document), neighbours merged."""
    n = doc_starts.shape[0]
    run_lo = np.empty(n, np.int64)
    run_hi = np.empty(n, np.int64)
    m = 0
    for d in range(n):
        if not selected[d]:
            continue
        start = np.int64(doc_starts[d])
        stop = np.int64(doc_starts[d + 1]) if d + 1 < n else np.int64(n_tokens)
        if m > 0 and run_hi[m - 1] == start:
            run_hi[m - 1] = stop
        else:
            run_lo[m] = start
            run_hi[m] = stop
            m += 1
    return run_lo[:m].copy(), run_hi[:m].copy()


@njit(cache=True)
def _range(occ, occ_start, counts, big, state):
    """(lo, hi) of a state's positions in occ, or (-2, 0) when the arrays are damaged (an id past
    the stored states' counts is an implicit state's: one position)."""
    if state < 0 or state >= occ_start.shape[0]:
        return CORRUPT, 0
    lo = np.int64(occ_start[state])
    c = count_of(counts, big, state)
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
def subset_sample(occ, occ_start, counts, big, doc_starts, tokens, run_lo, run_hi, state, k):
    """(hits, sampled, next_tokens, next_ends, ok) over the `_sample` of `state`'s end positions
    (all of them when counts[state] <= k): `hits` of the `sampled` positions lie in the runs;
    for each such position p not at its document's end, the token at p + 1 and p + 1. The root
    (the empty string) is followed by every token: there p itself. ok is False on damaged
    arrays."""
    shift = 0 if state == 0 else 1
    lo, hi = _range(occ, occ_start, counts, big, state)
    if lo == CORRUPT or doc_starts.shape[0] == 0:
        return 0, 0, np.empty(0, np.int32), np.empty(0, np.int64), False
    sample = _sample(occ, lo, hi, k)
    n_docs = doc_starts.shape[0]
    n_tok = tokens.shape[0]
    toks = np.empty(sample.shape[0], np.int32)
    ends = np.empty(sample.shape[0], np.int64)
    hits = 0
    m = 0
    for i in range(sample.shape[0]):
        p = np.int64(sample[i])
        if p < 0 or p >= n_tok:
            return 0, 0, np.empty(0, np.int32), np.empty(0, np.int64), False
        if not _selected(run_lo, run_hi, p):
            continue
        hits += 1
        q = p + shift
        if shift:
            d = _doc_of(doc_starts, p)
            if d < 0:
                return 0, 0, np.empty(0, np.int32), np.empty(0, np.int64), False
            stop = doc_starts[d + 1] if d + 1 < n_docs else n_tok
            if q >= stop or q >= n_tok:
                continue
        toks[m] = tokens[q]
        ends[m] = q
        m += 1
    return hits, sample.shape[0], toks[:m].copy(), ends[:m].copy(), True


@njit(cache=True)
def _any_in(occ, lo, hi, run_lo, run_hi):
    """1 when a position of occ[lo:hi] lies in the runs (the most recent end of the range is
    tried first), 0 if none."""
    for i in range(hi - 1, lo - 1, -1):
        if _selected(run_lo, run_hi, occ[i]):
            return 1
    return 0


@njit(cache=True)
def subset_match(links, lens, plink, occ, occ_start, counts, big, run_lo, run_hi, state, length, k):
    """(state, length, exact): walk up the suffix links from (state, length) to the longest
    suffix with an end position in the runs (all strings of a state share their end
    positions), reading O(k) positions of `occ` whatever the context.

    While the positions of a state not yet read fit in what is left of k, they are all read:
    the walk is exact (a parent's range of `occ` contains its child's, so only the part
    outside is new). From the first state that does not fit, each state is tested on the
    `_sample` its restricted count comes from (so a match found there has a sampled hit), and
    these tests may read SAMPLE_SCAN_FACTOR * k positions in all; past that the walk ends at
    the root. `exact` is False once a sampled test missed or the walk was cut: a longer suffix
    may then occur in the subset. (-2, 0, False) on damaged arrays."""
    n = links.shape[0]
    left = np.int64(k)  # positions still to read exactly
    budget = np.int64(SAMPLE_SCAN_FACTOR) * k  # positions the sampled tests may still read
    sampling = False
    exact = True
    steps = 0
    seen_lo = np.int64(0)
    seen_hi = np.int64(0)
    while state != 0:
        lo, hi = _range(occ, occ_start, counts, big, state)
        if lo == CORRUPT:
            return CORRUPT, 0, False
        nested = seen_hi > seen_lo and lo <= seen_lo and seen_hi <= hi
        new = (seen_lo - lo) + (hi - seen_hi) if nested else hi - lo
        if not sampling and new <= left:
            left -= new
            if nested:
                r = _any_in(occ, lo, seen_lo, run_lo, run_hi)
                if r == 0:
                    r = _any_in(occ, seen_hi, hi, run_lo, run_hi)
            else:
                r = _any_in(occ, lo, hi, run_lo, run_hi)
            seen_lo, seen_hi = lo, hi
        else:
            sampling = True
            c = hi - lo
            cost = c if c <= SAMPLE_SCAN_FACTOR * k else np.int64(k)
            if cost > budget:
                return 0, 0, False
            budget -= cost
            if c <= k:
                r = _any_in(occ, lo, hi, run_lo, run_hi)
            else:
                sample = _sample(occ, lo, hi, k)
                r = _any_in(sample, 0, sample.shape[0], run_lo, run_hi)
                if r == 0:
                    exact = False
        if r == 1:
            return state, length, exact
        p = link_of(links, plink, state)
        steps += 1
        if p < 0 or p >= n or steps > n:
            return CORRUPT, 0, False
        state = p
        length = lens[p]
        if length < 0:
            return CORRUPT, 0, False
    return 0, 0, exact


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
