"""A corpus shard's frozen arrays from the row automaton of bulk_sam.py.

The same arrays, byte for byte, that sam_freeze.py's `implicit_ids` and `freeze_implicit_into`
write from the automaton `build.documents_automaton` builds (bulk_sam.py builds the same states
and edges in another layout); see there for the layout with implicit states. The caller gives
each state's count and last end (`corpus_build.count_ends` over the rows' LINK and LEN columns,
`link_column` / `len_column`) and each position's prefix state `pstate`.

- `implicit_ids_rows`: which states are implicit, every state's id in the frozen layout.
- `freeze_rows_into`: the stored states' columns and CSR edges (sorted by token, targets
  renumbered) and `plink`, into given arrays (views of the shard file being written).
"""

import numpy as np
from numba import njit

from .address import borrowed, prefetch
from .bulk_sam import DEG, EDGE0, INLINE, LEN, LINK, N_EDGES, N_STATES, O_SRC, O_TO, O_TOK, OVF, ROW
from .frozen import HOLE
from .sam_freeze import sort_row

AHEAD = 16  # loop steps between a prefetch and the use of what it fetches


def link_column(S: np.ndarray, n_states: int) -> np.ndarray:
    """The LINK column of the first n_states rows of S (a strided view)."""
    return S.reshape(-1, ROW)[:n_states, LINK]


def len_column(S: np.ndarray, n_states: int) -> np.ndarray:
    """The LEN column of the first n_states rows of S (a strided view)."""
    return S.reshape(-1, ROW)[:n_states, LEN]


@njit(cache=True, nogil=True)
def implicit_ids_rows(S, M, tokens, pstate, doc_starts, counts, newid, haskid, count_cap):
    """`sam_freeze.implicit_ids` over rows (`counts` int32[N_STATES]: every state's count): into
    `newid` int32[>= N_STATES] every state's frozen id (`haskid` uint8[>= N_STATES] is scratch);
    returns (n_stored, stored edges, stored states counted `count_cap` times or more, the greatest
    length of a state that is some state's suffix link: the only lengths a query reads)."""
    S, M, tokens, pstate, doc_starts, counts, newid, haskid = (  # the caller holds them (see `borrowed`)
        borrowed(S), borrowed(M), borrowed(tokens), borrowed(pstate), borrowed(doc_starts), borrowed(counts),
        borrowed(newid), borrowed(haskid))
    ns = M[N_STATES]
    n = pstate.shape[0]
    for v in range(ns):
        haskid[v] = 0
        newid[v] = 0
    for v in range(1, ns):
        haskid[S[v * ROW + LINK]] = 1
    n_imp = 0
    imp_edges = 0
    n_docs = doc_starts.shape[0]
    for d in range(n_docs):
        lo = doc_starts[d]
        hi = doc_starts[d + 1] if d + 1 < n_docs else n
        for p in range(hi - 1, lo - 1, -1):
            v = pstate[p]
            ok = v > 0 and counts[v] == 1 and haskid[v] == 0 and newid[v] == 0
            if ok:
                b = v * ROW
                if p == hi - 1:
                    ok = S[b + DEG] == 0
                else:  # its one edge is inline (v is not the root)
                    ok = S[b + DEG] == 1 and S[b + EDGE0] == tokens[p + 1] and S[b + EDGE0 + 1] == pstate[p + 1]
            if not ok:
                break  # an earlier position's edge leads here: stored too
            newid[v] = -1 - p
            n_imp += 1
            imp_edges += S[v * ROW + DEG]
    n_stored = ns - n_imp
    k = 0
    n_big = 0
    best = 0  # the greatest length of a suffix link's target
    for v in range(ns):
        if haskid[v] and S[v * ROW + LEN] > best:
            best = S[v * ROW + LEN]
        if newid[v] >= 0:
            newid[v] = k
            k += 1
            if counts[v] >= count_cap:
                n_big += 1
        else:
            newid[v] = n_stored + (-1 - newid[v])
    return n_stored, M[N_EDGES] - imp_edges, n_big, best


