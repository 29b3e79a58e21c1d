"""Queries over the frozen (read-only, CSR) automaton layout.

Arrays: `links`, `lens`, `counts`, `lasts` int32[n] over the n *stored* states; `offsets` int64[n + 1],
int32 in a `source_table` (edges of state v are offsets[v]:offsets[v+1]); `etok`, `eto` int32[n_edges],
sorted by token within each state (a corpus shard's `etok` and `lens` may be uint16: every
kernel reads either in place, a `source_table` too; see LEN_SATURATED).

Implicit states (a corpus shard's, format 4): `tokens` (the text, uint16 or int32) and `plink`
int32[n_tokens]. A state that ends at one position p only (count 1: the prefix state of p, no
suffix-link children, at most the one edge to p + 1) is not stored: its id is n + p. Its count is
1, its last end p, its suffix link plink[p] (a stored state), written ~link when p ends its
document (it then has no edge), and its only edge is tokens[p + 1] -> n + p + 1 (the prefix state
of p + 1 ends at p + 1 only too). plink[p] is HOLE where the prefix state of p is stored (no id
n + p). An automaton without implicit states has an empty `plink` (ids below n only).

Counts may be uint16 (a corpus shard's): a count of COUNT_ESCAPED or more is stored as COUNT_ESCAPED
and found in `big` int32[2k], pairs (state, count) sorted by state (empty: no escapes; int32 counts
never need one). Every count is read through `count_of`.

They may be memory-mapped from a file that was damaged after its header was checked, so every
index read from an array is range-checked before it is followed: a kernel returns CORRUPT (-2)
instead of reading out of bounds, and callers raise.
"""

import numpy as np
from numba import njit

from ..errors import InternalError
from .address import address, borrowed, view_i32, view_u16
from .follow import follow

CORRUPT = -2
# In uint16 lengths (a corpus shard's), this value is a saturated length: the state is no state's
# suffix link (the only lengths a query reads are those of suffix links, all below it), and its
# length is that of its document's prefix up to its last end (`FrozenAutomaton.state_length`).
LEN_SATURATED = 65535
HOLE = -(2**31)  # plink of a position whose prefix state is stored
COUNT_ESCAPED = 65535  # a stored count at least this large: its value is in `big`


@njit(cache=True, nogil=True, inline="always")
def escaped_count(big, state, c):
    """The count of `state` from the (state, count) pairs of `big` (sorted by state), `c` when it
    has none (an int32 count that happens to equal COUNT_ESCAPED)."""
    lo = 0
    hi = big.shape[0] // 2
    while lo < hi:
        mid = (lo + hi) >> 1
        s = big[2 * mid]
        if s < state:
            lo = mid + 1
        elif s > state:
            hi = mid
        else:
            return np.int64(big[2 * mid + 1])
    return np.int64(c)


@njit(cache=True, nogil=True, inline="always")
def implicit_link(plink, n, state):
    """Suffix link of implicit state `state` (>= n), CORRUPT when damaged."""
    p = state - n
    if p < 0 or p >= plink.shape[0]:
        return CORRUPT
    w = plink[p]
    if w == HOLE:
        return CORRUPT
    if w < 0:
        w = ~w
    if w >= n:
        return CORRUPT
    return w


@njit(cache=True, nogil=True, inline="always")
def implicit_edge(tokens, plink, n, state):
    """(token, target) of the only edge of implicit state `state` (>= n): (-1, -1) when it ends
    its document, (CORRUPT, CORRUPT) when damaged."""
    p = state - n
    if p < 0 or p + 1 > plink.shape[0]:
        return CORRUPT, CORRUPT
    w = plink[p]
    if w == HOLE:
        return CORRUPT, CORRUPT
    if w < 0:
        return -1, -1
    if p + 1 >= tokens.shape[0] or p + 1 >= plink.shape[0]:
        return CORRUPT, CORRUPT
    return np.int64(tokens[p + 1]), np.int64(state + 1)


@njit(cache=True, nogil=True, inline="always")
def link_of(links, plink, state):
    """Suffix link of any state id (root: -1); CORRUPT for an id outside the states."""
    n = links.shape[0]
    if 0 <= state < n:
        return np.int64(links[state])
    if state < 0:
        return CORRUPT
    return np.int64(implicit_link(plink, n, state))


@njit(cache=True, nogil=True, inline="always")
def count_of(counts, big, state):
    """Count of a state id known to be in range: stored (escaped ones from `big`), else implicit (1)."""
    if state >= counts.shape[0]:
        return np.int64(1)
    c = np.int64(counts[state])
    if c == COUNT_ESCAPED:
        return escaped_count(big, state, c)
    return c


@njit(cache=True, nogil=True, inline="always")
def last_of(lasts, state):
    """Last end of a state id known to be in range: stored, else implicit (its position)."""
    return np.int64(lasts[state]) if state < lasts.shape[0] else np.int64(state - lasts.shape[0])


