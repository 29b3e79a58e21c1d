"""The children of one automaton state, as the draft kernel reads them (`draft.expand`).

A gather fills rows of `kids` (int64 [CHILD_BUF, KID_COLS]: token, next state, occurrence count,
most recent end position) with the children of a state and returns their count total and the
most recent end among them (ends of different children are distinct positions, so that end marks
one child: the continuation of the most recent occurrence). `best_first` then moves the best few
to the front. Everything here is inlined into the draft kernel.

- `gather_live`: a state of the live automaton (its edge list). Counts are read through the
  link-cut tree without restructuring it (`lct.py`); the states whose read walked a long splay
  path are noted in `deep`, for the caller to splay once its expansion is done.
- `gather_frozen`: a state of a frozen source (`FrozenPart`), bounds-checked: damaged arrays
  give no children; an implicit state (frozen.py) its one child, read from the text. A state with many children is read through its row of `frozen.top_rows`
  (its best children's records and their count total, side by side).
"""

from collections import namedtuple

import numpy as np
from numba import njit

from . import lct
from . import sam as sk
from .address import view_i32, view_i64_2d, view_u16
from .frozen import (
    N_SOURCE_ARRAYS,
    REC_COLS,
    REC_COUNT,
    REC_LAST,
    REC_TO,
    REC_TOK,
    SOURCE_COLS,
    SRC_COUNTS,
    SRC_TOKENS,
    TOP_PAD,
    implicit_edge,
    source_arrays,
    source_count,
    source_plink,
    top_arrays,
    top_row_len,
)

CHILD_BUF = 512  # children of one state read per expansion (the work per proposal is bounded by it)
WALK_SPLAY = 24  # splay-tree depth past which a count read is followed by a splay (amortization)
DEEP_BUF = 256  # such splays per expansion (past that, reads stay exact but are not splayed)
# rows of the children of one state: token, state, count, last end position
K_TOK, K_STATE, K_COUNT, K_LAST = range(4)
KID_COLS = 4

# The arrays of one frozen source that a gather reads (all int32, read only):
#   offsets     [n_states + 1]  CSR offsets of each state's edges into `records`
#   records     [n_edges * REC_COLS]  edge records (`frozen.edge_records`: token, to, count, last)
#   row_of      [n_states]      a state's row in the top table (-1: few children; may be empty)
#   top_rows    [rows * frozen.top_row_len(width)]  per row, the count total of all the state's
#               children, then the edge records of its best ones (`frozen.top_rows`)
#   n_states    the stored states: every stored state index read is checked to be below it (a
#               damaged source drafts nothing)
#   n_edges     likewise for edge indexes
#   plink       [n_tokens] the implicit states' suffix links (`frozen.py`; empty: none), and the text
#   tok16       (uint16) or tok32 (int32) that their edges read, the other one empty
#   n_ids       n_states + len(plink): every state id read is below it
#   frozen, src the `frozen.source_table` and the row: a state's own count (`frozen.source_count`)
FrozenPart = namedtuple("FrozenPart", "offsets records row_of top_rows n_states n_edges plink tok16 "
                                      "tok32 n_ids frozen src")


@njit(cache=True, nogil=True, inline="always")
def no_frozen_part():
    """An empty `FrozenPart` (no states: every read is out of bounds)."""
    empty = view_i32(0, 0)
    return FrozenPart(empty, empty, empty, empty, 0, 0, empty, view_u16(0, 0), empty, 0,
                      view_i64_2d(0, 0, SOURCE_COLS), np.int64(0))


@njit(cache=True, nogil=True, inline="always")
def frozen_part(frozen, tops, src):
    """The `FrozenPart` of row `src` of a `frozen.source_table` and its `frozen.top_table`."""
    offsets, lasts, _links, records = source_arrays(frozen, src)
    row_of, rows = top_arrays(tops, src)
    n = N_SOURCE_ARRAYS
    n_states = min(offsets.shape[0] - 1, frozen[src, n + SRC_COUNTS], lasts.shape[0])
    plink = source_plink(frozen, src)
    addr, count = frozen[src, SRC_TOKENS], frozen[src, n + SRC_TOKENS]
    wide = frozen[src, 2 * n + SRC_TOKENS] != 2
    tok16 = view_u16(addr, 0 if wide else count)
    tok32 = view_i32(addr, count if wide else 0)
    return FrozenPart(offsets, records, row_of, rows, n_states, records.shape[0] // REC_COLS,
                      plink, tok16, tok32, n_states + plink.shape[0], frozen, np.int64(src))


@njit(cache=True, nogil=True, inline="always")
def implicit_child(fp, v):
    """(token, state) of the only child of implicit state v of a `FrozenPart` (n_states <= v <
    n_ids): (-1, -1) for none, (CORRUPT, CORRUPT) when damaged."""
    if fp.tok16.shape[0]:
        return implicit_edge(fp.tok16, fp.plink, fp.n_states, v)
    return implicit_edge(fp.tok32, fp.plink, fp.n_states, v)