@njit(cache=True, nogil=True)
def freeze_rows_into(S, O, R0, M, newid, n_stored, counts_in, lasts_in, pstate, doc_starts, offsets, etok, eto, links,
                     lens, counts, lasts, plink, big, len_cap, count_cap):
    """`sam_freeze.freeze_implicit_into` over rows (`counts_in`, `lasts_in` int32[N_STATES]: every
    state's count and last end): the stored states' LINK, LEN (capped at `len_cap`), CNT (escapes
    from `count_cap` on, into `big`) and LAST columns, their CSR edges sorted by token with targets
    renumbered, and `plink`, into given arrays. Spends the rows: OVF becomes a placement cursor
    and DEG the row's end. False when a suffix link is not a stored state, the edges do not fill
    their rows or the escapes do not fill `big`."""
    # views without reference counts (the caller holds the arrays): inlined helpers take arrays
    S, O, R0, M, newid, counts_in, lasts_in, pstate, doc_starts = (
        borrowed(S), borrowed(O), borrowed(R0), borrowed(M), borrowed(newid), borrowed(counts_in), borrowed(lasts_in),
        borrowed(pstate), borrowed(doc_starts))
    offsets, etok, eto, links, lens, counts, lasts, plink, big = (
        borrowed(offsets), borrowed(etok), borrowed(eto), borrowed(links), borrowed(lens), borrowed(counts),
        borrowed(lasts), borrowed(plink), borrowed(big))
    ns = M[N_STATES]
    n = pstate.shape[0]
    n_big = 0
    offsets[0] = 0
    k = 0
    n_over = 0  # overflow edges the stored states' rows have room for
    # states in order: columns, offsets, inline edges (the root's from R0, in token order)
    for v in range(ns):
        # the ids of a later stored row's link and inline targets (scattered reads); none for the
        # implicit states this loop skips, most of the states
        if v + AHEAD < ns and newid[v + AHEAD] < n_stored:
            a = (v + AHEAD) * ROW
            prefetch(newid, S[a + LINK])
            prefetch(newid, S[a + EDGE0 + 1])
            prefetch(newid, S[a + EDGE0 + 3])
        nv = newid[v]
        if nv >= n_stored:
            continue
        b = v * ROW
        lk = S[b + LINK]
        if lk >= 0 and newid[lk] >= n_stored:
            return False
        links[nv] = newid[lk] if lk >= 0 else -1
        ln = S[b + LEN]
        lens[nv] = ln if ln < len_cap else len_cap
        c = counts_in[v]
        if c >= count_cap:
            if 2 * n_big + 2 > big.shape[0]:
                return False
            big[2 * n_big] = nv
            big[2 * n_big + 1] = c
            n_big += 1
            c = count_cap
        counts[nv] = c
        lasts[nv] = lasts_in[v]
        d = S[b + DEG]
        if v == 0 and R0.shape[0] > 0:
            for t in range(R0.shape[0]):
                if R0[t] != -1:
                    etok[k] = t
                    eto[k] = newid[R0[t]]
                    k += 1
            if k != d:
                return False
        else:
            for i in range(d if d < INLINE else INLINE):
                etok[k + i] = S[b + EDGE0 + 2 * i]
                eto[k + i] = newid[S[b + EDGE0 + 2 * i + 1]]
            S[b + OVF] = k + INLINE
            S[b + DEG] = k + d
            if d > INLINE:
                n_over += d - INLINE
            k += d
        offsets[nv + 1] = k
    if 2 * n_big != big.shape[0] or k != etok.shape[0]:
        return False
    # overflow edges in table order (independent scattered reads), each after its state's inline
    # ones; no row takes more than its room, so that all of them fill every row
    placed = 0
    n_slots = O.shape[0]
    for i in range(n_slots):
        if i + AHEAD < n_slots:  # a later slot's source row and ids (scattered reads)
            sa = O[i + AHEAD, O_SRC]
            if sa != -1:
                prefetch(S, sa * ROW + OVF)
                prefetch(newid, sa)
                prefetch(newid, O[i + AHEAD, O_TO])
        s = O[i, O_SRC]
        if s == -1 or newid[s] >= n_stored:
            continue
        b = s * ROW
        j = S[b + OVF]
        if j < INLINE or j >= S[b + DEG]:  # (a dense root's row has no cursor: it takes none)
            return False
        etok[j] = O[i, O_TOK]
        eto[j] = newid[O[i, O_TO]]
        S[b + OVF] = j + 1
        placed += 1
    if placed != n_over:
        return False
    for nv in range(1 if R0.shape[0] > 0 else 0, n_stored):  # (a dense root's row is in order already)
        if offsets[nv + 1] - offsets[nv] > 1:
            sort_row(etok, eto, offsets[nv], offsets[nv + 1])
    n_docs = doc_starts.shape[0]
    d = 0
    for p in range(n):
        if p + AHEAD < n:
            prefetch(newid, S[pstate[p + AHEAD] * ROW + LINK])
        while d + 1 < n_docs and doc_starts[d + 1] <= p:
            d += 1
        v = pstate[p]
        if newid[v] < n_stored:
            plink[p] = HOLE
            continue
        lk = newid[S[v * ROW + LINK]]
        if lk >= n_stored:
            return False
        end = doc_starts[d + 1] if d + 1 < n_docs else n
        plink[p] = ~lk if p + 1 == end else lk
    return True