@njit(cache=True, nogil=True)
def stored_transition(offsets, etok, eto, n_ids, state, tok):
    """`transition` from stored state `state` (0 <= state < n): its edges' binary search, a target
    checked to be below n_ids."""
    m = etok.shape[0]
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
            if d < 0 or d >= n_ids:
                return CORRUPT
            return d
    return -1


@njit(cache=True, nogil=True)
def implicit_transition(tokens, plink, n, state, tok):
    """`transition` from implicit state `state` (>= n): its one edge, read from the text."""
    if state >= n + plink.shape[0]:
        return CORRUPT
    t, d = implicit_edge(tokens, plink, n, state)
    if t == CORRUPT:
        return CORRUPT
    return d if t == tok and t >= 0 else -1


@njit(cache=True, nogil=True, inline="always")
def transition(offsets, etok, eto, tokens, plink, state, tok):
    """Target of state's edge on tok, -1 for none, CORRUPT when damaged. Two calls, each passing
    only the arrays it reads: a loop calling this with `borrowed` views (address.py) costs no
    reference counting, and the stored states' search stays as small as without implicit states."""
    n = offsets.shape[0] - 1
    if 0 <= state < n:
        return stored_transition(offsets, etok, eto, n + plink.shape[0], state, tok)
    if state < 0:
        return CORRUPT
    return implicit_transition(tokens, plink, n, state, tok)


@njit(cache=True, nogil=True, inline="always")
def edge_to(g, state, tok):
    """`follow`'s lookup over g = (offsets, etok, eto, links, lens, tokens, plink)."""
    return transition(g[0], g[1], g[2], g[5], g[6], state, tok)


@njit(cache=True, nogil=True, inline="always")
def link_up(g, state, steps):
    """`follow`'s suffix-link step over g = (offsets, etok, eto, links, lens, tokens, plink):
    CORRUPT for a link outside the stored states, a negative length, or more steps than states
    (a cycle)."""
    n = g[0].shape[0] - 1
    p = link_of(g[3], g[6], state)
    if p < 0 or p >= n or steps > n:
        return CORRUPT, 0
    length = g[4][p]
    if length < 0:
        return CORRUPT, 0
    return p, length


@njit(cache=True)
def advance(offsets, etok, eto, links, lens, text, plink, state, length, tokens):
    n = offsets.shape[0] - 1
    # a cursor taken on an earlier snapshot of a growing automaton: its strings of the
    # current length may have moved to a clone on the suffix-link path
    guard = 0
    while state > 0 and guard <= n:
        p = link_of(links, plink, state)
        if p < 0 or p >= n:
            return CORRUPT, 0
        if lens[p] < length:
            break
        state = p
        guard += 1
    g = (borrowed(offsets), borrowed(etok), borrowed(eto), borrowed(links), borrowed(lens), borrowed(text), borrowed(plink))
    for j in range(tokens.shape[0]):
        state, length, _ = follow(edge_to, link_up, g, state, length, tokens[j])
        if state == CORRUPT:
            return CORRUPT, 0
    return state, length


@njit(cache=True)
def locate(offsets, etok, eto, tokens, plink, pattern):
    state = 0
    o, et, ed, tx, pl = borrowed(offsets), borrowed(etok), borrowed(eto), borrowed(tokens), borrowed(plink)
    for j in range(pattern.shape[0]):
        state = transition(o, et, ed, tx, pl, state, pattern[j])
        if state < 0:
            return state
    return state


@njit(cache=True)
def out_edges(offsets, etok, eto, tokens, plink, state):
    n = offsets.shape[0] - 1
    m = etok.shape[0]
    ids = n + plink.shape[0]
    if n <= state < ids:
        t, d = implicit_edge(tokens, plink, n, state)
        if t == CORRUPT:
            return np.empty(0, np.int32), np.empty(0, np.int32), False
        k = 1 if t >= 0 else 0
        return np.full(k, t, np.int32), np.full(k, d, np.int32), True
    if state < 0 or state >= n:
        return np.empty(0, np.int32), np.empty(0, np.int32), False
    lo = offsets[state]
    hi = offsets[state + 1]
    if lo < 0 or hi > m or lo > hi:
        return np.empty(0, np.int32), np.empty(0, np.int32), False
    dst = eto[lo:hi].astype(np.int32)
    for i in range(dst.shape[0]):
        if dst[i] < 0 or dst[i] >= ids:
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
def target_values(counts, big, lasts, n_ids, dsts):
    """(counts, last ends) int64 of the states `dsts` (ids below n_ids: stored or implicit; a
    caller checked them, e.g. `out_edges`)."""
    k = dsts.shape[0]
    cnt = np.empty(k, np.int64)
    lst = np.empty(k, np.int64)
    for i in range(k):
        w = dsts[i]
        if not 0 <= w < n_ids:
            cnt[i] = 0
            lst[i] = 0
            continue
        cnt[i] = count_of(counts, big, w)
        lst[i] = last_of(lasts, w)
    return cnt, lst