@njit(cache=True, nogil=True, inline="always")
def gather_live(S, E, L, online, v, kids, deep, n_deep):
    """The children of live state v into `kids`: returns (k, total, top, n_deep), `top` the most
    recent end. S, E, L: the automaton's states, edges and link-cut tree; `online`: counts are
    kept through the link-cut tree (else S holds them); `deep` (int32) and `n_deep`: states to
    splay later, appended to."""
    k = 0
    total = 0.0
    top = -1
    e = S[v, sk.HEAD]
    if e != -1 and E[e, sk.NEXT] == -1:
        # one child: its share is 1 whatever its count, so no count read is needed
        kids[0, K_TOK] = E[e, sk.TOK]
        kids[0, K_STATE] = E[e, sk.TO]
        kids[0, K_COUNT] = 1
        kids[0, K_LAST] = 0
        return 1, 1.0, 0, n_deep
    while e != -1 and k < CHILD_BUF:
        w = E[e, sk.TO]
        cnt = S[w, sk.CNT]
        lst = S[w, sk.LAST]
        if online:
            # true values without restructuring: add the pending tags of w's strict ancestors in
            # its splay tree (lct.py); a long path is splayed after the expansion (splaying here
            # would rebind the link-cut stack inside the kernel's loop, which compiles to far
            # slower code), paying for this walk as the amortization needs
            x = w
            steps = 0
            while True:
                y = L[x, lct.PAR]
                if y == -1 or (L[y, lct.CH0] != x and L[y, lct.CH1] != x):
                    break
                x = y
                cnt += L[x, lct.TADD]
                if L[x, lct.TLAST] > lst:
                    lst = L[x, lct.TLAST]
                steps += 1
            if steps > WALK_SPLAY and n_deep < deep.shape[0]:
                deep[n_deep] = w
                n_deep += 1
        kids[k, K_TOK] = E[e, sk.TOK]
        kids[k, K_STATE] = w
        kids[k, K_COUNT] = cnt
        kids[k, K_LAST] = lst
        total += cnt
        if k == 0 or lst > top:
            top = lst
        k += 1
        e = E[e, sk.NEXT]
    return k, total, top, n_deep


@njit(cache=True, nogil=True, inline="always")
def gather_frozen(fp, v, width, min_row, kids):
    """The children of state v of a `FrozenPart` into `kids`: returns (k, total, top). `width`:
    the top table's row width (max_children + 1); `min_row`: states with no more children have
    no top row (`frozen.top_min_children`)."""
    offsets, rec, row_of, rows, n_states, n_edges, _plink, _t16, _t32, n_ids, _f, _s = fp  # unpacked once
    k = 0
    total = 0.0
    top = -1
    if n_states <= v < n_ids:
        # an implicit state: one child (the next position's), count 1, last end its position
        tok, w = implicit_child(fp, v)
        if tok < 0:
            return k, total, top
        kids[0, K_TOK] = tok
        kids[0, K_STATE] = w
        kids[0, K_COUNT] = 1
        kids[0, K_LAST] = w - n_states
        return 1, 1.0, w - n_states
    if not 0 <= v < n_states:
        return k, total, top
    lo = offsets[v]
    hi = offsets[v + 1]
    if not 0 <= lo <= hi <= n_edges:
        return k, total, top
    r = row_of[v] if hi - lo > min_row and v < row_of.shape[0] else -1
    stride = top_row_len(width)
    if r >= 0 and (r + 1) * stride <= rows.shape[0]:
        # a state with many children: its best ones and their count total, precomputed
        # (`frozen.top_rows`), instead of a scan of them all
        o = r * stride
        for i in range(width):
            at = o + 1 + i * REC_COLS
            if rows[at + REC_TOK] == TOP_PAD:
                break
            w = rows[at + REC_TO]
            if w < 0 or w >= n_ids:
                k = 0  # damaged arrays: draft nothing from here
                break
            lst = rows[at + REC_LAST]
            kids[k, K_TOK] = rows[at + REC_TOK]
            kids[k, K_STATE] = w
            kids[k, K_COUNT] = rows[at + REC_COUNT]
            kids[k, K_LAST] = lst
            if k == 0 or lst > top:
                top = lst
            k += 1
        return k, float(rows[o]), top
    for e in range(lo, min(hi, lo + CHILD_BUF)):
        w = rec[REC_COLS * e + REC_TO]
        if w < 0 or w >= n_ids:
            k = 0  # damaged arrays: draft nothing from here
            break
        cnt = rec[REC_COLS * e + REC_COUNT]
        lst = rec[REC_COLS * e + REC_LAST]
        kids[k, K_TOK] = rec[REC_COLS * e + REC_TOK]
        kids[k, K_STATE] = w
        kids[k, K_COUNT] = cnt
        kids[k, K_LAST] = lst
        total += cnt
        if k == 0 or lst > top:
            top = lst
        k += 1
    if hi - lo > CHILD_BUF:
        own = source_count(fp.frozen, fp.src, v)
        if own > total:
            total = float(own)  # children past the bound still hold their share
    return k, total, top


@njit(cache=True, nogil=True, inline="always")
def best_first(kids, k, m, bonus, top):
    """The best m of the k gathered children into rows 0..m-1, by weight (count, plus `bonus` for
    the most recent one: K_LAST == top), ties in gather order: one pass over the k children,
    inserting into the top m (a state may have thousands of children; most are not compared twice).
    Written out without helper calls: an inlined call taking `kids` costs a reference count per
    comparison here."""
    for i in range(1, k):
        wi = kids[i, K_COUNT] + (bonus if kids[i, K_LAST] == top else 0.0)
        j = i
        if i >= m:
            if not wi > kids[m - 1, K_COUNT] + (bonus if kids[m - 1, K_LAST] == top else 0.0):
                continue
            for col in range(KID_COLS):
                kids[i, col], kids[m - 1, col] = kids[m - 1, col], kids[i, col]
            j = m - 1
        while j > 0 and wi > kids[j - 1, K_COUNT] + (bonus if kids[j - 1, K_LAST] == top else 0.0):
            for col in range(KID_COLS):
                kids[j, col], kids[j - 1, col] = kids[j - 1, col], kids[j, col]
            j -= 1
