"""Queries over the frozen (read-only, CSR) automaton layout.

Arrays: `links`, `lens`, `counts`, `lasts` int32[n_states]; `offsets` int64[n_states + 1], int32
in a `source_table` (edges of state v are offsets[v]:offsets[v+1]); `etok`, `eto` int32[n_edges],
sorted by token within each state (a corpus shard's `etok` and `lens` may be uint16: every
kernel reads either in place, a `source_table` too; see LEN_SATURATED). They may be memory-mapped from a file that was damaged after
its header was checked, so every index read from an array is range-checked before it is
followed: a kernel returns CORRUPT (-2) instead of reading out of bounds, and callers raise.
"""

import numpy as np
from numba import njit

from ..errors import InternalError
from .address import address, view_i32, view_u16
from .follow import follow

CORRUPT = -2
# In uint16 lengths (a corpus shard's), this value is a saturated length: the state is no state's
# suffix link (the only lengths a query reads are those of suffix links, all below it), and its
# length is that of its document's prefix up to its last end (`FrozenAutomaton.state_length`).
LEN_SATURATED = 65535


@njit(cache=True)
def transition(offsets, etok, eto, state, tok):
    n = offsets.shape[0] - 1
    m = etok.shape[0]
    if state < 0 or state >= n:
        return CORRUPT
    lo = offsets[state]
    hi = offsets[state + 1]
    if lo < 0 or hi > m or lo > hi:
        return CORRUPT
    while lo < hi:
        mid = (lo + hi) >> 1
        t = etok[mid]
        if t < tok:
            lo = mid + 1
        elif t > tok:
            hi = mid
        else:
            d = eto[mid]
            if d < 0 or d >= n:
                return CORRUPT
            return d
    return -1


@njit(cache=True, nogil=True, inline="always")
def edge_to(g, state, tok):
    """`follow`'s lookup over g = (offsets, etok, eto, links, lens)."""
    return transition(g[0], g[1], g[2], state, tok)


@njit(cache=True, nogil=True, inline="always")
def link_up(g, state, steps):
    """`follow`'s suffix-link step over g = (offsets, etok, eto, links, lens): CORRUPT for a link
    outside the states, a negative length, or more steps than states (a cycle)."""
    n = g[0].shape[0] - 1
    p = g[3][state]
    if p < 0 or p >= n or steps > n:
        return CORRUPT, 0
    length = g[4][p]
    if length < 0:
        return CORRUPT, 0
    return p, length


@njit(cache=True)
def advance(offsets, etok, eto, links, lens, state, length, tokens):
    n = offsets.shape[0] - 1
    # a cursor taken on an earlier snapshot of a growing automaton: its strings of the
    # current length may have moved to a clone on the suffix-link path
    guard = 0
    while state > 0 and guard <= n:
        p = links[state]
        if p < 0 or p >= n:
            return CORRUPT, 0
        if lens[p] < length:
            break
        state = p
        guard += 1
    g = (offsets, etok, eto, links, lens)
    for j in range(tokens.shape[0]):
        state, length, _ = follow(edge_to, link_up, g, state, length, tokens[j])
        if state == CORRUPT:
            return CORRUPT, 0
    return state, length


@njit(cache=True)
def locate(offsets, etok, eto, pattern):
    state = 0
    for j in range(pattern.shape[0]):
        state = transition(offsets, etok, eto, state, pattern[j])
        if state < 0:
            return state
    return state


@njit(cache=True)
def out_edges(offsets, etok, eto, state):
    n = offsets.shape[0] - 1
    m = etok.shape[0]
    if state < 0 or state >= n:
        return np.empty(0, np.int32), np.empty(0, np.int32), False
    lo = offsets[state]
    hi = offsets[state + 1]
    if lo < 0 or hi > m or lo > hi:
        return np.empty(0, np.int32), np.empty(0, np.int32), False
    dst = eto[lo:hi].astype(np.int32)
    for i in range(dst.shape[0]):
        if dst[i] < 0 or dst[i] >= n:
            return np.empty(0, np.int32), np.empty(0, np.int32), False
    return etok[lo:hi].astype(np.int32), dst, True


# A frozen automaton's edge records (`edge_records`), the drafting kernel's view of a state's
# children: per edge e, rec[REC_COLS * e + REC_*] = its token, its target w, counts[w] and lasts[w].
# The children of a state are one contiguous block of records, so reading them costs a cache line
# per four children instead of a random line of `counts` and one of `lasts` per child (drafting
# from a frozen source is bound by those misses; the arrays hardly fit the L2 cache).
REC_COLS = 4
REC_TOK, REC_TO, REC_COUNT, REC_LAST = range(REC_COLS)