@njit(cache=True, nogil=True)
def all_ids_columns(links, counts, big, plink):
    """(links, counts) int32[n + len(plink)] over every state id, for kernels that want one row per
    state (the occurrence layout): an implicit state's link and count 1; a hole (a position whose
    prefix state is stored) link 0 and count 0; a damaged entry link -1."""
    n = links.shape[0]
    out_l = np.empty(n + plink.shape[0], np.int32)
    out_c = np.empty(n + plink.shape[0], np.int32)
    out_l[:n] = links
    for v in range(n):
        out_c[v] = count_of(counts, big, v)
    for p in range(plink.shape[0]):
        if plink[p] == HOLE:
            out_l[n + p] = 0
            out_c[n + p] = 0
        else:
            w = implicit_link(plink, n, n + p)
            out_l[n + p] = w if w >= 0 else -1
            out_c[n + p] = 1
    return out_l, out_c


@njit(cache=True, nogil=True)
def edge_records(etok, eto, counts, big, lasts, n_implicit):
    """int32[REC_COLS * m], m = min(len(etok), len(eto)): the records of every (stored) edge (see
    above); `n_implicit` ids past the stored states are implicit ones (count 1, last end their
    position). A target outside the states is kept as it is (the kernels check it) with count and
    last 0."""
    n = min(counts.shape[0], lasts.shape[0])
    m = min(etok.shape[0], eto.shape[0])
    rec = np.empty(REC_COLS * m, np.int32)
    for e in range(m):
        w = eto[e]
        i = REC_COLS * e
        rec[i + REC_TOK] = etok[e]
        rec[i + REC_TO] = w
        if 0 <= w < n:
            rec[i + REC_COUNT] = count_of(counts, big, w)
            rec[i + REC_LAST] = lasts[w]
        elif n <= w < n + n_implicit:
            rec[i + REC_COUNT] = 1
            rec[i + REC_LAST] = w - n
        else:
            rec[i + REC_COUNT] = 0
            rec[i + REC_LAST] = 0
    return rec


# The proposal kernels take every frozen source of a session as one table: row j holds the
# addresses of source j's eleven arrays (offsets, etok, eto, counts, lasts, links, lens, its
# `edge_records`, then its text, `plink` and count escapes `big`, empty without implicit states or
# escapes), then their lengths, then their item sizes (`SOURCE_COLS` columns). Every array is int32
# but `etok`, `lens`, `tokens` and `counts`, which may be uint16 (a corpus shard's, read in place: no
# int32 copy); the kernels read `lens` through `source_len`, counts through `source_count`, and
# never read `etok` or `eto` (the records hold them). One array argument, where a typed list of tuples had to be type-checked and
# unboxed on every call. The caller keeps the arrays alive while kernels may read them.
N_SOURCE_ARRAYS = 11
(SRC_OFFSETS, SRC_ETOK, SRC_ETO, SRC_COUNTS, SRC_LASTS, SRC_LINKS, SRC_LENS, SRC_RECORDS, SRC_TOKENS,
 SRC_PLINK, SRC_BIG) = range(N_SOURCE_ARRAYS)
SOURCE_COLS = 3 * N_SOURCE_ARRAYS
SOURCE_NARROW = (SRC_ETOK, SRC_LENS, SRC_TOKENS, SRC_COUNTS)  # the slots that may hold uint16 arrays


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
    """The table of frozen sources from their arrays (11 C-contiguous arrays each, see above)."""
    return address_table(arrays, N_SOURCE_ARRAYS, "source_table", SOURCE_NARROW)


@njit(cache=True, nogil=True, inline="always")
def source_arrays(table, j):
    """(offsets, lasts, links, records) of row j of a `source_table` (int32 views)."""
    n = N_SOURCE_ARRAYS
    return (view_i32(table[j, SRC_OFFSETS], table[j, n + SRC_OFFSETS]),
            view_i32(table[j, SRC_LASTS], table[j, n + SRC_LASTS]),
            view_i32(table[j, SRC_LINKS], table[j, n + SRC_LINKS]),
            view_i32(table[j, SRC_RECORDS], table[j, n + SRC_RECORDS]))


@njit(cache=True, nogil=True, inline="always")
def source_count(table, j, v):
    """counts[v] of row j of a `source_table` (counts int32 or uint16 with escapes); -1 when v is
    outside the stored states."""
    n = N_SOURCE_ARRAYS
    count = table[j, n + SRC_COUNTS]
    if not 0 <= v < count:
        return np.int64(-1)
    big = view_i32(table[j, SRC_BIG], table[j, n + SRC_BIG])
    if table[j, 2 * n + SRC_COUNTS] == 2:
        return count_of(view_u16(table[j, SRC_COUNTS], count), big, v)
    return count_of(view_i32(table[j, SRC_COUNTS], count), big, v)


