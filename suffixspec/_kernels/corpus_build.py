"""Counts, last ends and the occurrence layout of a corpus shard, from its frozen automaton.

Besides the frozen automaton arrays (frozen.py; built by `bulk_sam.build_rows`, the same
construction as every automaton's in another layout) a shard has an *occurrence layout*, which only
document-restricted queries read (so it is computed by the reader, on the first such query,
not stored):

- `occ` int32[n_tokens]: every end position of the shard, ordered by a depth-first preorder of
  the suffix-link tree (each position sits at the deepest state whose strings end there: the
  state of its whole document prefix), so the end positions of any state v are the contiguous
  range `occ[occ_start[v] : occ_start[v] + counts[v]]`;
- `occ_start` int32[n_states].

`count_ends` turns the state of each position's whole document prefix (recorded by the build,
`bulk_sam.build_rows` or `build.documents_automaton`, or found by `prefix_states`, a walk of a frozen automaton) into
counts and last ends; `place_occurrences` lays the positions out from the counts, checking them
against the suffix links; `build_occurrences` does both; `place_occurrences_frozen` is the same
placement over a frozen shard's ids (implicit states too) with rows for its stored states only (what
a reader runs). The query kernels over the layout are in corpus_query.py."""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .address import borrowed
from .frozen import CORRUPT, HOLE, count_of, implicit_link, transition

PREFETCH_AHEAD = 32  # loop steps between a prefetch and the use of what it fetches
# scratch rows of `count_ends` (int32[n_states, >= W_COLS]): own then subtree count, last end
W_CNT, W_LAST = 0, 1
W_COLS = 2
# scratch rows of `place_occurrences` (int32[n_states, >= P_COLS]): subtree start, placement cursor
P_START, P_CURSOR = 0, 1
P_COLS = 2


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


@njit(cache=True, nogil=True)
def prefix_states(offsets, etok, eto, tokens, plink, doc_starts):
    """State of each position's whole document prefix (-2 for a damaged automaton); `plink`: the
    implicit states' links (frozen.py), empty for none."""
    n = tokens.shape[0]
    out = np.empty(n, np.int32)
    d = 0
    n_docs = doc_starts.shape[0]
    state = 0
    o, et, ed, tx, pl = borrowed(offsets), borrowed(etok), borrowed(eto), borrowed(tokens), borrowed(plink)
    for p in range(n):
        if d < n_docs and doc_starts[d] == p:
            state = 0
            while d < n_docs and doc_starts[d] == p:
                d += 1
        state = transition(o, et, ed, tx, pl, state, tokens[p])
        if state < 0:
            out[0] = CORRUPT
            return out
        out[p] = state
    return out


@njit(cache=True)
def count_ends(links, lens, pstate, counts, lasts, W):
    """counts, lasts int32[n_states] of an automaton from `pstate` (the state of each position's
    whole document prefix): counts[v], the positions whose prefix state is v or below it in the
    suffix-link tree; lasts[v], the greatest of them (-1: none). `W` int32[>= n_states, W_COLS] is
    scratch (one 8-byte row per state; `counts` and `lasts` may be its columns). False when the
    counts disagree with the suffix links (an automaton that does not describe its tokens: a link
    out of range or in a cycle, a state out of range in `pstate`).

    Subtree sums in one sweep of the states by decreasing id, in any link tree: a state's sums go
    to its suffix link's row; when that state has a greater id (an automaton's clone, made after the
    states it splits) its own sums have gone up already, so the child's are carried on through such
    ancestors to the first one of smaller id, which has yet to pass its sums on (in an automaton's
    tree about one such step per state: the clones made after it above each state). The rows read
    in order; the parents' rows, scattered, are prefetched PREFETCH_AHEAD steps ahead."""
    # views without reference counts (the caller holds the arrays)
    links, lens, pstate, counts, lasts, W = (borrowed(links), borrowed(lens), borrowed(pstate), borrowed(counts),
                                             borrowed(lasts), borrowed(W))
    ns = links.shape[0]
    n = pstate.shape[0]
    ahead = PREFETCH_AHEAD
    if W.shape[0] < ns or W.shape[1] < W_COLS or lens.shape[0] < ns:
        return False
    if not (ns > 0 and links[0] == -1 and lens[0] == 0):
        return False
    for v in range(ns):
        W[v, W_CNT] = 0
        W[v, W_LAST] = -1
    for p in range(n):
        st = pstate[p]
        if st < 0 or st >= ns:
            return False
        W[st, W_CNT] += 1
        W[st, W_LAST] = p
    for v in range(ns - 1, 0, -1):
        if v > ahead:
            u = links[v - ahead]
            if 0 <= u < ns:
                _prefetch(W, u)
        p = links[v]
        if p < 0 or p >= ns or p == v or lens[v] < 0:
            return False
        c = W[v, W_CNT]
        last = W[v, W_LAST]
        while True:
            W[p, W_CNT] += c
            if last > W[p, W_LAST]:
                W[p, W_LAST] = last
            if p < v:  # not swept yet: it passes v's sums on with its own
                break
            p = links[p]
            if p == v or p < 0:  # a cycle of suffix links (found at its least state), or the root's link
                return False
    if W[0, W_CNT] != n:
        return False
    row = W.strides[0]
    if (counts.ctypes.data == W.ctypes.data + W_CNT * W.strides[1] and counts.strides[0] == row
            and lasts.ctypes.data == W.ctypes.data + W_LAST * W.strides[1] and lasts.strides[0] == row):
        return True  # the outputs are the scratch's own columns: in place already
    for v in range(ns):
        counts[v] = W[v, W_CNT]
        lasts[v] = W[v, W_LAST]
    return True


