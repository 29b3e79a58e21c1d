"""Bulk construction, occurrence layout and document-restricted queries of one corpus shard.

Besides the frozen automaton arrays (see frozen.py) a shard stores its *occurrence layout*:

- `occ` int32[n_tokens]: every end position of the shard, ordered by a depth-first preorder of
  the suffix-link tree (each position sits at the deepest state whose strings end there: the
  state of its whole document prefix), so the end positions of any state v are the contiguous
  range `occ[occ_start[v] : occ_start[v] + counts[v]]`;
- `occ_start` int32[n_states].

A document subset reaches the query kernels as *runs*: sorted, disjoint position ranges
`[run_lo[i], run_hi[i])` of the shard covering exactly its selected documents (neighbouring
selected documents merged), so testing a position is a binary search over few runs (often one:
a repository's files are contiguous). `doc_starts` is searched only to find where the document
of a selected position ends.

The arrays may be memory-mapped from a damaged file: every index read from an array is
range-checked first and the query kernels return CORRUPT (-2) instead of reading out of bounds.
"""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .frozen import CORRUPT, transition

PREFETCH_AHEAD = 32  # loop steps between a prefetch and the use of what it fetches
SAMPLE_SCAN_FACTOR = 8  # a range up to SAMPLE_SCAN_FACTOR * K long is searched for its K most recent positions


# -- building ------------------------------------------------------------------------------


# The shard builder constructs the same automaton as `sam.py` (same algorithm, states numbered
# alike, same edges, so the frozen arrays are identical) in a layout made for one bulk pass,
# where the time goes into dependent cache misses along suffix-link walks:
#
# - `S` int32[cap, 8], 32-byte rows (cache-line aligned by the caller): LINK, LEN, DEG, HEAD
#   (first overflow edge, -1 for none), then the first two edges inline: T0, D0, T1, D1
#   (token -1 for an empty slot). Most states have one or two edges, so most edge lookups read
#   only the state row, which the suffix-link walk reads anyway.
# - `E` int32[cap, 4]: overflow edges (the third and later of a state): SRC, TOK, TO, NEXT.
# - `H` int32[2**b, 4]: linear-probing hash of the overflow edges, rows SRC, TOK, TO, ROW (the
#   edge's row in E), SRC -1 for empty, at most 70% full: a lookup reads one or two cache lines
#   (TO is kept equal to E's).
# - `R` int32[max token + 1]: the root's edges, dense (-1: none).
# - `P` int32[n_tokens]: the state of each position's whole document prefix (the state the
#   extension ended in), recorded on the way (counts, last ends and occurrences come from it).
# - `BM` int64[B_META]: NS (states), NE (overflow rows), POS (tokens in),
#   LAST (state of the current document), DOC (next document start), EDGES (all edges).

B_LINK, B_LEN, B_DEG, B_HEAD, B_T0, B_D0, B_T1, B_D1 = 0, 1, 2, 3, 4, 5, 6, 7
B_COLS = 8
E_SRC, E_TOK, E_TO, E_NEXT = 0, 1, 2, 3
B_NS, B_NE, B_POS, B_LAST, B_DOC, B_EDGES = 0, 1, 2, 3, 4, 5
B_META = 6
H_SRC, H_TOK, H_TO, H_ROW = 0, 1, 2, 3
REF_ROOT, REF_T0, REF_T1, REF_NONE, REF_HASH = -4, -2, -3, -1, -5
B_LOAD_NUM, B_LOAD_DEN = 7, 10
E_COLS = 4
H_COLS = 4
# scratch rows of `build_occurrences` (int32[n_states, W_COLS]): own then subtree count, last end,
# subtree start, placement cursor
W_CNT, W_LAST, W_START, W_CURSOR = 0, 1, 2, 3
W_COLS = 4