@njit(cache=True, nogil=True, inline="always")
def source_plink(table, j):
    """The `plink` of row j of a `source_table` (empty: no implicit states)."""
    n = N_SOURCE_ARRAYS
    return view_i32(table[j, SRC_PLINK], table[j, n + SRC_PLINK])


@njit(cache=True, nogil=True, inline="always")
def source_token(table, j, p):
    """tokens[p] of row j of a `source_table` (its text int32 or uint16); -1 when p is outside it."""
    n = N_SOURCE_ARRAYS
    count = table[j, n + SRC_TOKENS]
    if not 0 <= p < count:
        return np.int64(-1)
    if table[j, 2 * n + SRC_TOKENS] == 2:
        return np.int64(view_u16(table[j, SRC_TOKENS], count)[p])
    return np.int64(view_i32(table[j, SRC_TOKENS], count)[p])


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
# would rank them.
#
# The kernels read a state's row in one place (`top_rows`): int32 rows of TOP_ROW_LEN(width), the
# count total, then the edge records (`edge_records`, REC_COLS each) of its best children in
# edge order, padded with TOP_PAD tokens; a row whose edge lies outside the records gets a TO of
# -1 (the kernels draft nothing from it). A state's best children are then one row_of read and
# one row away, not one read per child scattered over its edges. A TOP_TABLE row holds the two
# arrays' (row_of, rows) addresses, then their lengths; an all-zero row: no table for that source.
N_TOP_ARRAYS = 2
TOP_ROW_OF, TOP_ROWS = range(N_TOP_ARRAYS)
TOP_PAD = -1  # the token of a row's unused record


@njit(cache=True, nogil=True, inline="always")
def top_row_len(width):
    """int32 values per row of `top_rows` of `width` children: the total, then their records."""
    return 1 + width * REC_COLS


@njit(cache=True, nogil=True, inline="always")
def top_min_children(width):
    """The `min_children` of the proposer's tables of `width`: a state with no more children has
    no row, so the kernels read `row_of` only for states with more (a row gives what a scan would)."""
    return max(16, 2 * width)


@njit(cache=True, nogil=True)
def top_children(offsets, etok, eto, counts, big, lasts, n_implicit, width, min_children):
    """(row_of, tops, totals) of the (stored) states with more than `min_children` children (see
    above; an implicit state has at most one); a state whose arrays are damaged gets no row (the
    kernels' full, checked scan handles it). `n_implicit`: ids past the stored states that are
    implicit states."""
    n = min(offsets.shape[0] - 1, counts.shape[0], lasts.shape[0])
    ids = n + n_implicit
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
            if w < 0 or w >= ids:
                ok = False
                break
            c = count_of(counts, big, w)
            total += c
            if recent < 0 or last_of(lasts, w) > last_of(lasts, eto[recent]):
                recent = e
            if k < width - 1:
                j = k
                k += 1
            elif k > 0 and c > count_of(counts, big, eto[best[k - 1]]):
                j = k - 1  # the least frequent kept child makes room
            else:
                continue
            # insert e among best[0:k], after every child at least as frequent (earlier edges win ties)
            while j > 0 and c > count_of(counts, big, eto[best[j - 1]]):
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


@njit(cache=True, nogil=True)
def top_rows(tops, totals, records, width):
    """The rows the kernels read (see above) of `top_children`'s (tops, totals) over `records`."""
    n_rows = totals.shape[0]
    stride = top_row_len(width)
    out = np.full(n_rows * stride, TOP_PAD, np.int32)
    m = records.shape[0] // REC_COLS
    for r in range(n_rows):
        o = r * stride
        out[o] = totals[r]
        for i in range(width):
            e = tops[r * width + i]
            if e < 0:
                break
            at = o + 1 + i * REC_COLS
            if e >= m:
                out[at + REC_TOK] = 0
                out[at + REC_TO] = -1
                break
            for c in range(REC_COLS):
                out[at + c] = records[REC_COLS * e + c]
    return out


def top_table(arrays) -> np.ndarray:
    """The TOP_TABLE of sources' (row_of, rows), None for a source without one."""
    return address_table(arrays, N_TOP_ARRAYS, "top_table")


@njit(cache=True, nogil=True, inline="always")
def top_arrays(table, j):
    """(row_of, rows) of row j of a `top_table` (empty arrays: no table)."""
    n = N_TOP_ARRAYS
    return view_i32(table[j, 0], table[j, n]), view_i32(table[j, 1], table[j, n + 1])