@njit(cache=True, nogil=True)
def edge_records(etok, eto, counts, lasts):
    """int32[REC_COLS * m], m = min(len(etok), len(eto)): the records of every edge (see above).
    A target outside the states is kept as it is (the kernels check it) with count and last 0."""
    n = min(counts.shape[0], lasts.shape[0])
    m = min(etok.shape[0], eto.shape[0])
    rec = np.empty(REC_COLS * m, np.int32)
    for e in range(m):
        w = eto[e]
        i = REC_COLS * e
        rec[i + REC_TOK] = etok[e]
        rec[i + REC_TO] = w
        if 0 <= w < n:
            rec[i + REC_COUNT] = counts[w]
            rec[i + REC_LAST] = lasts[w]
        else:
            rec[i + REC_COUNT] = 0
            rec[i + REC_LAST] = 0
    return rec


# The proposal kernels take every frozen source of a session as one table: row j holds the
# addresses of source j's eight arrays (offsets, etok, eto, counts, lasts, links, lens and its
# `edge_records`), then their lengths, then their item sizes (`SOURCE_COLS` columns). Every array is
# int32 but `etok` and `lens`, which may be uint16 (a corpus shard's, read in place: no int32 copy);
# the kernels read `lens` through `source_len` and never read `etok` or `eto` (the records hold
# them). One array argument, where a typed list of tuples had to be type-checked and unboxed on
# every call. The caller keeps the arrays alive while kernels may read them.
N_SOURCE_ARRAYS = 8
SRC_OFFSETS, SRC_ETOK, SRC_ETO, SRC_COUNTS, SRC_LASTS, SRC_LINKS, SRC_LENS, SRC_RECORDS = range(N_SOURCE_ARRAYS)
SOURCE_COLS = 3 * N_SOURCE_ARRAYS
SOURCE_NARROW = (SRC_ETOK, SRC_LENS)  # the slots that may hold uint16 arrays


def address_table(arrays, width: int, name: str, narrow=()) -> np.ndarray:
    """Row j: the addresses of source j's `width` int32 arrays, then their lengths (a row of zeros
    for a source given as None, which kernels read as empty arrays); with slots `narrow` (uint16
    also taken there), then every array's item size."""
    table = np.zeros((len(arrays), (3 if narrow else 2) * width), np.int64)
    for j, arrs in enumerate(arrays):
        if arrs is None:
            continue
        if len(arrs) != width:
            raise InternalError(f"{name}: expected {width} arrays per source, got {len(arrs)}")
        for k, a in enumerate(arrs):
            dtype = np.uint16 if k in narrow and getattr(a, "dtype", None) == np.uint16 else np.int32
            if a.dtype != dtype or a.ndim != 1 or not a.flags.c_contiguous:
                want = "int32 or uint16" if k in narrow else "int32"
                raise InternalError(f"{name}: expected 1-D C-contiguous {want} arrays, got {a.dtype} {a.shape}")
            table[j, k] = address(a, dtype)
            table[j, width + k] = a.shape[0]
            if narrow:
                table[j, 2 * width + k] = a.itemsize
    return table


def source_table(arrays) -> np.ndarray:
    """The table of frozen sources from their arrays (8 C-contiguous arrays each, see above)."""
    return address_table(arrays, N_SOURCE_ARRAYS, "source_table", SOURCE_NARROW)


@njit(cache=True, nogil=True, inline="always")
def source_arrays(table, j):
    """(offsets, counts, lasts, links, records) of row j of a `source_table` (int32 views)."""
    n = N_SOURCE_ARRAYS
    return (view_i32(table[j, SRC_OFFSETS], table[j, n + SRC_OFFSETS]),
            view_i32(table[j, SRC_COUNTS], table[j, n + SRC_COUNTS]),
            view_i32(table[j, SRC_LASTS], table[j, n + SRC_LASTS]),
            view_i32(table[j, SRC_LINKS], table[j, n + SRC_LINKS]),
            view_i32(table[j, SRC_RECORDS], table[j, n + SRC_RECORDS]))