@njit(cache=True, nogil=True)
def place_occurrences(links, counts, pstate, occ, occ_start, W):
    """The occurrence layout occ int32[n_tokens], occ_start int32[n_states] from the suffix links,
    the counts and `pstate`: occ lists every state's positions in suffix-link-tree preorder (a
    state's own positions increasing, then its children's subtrees in state-number order) and
    occ_start[v] is where v's subtree starts. `W` int32[>= n_states, >= P_COLS] is scratch. False when
    the arrays disagree (a subtree not filled exactly by its count, a suffix-link cycle, a state
    out of range): every array may come from a damaged file."""
    ns = links.shape[0]
    n = pstate.shape[0]
    ahead = PREFETCH_AHEAD
    if W.shape[0] < ns or W.shape[1] < P_COLS or counts.shape[0] < ns or occ.shape[0] < n or occ_start.shape[0] < ns:
        return False
    if not (ns > 0 and links[0] == -1 and counts[0] == n):
        return False
    for v in range(ns):
        W[v, P_CURSOR] = 0  # own positions, kept for the placement below
        W[v, P_START] = -1
        c = counts[v]
        if c < 0 or c > n or (v > 0 and (links[v] < 0 or links[v] >= ns)):
            return False
    for p in range(n):
        st = pstate[p]
        if st < 0 or st >= ns:
            return False
        W[st, P_CURSOR] += 1
    # placement in suffix-link-tree preorder without building the tree: a state's subtree holds
    # counts[v] positions, so it goes right after its parent's own positions and its earlier-placed
    # siblings (states in number order, a chain of unplaced ancestors placed top-down first)
    chain = occ_start  # written only after the placement: its first rows are the chain stack meanwhile
    W[0, P_START] = 0
    for v in range(1, ns):
        if v + 2 * ahead < ns:  # the parent's row, and a step later the grandparent's (a clone's chain)
            u = links[v + 2 * ahead]
            _prefetch(W, u)
            _prefetch(links, u)
            g = links[links[v + ahead]]
            if g >= 0:
                _prefetch(W, g)
        if W[v, P_START] >= 0:
            continue
        top = 0
        u = v
        while W[u, P_START] < 0:
            if top >= ns:  # a cycle of suffix links
                return False
            chain[top] = u
            top += 1
            u = links[u]
        while top > 0:
            top -= 1
            w = chain[top]
            par = links[w]
            start = W[par, P_CURSOR]
            if np.int64(start) + counts[w] > n:  # more positions than the shard has
                return False
            W[w, P_START] = start
            W[par, P_CURSOR] = start + counts[w]
            W[w, P_CURSOR] = start + W[w, P_CURSOR]
    for v in range(ns):
        if np.int64(W[v, P_CURSOR]) != np.int64(W[v, P_START]) + counts[v]:  # every subtree filled exactly
            return False
    for v in range(ns):
        occ_start[v] = W[v, P_START]
        W[v, P_CURSOR] = W[v, P_START]
    for p in range(n):
        if p + ahead < n:
            _prefetch(W, pstate[p + ahead])
        st = pstate[p]
        k = W[st, P_CURSOR]
        if k < 0 or k >= n:
            return False
        occ[k] = p
        W[st, P_CURSOR] = k + 1
    return True