@intrinsic
def _prefetch(typingctx, arr, i):
    """Hint the CPU to fetch the cache line of arr[i] (the first element of row i of a 2-D
    C-contiguous array) while other work goes on; no effect on results, never faults."""

    def codegen(context, builder, sig, args):
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        idx = [context.cast(builder, args[1], sig.args[1], types.intp)] + [context.get_constant(types.intp, 0)] * (aryty.ndim - 1)
        ptr = cgutils.get_item_pointer2(context, builder, data=ary.data, shape=cgutils.unpack_tuple(builder, ary.shape),
                                        strides=cgutils.unpack_tuple(builder, ary.strides), layout=aryty.layout, inds=idx,
                                        boundscheck=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(arr, i), codegen


@njit(cache=True, inline="always")
def _bslot(src, tok, mask):
    key = (np.uint64(src) << np.uint64(32)) | np.uint64(tok)
    h = key * np.uint64(0x9E3779B97F4A7C15)
    return np.int64((h >> np.uint64(29)) & np.uint64(mask))


@njit(cache=True, inline="always")
def _bfind(S, H, R, p, c):
    """(target, ref) of the edge p --c-->, target -1 if none; ref says where the edge lives
    (REF_ROOT, REF_T0, REF_T1, or REF_HASH - its hash slot) for `_bset`."""
    if p == 0:
        return R[c], REF_ROOT
    if S[p, B_T0] == c:
        return S[p, B_D0], REF_T0
    if S[p, B_T1] == c:
        return S[p, B_D1], REF_T1
    if S[p, B_DEG] <= 2:
        return -1, REF_NONE
    mask = H.shape[0] - 1
    i = _bslot(p, c, mask)
    while True:
        src = H[i, H_SRC]
        if src == -1:
            return -1, REF_NONE
        if src == p and H[i, H_TOK] == c:
            return H[i, H_TO], REF_HASH - i
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def _bset(S, E, H, R, p, c, ref, dst):
    if ref == REF_ROOT:
        R[c] = dst
    elif ref == REF_T0:
        S[p, B_D0] = dst
    elif ref == REF_T1:
        S[p, B_D1] = dst
    else:
        i = REF_HASH - ref
        H[i, H_TO] = dst
        E[H[i, H_ROW], E_TO] = dst


@njit(cache=True, inline="always")
def _bhash(E, H, e):
    mask = H.shape[0] - 1
    src = E[e, E_SRC]
    tok = E[e, E_TOK]
    i = _bslot(src, tok, mask)
    while H[i, H_SRC] != -1:
        i = (i + 1) & mask
    H[i, H_SRC] = src
    H[i, H_TOK] = tok
    H[i, H_TO] = E[e, E_TO]
    H[i, H_ROW] = e


@njit(cache=True, inline="always")
def _bpush(S, E, H, R, ne, p, c, dst):
    """Add the edge p --c--> dst (room guaranteed by the caller); returns the new ne."""
    deg = S[p, B_DEG]
    S[p, B_DEG] = deg + 1
    if p == 0:
        R[c] = dst
    elif deg == 0:
        S[p, B_T0] = c
        S[p, B_D0] = dst
    elif deg == 1:
        S[p, B_T1] = c
        S[p, B_D1] = dst
    else:
        E[ne, E_SRC] = p
        E[ne, E_TOK] = c
        E[ne, E_TO] = dst
        E[ne, E_NEXT] = S[p, B_HEAD]
        S[p, B_HEAD] = ne
        _bhash(E, H, ne)
        ne += 1
    return ne


@njit(cache=True, inline="always")
def _binit(S, v, length, link):
    S[v, B_LINK] = link
    S[v, B_LEN] = length
    S[v, B_DEG] = 0
    S[v, B_HEAD] = -1
    S[v, B_T0] = -1
    S[v, B_D0] = -1
    S[v, B_T1] = -1
    S[v, B_D1] = -1


@njit(cache=True)
def build_init(S, R, BM):
    """Reset a build: the root only."""
    _binit(S, 0, 0, -1)
    R[:] = -1
    BM[:] = 0
    BM[B_NS] = 1


@njit(cache=True)
def build_run(S, E, H, R, T, doc_starts, P, BM):
    """Extend the build in BM with T[BM[POS]:] (documents start at `doc_starts`, sorted) for as
    long as E and H have room; S must hold 2 * len(T) + 1 rows (a token adds at most two
    states). Never reallocates (arrays that a loop may rebind make numba emit far slower
    code). Each token first walks its suffix-link path read-only, to learn how many edges it
    may add; if they might not fit it returns that number (> 0) before touching anything, the
    caller grows E or H (`build_rehash`) and calls again. Returns 0 when every token is in.
    Each step of a walk prefetches the hash slot of (state, token) while the state's row loads,
    so a lookup that reaches the hash costs no second serial miss.

    The same algorithm and numbering as `sam._extend_bulk` (new state, then clone)."""
    n = T.shape[0]
    ns = BM[B_NS]
    ne = BM[B_NE]
    pos = BM[B_POS]
    last = BM[B_LAST]
    d = BM[B_DOC]
    tot = BM[B_EDGES]
    n_docs = doc_starts.shape[0]
    cap_e = E.shape[0]
    cap_h = (H.shape[0] * B_LOAD_NUM) // B_LOAD_DEN
    hmask = H.shape[0] - 1
    need = 0
    while pos < n:
        while d < n_docs and doc_starts[d] <= pos:
            last = 0
            d += 1
        c = T[pos]
        last_len = S[last, B_LEN]
        # -- read-only walk: first state p (from `last` up) with an edge c, and k = edges to add
        k = 0
        p = last
        if last != 0 and S[last, B_DEG] == 0:
            dst = -1
            ref = REF_NONE
        else:
            dst, ref = _bfind(S, H, R, last, c)
        if dst == -1:
            k = 1
            p = S[last, B_LINK]
            while p != -1:
                if p != 0:  # the hash slot of (p, c), fetched alongside p's row
                    _prefetch(H, _bslot(p, c, hmask))
                dst, ref = _bfind(S, H, R, p, c)
                if dst != -1:
                    break
                k += 1
                p = S[p, B_LINK]
        q = dst
        clone = False
        if q != -1:
            clone = S[q, B_LEN] != S[p, B_LEN] + 1
        need = k + (S[q, B_DEG] if clone else 0)
        if ne + need > cap_e or ne + need > cap_h:
            need = max(need, 1)
            break
        need = 0
        # -- apply
        if k == 0 and not clone:
            cur = q  # generalized automaton: the new prefix already occurs (after a document start)
        else:
            if k == 0:
                cur = -1
            else:
                cur = ns
                _binit(S, cur, last_len + 1, -1)
                ns += 1
                tot += k
                r = last
                for _ in range(k):
                    ne = _bpush(S, E, H, R, ne, r, c, cur)
                    r = S[r, B_LINK]
            if p == -1:
                link = 0
            elif not clone:
                link = q
            else:
                cl = ns
                ns += 1
                S[cl, B_LINK] = S[q, B_LINK]
                S[cl, B_LEN] = S[p, B_LEN] + 1
                S[cl, B_DEG] = 2 if S[q, B_DEG] >= 2 else S[q, B_DEG]
                S[cl, B_HEAD] = -1
                S[cl, B_T0] = S[q, B_T0]
                S[cl, B_D0] = S[q, B_D0]
                S[cl, B_T1] = S[q, B_T1]
                S[cl, B_D1] = S[q, B_D1]
                tot += S[q, B_DEG]
                # overflow edges: pushed in q's list order, as sam.py copies them
                f = S[q, B_HEAD]
                while f != -1:
                    ne = _bpush(S, E, H, R, ne, cl, E[f, E_TOK], E[f, E_TO])
                    f = E[f, E_NEXT]
                S[q, B_LINK] = cl
                while True:
                    _bset(S, E, H, R, p, c, ref, cl)
                    p = S[p, B_LINK]
                    if p == -1:
                        break
                    if p != 0:
                        _prefetch(H, _bslot(p, c, hmask))
                    dst, ref = _bfind(S, H, R, p, c)
                    if dst != q:
                        break
                link = cl
            if cur == -1:
                cur = link  # generalized case with a clone: the clone is the new prefix's state
            else:
                S[cur, B_LINK] = link
        last = cur
        P[pos] = cur
        pos += 1
    BM[B_NS] = ns
    BM[B_NE] = ne
    BM[B_POS] = pos
    BM[B_LAST] = last
    BM[B_DOC] = d
    BM[B_EDGES] = tot
    return need


@njit(cache=True)
def build_rehash(E, H, ne):
    """Fill the empty table H with the overflow edges E[:ne]."""
    for e in range(ne):
        _bhash(E, H, e)


@njit(cache=True, inline="always")
def _sort_pairs(keys, vals, lo, hi):
    """Sort keys[lo:hi] ascending (distinct keys), moving vals along, in place and without
    allocating: Shell sort (Ciura's gaps, extended by x2.25), plain insertion sort on short ranges."""
    n = hi - lo
    gaps = (90927, 40412, 17961, 7983, 3548, 1577, 701, 301, 132, 57, 23, 10, 4, 1)
    for gap in gaps:
        if gap >= n:
            continue
        for a in range(lo + gap, hi):
            t = keys[a]
            d = vals[a]
            b = a - gap
            while b >= lo and keys[b] > t:
                keys[b + gap] = keys[b]
                vals[b + gap] = vals[b]
                b -= gap
            keys[b + gap] = t
            vals[b + gap] = d


@njit(cache=True)
def build_freeze(S, E, R, BM, links, lens, offsets, etok, eto):
    """Write the frozen CSR arrays of the build (as `sam.to_csr_into` and the LINK and LEN
    columns of `sam.state_columns_into` give them). One sequential pass over the states writes
    links, lengths, offsets, the root row and the inline edges; the overflow edges are then
    scattered in E order (each state's next free slot kept in its HEAD cell, which is no longer
    needed: S is spent afterwards), and the rows of states with more than two edges sorted.
    Returns the number of edges written."""
    ns = BM[B_NS]
    ne = BM[B_NE]
    off = 0
    for v in range(ns):
        links[v] = S[v, B_LINK]
        lens[v] = S[v, B_LEN]
        offsets[v] = off
        deg = S[v, B_DEG]
        if v == 0:
            for t in range(R.shape[0]):
                if R[t] != -1:
                    etok[off] = t
                    eto[off] = R[t]
                    off += 1
            continue
        if deg == 0:
            continue
        t0 = S[v, B_T0]
        if deg == 1:
            etok[off] = t0
            eto[off] = S[v, B_D0]
            off += 1
            continue
        t1 = S[v, B_T1]
        if t0 < t1:
            etok[off] = t0
            eto[off] = S[v, B_D0]
            etok[off + 1] = t1
            eto[off + 1] = S[v, B_D1]
        else:
            etok[off] = t1
            eto[off] = S[v, B_D1]
            etok[off + 1] = t0
            eto[off + 1] = S[v, B_D0]
        S[v, B_HEAD] = off + 2
        off += deg
    offsets[ns] = off
    for e in range(ne):
        v = E[e, E_SRC]
        k = S[v, B_HEAD]
        etok[k] = E[e, E_TOK]
        eto[k] = E[e, E_TO]
        S[v, B_HEAD] = k + 1
    for v in range(1, ns):
        lo = offsets[v]
        hi = offsets[v + 1]
        if hi - lo > 2:
            _sort_pairs(etok, eto, lo, hi)
    return off


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
def build_occurrences(links, lens, pstate, counts, lasts, occ, occ_start, W, order):
    """counts, lasts int32[n_states] and the occurrence layout occ int32[n_tokens], occ_start
    int32[n_states] of an automaton from `pstate` (the state of each position's whole document
    prefix). counts[v]: the positions whose prefix state is v or below it in the suffix-link tree;
    lasts[v]: the greatest of them (-1: none); occ lists every state's positions in suffix-link-tree
    preorder (a state's own positions increasing, then its children's subtrees in state-number
    order) and occ_start[v] is where v's subtree starts. One kernel whose scattered accesses each
    touch one 16-byte scratch row per state (own count then subtree count, last end, start,
    cursor), prefetched PREFETCH_AHEAD steps ahead where the loop's order allows. `W` int32[>= n_states, W_COLS] and `order` int32[>= n_states] are scratch (e.g. the
    spent builder's memory, already mapped). False when the layout disagrees with the counts
    (an automaton that does not describe its tokens)."""
    ns = links.shape[0]
    n = pstate.shape[0]
    ahead = PREFETCH_AHEAD
    if W.shape[0] < ns or W.shape[1] < W_COLS or order.shape[0] < ns:
        return False
    for v in range(ns):
        W[v, W_CNT] = 0
        W[v, W_LAST] = -1
        W[v, W_START] = -1
    for p in range(n):
        st = pstate[p]
        if st < 0 or st >= ns:
            return False
        W[st, W_CNT] += 1
        W[st, W_LAST] = p
    if not (ns > 0 and links[0] == -1 and lens[0] == 0):
        return False
    max_len = 0
    for v in range(ns):
        W[v, W_CURSOR] = W[v, W_CNT]  # own positions, kept for the placement below
        if lens[v] > max_len:
            max_len = lens[v]
        if v > 0 and (links[v] < 0 or links[v] >= ns):
            return False
    # subtree sums deepest first (counting sort by length): a state's sums are final before its parent reads them
    bucket = np.zeros(max_len + 2, np.int64)
    for v in range(ns):
        bucket[lens[v] + 1] += 1
    for i in range(1, max_len + 2):
        bucket[i] += bucket[i - 1]
    for v in range(ns):
        ln = lens[v]
        order[bucket[ln]] = v
        bucket[ln] += 1
    for k in range(ns - 1, 0, -1):
        if k >= 2 * ahead:
            u = order[k - 2 * ahead]
            _prefetch(links, u)
            _prefetch(W, u)
            _prefetch(W, links[order[k - ahead]])
        v = order[k]
        p = links[v]
        W[p, W_CNT] += W[v, W_CNT]
        if W[v, W_LAST] > W[p, W_LAST]:
            W[p, W_LAST] = W[v, W_LAST]
    if W[0, W_CNT] != n:
        return False
    for v in range(ns):
        counts[v] = W[v, W_CNT]
        lasts[v] = W[v, W_LAST]
    # placement in suffix-link-tree preorder without building the tree: a state's subtree holds
    # counts[v] positions, so it goes right after its parent's own positions and its earlier-placed
    # siblings (states in number order, a chain of unplaced ancestors placed top-down first)
    chain = order  # spent: reused as the chain stack (its first rows only)
    W[0, W_START] = 0
    for v in range(1, ns):
        if v + 2 * ahead < ns:  # the parent's row, and a step later the grandparent's (a clone's chain)
            u = links[v + 2 * ahead]
            _prefetch(W, u)
            _prefetch(links, u)
            g = links[links[v + ahead]]
            if g >= 0:
                _prefetch(W, g)
        if W[v, W_START] >= 0:
            continue
        top = 0
        u = v
        while W[u, W_START] < 0:
            if top >= ns:  # a cycle of suffix links
                return False
            chain[top] = u
            top += 1
            u = links[u]
        while top > 0:
            top -= 1
            w = chain[top]
            par = links[w]
            start = W[par, W_CURSOR]
            W[w, W_START] = start
            W[par, W_CURSOR] = start + W[w, W_CNT]
            W[w, W_CURSOR] = start + W[w, W_CURSOR]
    for v in range(ns):
        if np.int64(W[v, W_CURSOR]) != np.int64(W[v, W_START]) + W[v, W_CNT]:  # every subtree filled exactly
            return False
        occ_start[v] = W[v, W_START]
        W[v, W_CURSOR] = W[v, W_START]
    for p in range(n):
        if p + ahead < n:
            _prefetch(W, pstate[p + ahead])
        st = pstate[p]
        k = W[st, W_CURSOR]
        occ[k] = p
        W[st, W_CURSOR] = k + 1
    return True


# -- restricted queries ----------------------------------------------------------------------


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
def subset_sample(occ, occ_start, counts, doc_starts, tokens, run_lo, run_hi, state, k):
    """(hits, sampled, next_tokens, next_ends, ok) over the `_sample` of `state`'s end positions
    (all of them when counts[state] <= k): `hits` of the `sampled` positions lie in the runs;
    for each such position p not at its document's end, the token at p + 1 and p + 1. The root
    (the empty string) is followed by every token: there p itself. ok is False on damaged
    arrays."""
    shift = 0 if state == 0 else 1
    lo, hi = _range(occ, occ_start, counts, state)
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
def subset_match(offsets, etok, eto, links, lens, occ, occ_start, counts, run_lo, run_hi, state, length, k):
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
        lo, hi = _range(occ, occ_start, counts, state)
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
        p = links[state]
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