@njit(cache=True, nogil=True, inline="always")
def source_len(table, j, v):
    """lens[v] of row j of a `source_table` (its lens int32 or uint16); -1 when v is outside them."""
    n = N_SOURCE_ARRAYS
    count = table[j, n + SRC_LENS]
    if not 0 <= v < count:
        return np.int64(-1)
    if table[j, 2 * n + SRC_LENS] == 2:
        return np.int64(view_u16(table[j, SRC_LENS], count)[v])
    return np.int64(view_i32(table[j, SRC_LENS], count)[v])


# The best children of the frozen states with many (the proposal kernels' bounded gather): per
# source, `row_of` int32[n_states] (-1: the state has few children, read them all), then per row
# the edges of the state's `width - 1` most frequent children (ties: lower edge first) and of its
# most recent one (largest last end), in edge order, padded with -1 (`tops` int32[rows * width]),
# and the sum of all its children's counts (`totals` int32[rows]). Ranking children by count plus
# a bonus for the most recent one, the best `width - 1` are among them, in the order a full scan
# would rank them. A TOP_TABLE row holds the three arrays' addresses, then their lengths; an
# all-zero row: no table for that source.
N_TOP_ARRAYS = 3
TOP_ROW_OF, TOP_EDGES, TOP_TOTALS = range(N_TOP_ARRAYS)


@njit(cache=True, nogil=True, inline="always")
def top_min_children(width):
    """The `min_children` of the proposer's tables of `width`: a state with no more children has
    no row, so the kernels read `row_of` only for states with more (a row gives what a scan would)."""
    return max(16, 2 * width)


@njit(cache=True, nogil=True)
def top_children(offsets, etok, eto, counts, lasts, width, min_children):
    """(row_of, tops, totals) of the states with more than `min_children` children (see above);
    a state whose arrays are damaged gets no row (the kernels' full, checked scan handles it)."""
    n = min(offsets.shape[0] - 1, counts.shape[0], lasts.shape[0])
    m_edges = min(etok.shape[0], eto.shape[0])
    row_of = np.full(max(n, 0), -1, np.int32)
    rows = 0
    for v in range(n):
        if offsets[v + 1] - offsets[v] > min_children:
            rows += 1
    tops = np.full(rows * width, -1, np.int32)
    totals = np.zeros(rows, np.int32)
    best = np.empty(width, np.int64)  # edges of the most frequent children so far, best first
    r = 0
    for v in range(n):
        lo, hi = offsets[v], offsets[v + 1]
        if hi - lo <= min_children:
            continue
        if not 0 <= lo <= hi <= m_edges:
            continue
        ok = True
        k = 0
        total = 0
        recent = -1
        for e in range(lo, hi):
            w = eto[e]
            if w < 0 or w >= n:
                ok = False
                break
            c = counts[w]
            total += c
            if recent < 0 or lasts[w] > lasts[eto[recent]]:
                recent = e
            if k < width - 1:
                j = k
                k += 1
            elif k > 0 and c > counts[eto[best[k - 1]]]:
                j = k - 1  # the least frequent kept child makes room
            else:
                continue
            # insert e among best[0:k], after every child at least as frequent (earlier edges win ties)
            while j > 0 and c > counts[eto[best[j - 1]]]:
                best[j] = best[j - 1]
                j -= 1
            best[j] = e
        if not ok or total > 2147483647:
            continue
        # the chosen edges plus the most recent one, in edge order
        picked = best[:k].copy()
        has_recent = False
        for i in range(k):
            if picked[i] == recent:
                has_recent = True
        out = np.empty(k + 1, np.int64)
        out[:k] = picked
        n_out = k
        if not has_recent:
            out[k] = recent
            n_out = k + 1
        out = np.sort(out[:n_out])
        for i in range(n_out):
            tops[r * width + i] = out[i]
        totals[r] = total
        row_of[v] = r
        r += 1
    # rows of damaged states stay unused (all -1)
    return row_of, tops, totals


def top_table(arrays) -> np.ndarray:
    """The TOP_TABLE of sources' (row_of, tops, totals), None for a source without one."""
    return address_table(arrays, N_TOP_ARRAYS, "top_table")


@njit(cache=True, nogil=True, inline="always")
def top_arrays(table, j):
    """(row_of, tops, totals) of row j of a `top_table` (empty arrays: no table)."""
    n = N_TOP_ARRAYS
    return (view_i32(table[j, 0], table[j, n]), view_i32(table[j, 1], table[j, n + 1]),
            view_i32(table[j, 2], table[j, n + 2]))