@njit(cache=True, nogil=True)
def place_occurrences_frozen(links, counts, big, plink, pstate, occ, occ_start, W):
    """`place_occurrences` over a frozen shard's ids (frozen.py: n stored states, then n + p for
    every position p, implicit or a hole) without a row per implicit id: the same occ and occ_start
    int32[n + n_tokens] (of a hole, its parent's cursor: no positions). An implicit state n + p is a
    leaf holding p alone and outnumbers every stored state, so it follows its parent's own positions
    and stored children's subtrees, implicit siblings in position order: the stored states are
    placed as `place_occurrences` does, then one pass over the positions files each implicit state
    and each hole's position. `W` int32[>= n, >= P_COLS] is scratch. False when the arrays disagree
    (as `place_occurrences`; also a position whose prefix state is not its implicit state, or is
    implicit where `plink` has a hole)."""
    ns = links.shape[0]
    n = pstate.shape[0]
    ahead = PREFETCH_AHEAD
    if (W.shape[0] < ns or W.shape[1] < P_COLS or counts.shape[0] < ns or plink.shape[0] != n or occ.shape[0] < n
            or occ_start.shape[0] < ns + n):
        return False
    if not (ns > 0 and links[0] == -1 and count_of(counts, big, 0) == n):
        return False
    for v in range(ns):
        W[v, P_CURSOR] = 0  # own positions (holes' only: implicit states own theirs)
        W[v, P_START] = -1
        c = count_of(counts, big, v)
        if c < 0 or c > n or (v > 0 and (links[v] < 0 or links[v] >= ns)):
            return False
    for p in range(n):
        st = pstate[p]
        if plink[p] == HOLE:
            if st < 0 or st >= ns:
                return False
            W[st, P_CURSOR] += 1
        elif st != ns + p:
            return False
    chain = occ_start  # its first rows: the chain stack (written over below)
    W[0, P_START] = 0
    for v in range(1, ns):
        if v + 2 * ahead < ns:
            u = links[v + 2 * ahead]
            _prefetch(W, u)
            _prefetch(links, u)
            g = links[links[v + ahead]]
            if g >= 0:
                _prefetch(W, g)
        if W[v, P_START] >= 0:
            continue
        top = 0
        u = v
        while W[u, P_START] < 0:
            if top >= ns:  # a cycle of suffix links
                return False
            chain[top] = u
            top += 1
            u = links[u]
        while top > 0:
            top -= 1
            w = chain[top]
            par = links[w]
            start = W[par, P_CURSOR]
            c = count_of(counts, big, w)
            if np.int64(start) + c > n:
                return False
            W[w, P_START] = start
            W[par, P_CURSOR] = start + c
            W[w, P_CURSOR] = start + W[w, P_CURSOR]
    # W[v, P_CURSOR]: where v's implicit children go; occ_start[v]: its own positions' cursor
    for v in range(ns):
        occ_start[v] = W[v, P_START]
    for p in range(n):
        if p + ahead < n:
            w = plink[p + ahead]
            if w != HOLE:
                _prefetch(W, w if w >= 0 else ~w)
        if plink[p] == HOLE:
            st = pstate[p]
            k = occ_start[st]
            if k < 0 or k >= n:
                return False
            occ[k] = p
            occ_start[st] = k + 1
            occ_start[ns + p] = W[0, P_CURSOR]
        else:
            w = implicit_link(plink, ns, ns + p)
            if w < 0:
                return False
            k = W[w, P_CURSOR]
            if k < 0 or k >= n:
                return False
            occ[k] = p
            occ_start[ns + p] = k
            W[w, P_CURSOR] = k + 1
    for v in range(ns):  # every subtree filled exactly
        if np.int64(W[v, P_CURSOR]) != np.int64(W[v, P_START]) + count_of(counts, big, v):
            return False
        occ_start[v] = W[v, P_START]
    return True


@njit(cache=True)
def build_occurrences(links, lens, pstate, counts, lasts, occ, occ_start, W):
    """`count_ends` then `place_occurrences` (the counts, last ends and occurrence layout in one
    call); False when either finds the arrays inconsistent."""
    if not count_ends(links, lens, pstate, counts, lasts, W):
        return False
    return place_occurrences(links, counts, pstate, occ, occ_start, W)
