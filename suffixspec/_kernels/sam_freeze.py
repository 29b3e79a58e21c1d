"""Conversions between the growable automaton (sam.py) and the frozen CSR layout (frozen.py).

- `to_csr` / `to_csr_into`: per-state edge offsets and the edges sorted by token within each
  state; `state_columns` / `state_columns_into`: the LINK, LEN, CNT and LAST columns;
  `freeze_into`: the offsets, edges, LINK and LEN in one pass. The `_into` forms write into
  given arrays (e.g. views of a mapped shard file).
- `implicit_ids` / `freeze_implicit_into`: a corpus shard's layout with implicit states (frozen.py):
  which states end at one position only (ids n_stored + p), then the stored states' columns and
  edges (renumbered, in their order) and each position's `plink`.
- `thaw`: the bulk-mode arrays (S, E, H, M) of the automaton a frozen layout holds (without implicit
  states), with room to `extend` it by more documents; the caller checks the layout first
  (`build.layout_ok`).
Freezing reads the arrays only (`implicit_ids` writes its own outputs); thawing builds new ones.
"""

import numpy as np
from numba import njit

from .frozen import HOLE
from .sam import (
    CNT,
    DEG,
    E_COLS,
    HASH_LOAD_DEN,
    HASH_LOAD_NUM,
    HEAD,
    LAST,
    LEN,
    LINK,
    META,
    MODE,
    MODE_BULK,
    N_EDGES,
    N_HASHED,
    N_STATES,
    N_TOKENS,
    NEXT,
    SMALL_DEG,
    SRC,
    STATE_COLS,
    TO,
    TOK,
    rehash,
)


@njit(cache=True, nogil=True)
def to_csr(S, E, M):
    """Frozen layout: per-state edge offsets and edges sorted by token within each state."""
    n = M[N_STATES]
    m = M[N_EDGES]
    offsets = np.empty(n + 1, np.int64)
    etok = np.empty(m, np.int32)
    eto = np.empty(m, np.int32)
    to_csr_into(S, E, M, offsets, etok, eto)
    return offsets, etok, eto


@njit(cache=True)
def to_csr_into(S, E, M, offsets, etok, eto):
    """`to_csr` into given arrays (offsets int32 or int64 [N_STATES + 1], etok and eto int32
    [N_EDGES]), e.g. views of the file being written.

    Offsets come from the DEG column; the edge rows are then scattered by source in one
    sequential pass (edges are only ever added, so rows 0..N_EDGES-1 are all live) and each
    state's few edges sorted in place, rather than following every state's edge list.
    """
    offsets[0] = 0
    for v in range(M[N_STATES]):
        offsets[v + 1] = offsets[v] + S[v, DEG]
    _place_edges(S, E, M, offsets, etok, eto)


@njit(cache=True)
def freeze_into(S, E, M, offsets, etok, eto, links, lens, len_cap):
    """`to_csr_into` and the LINK and LEN columns (int32[N_STATES]; lens also uint16) in its one
    pass over the states (a corpus shard takes its counts and last ends from elsewhere). A length
    above `len_cap` is written as `len_cap` (a corpus shard's saturated uint16 lengths)."""
    offsets[0] = 0
    for v in range(M[N_STATES]):
        links[v] = S[v, LINK]
        ln = S[v, LEN]
        lens[v] = ln if ln < len_cap else len_cap
        offsets[v + 1] = offsets[v] + S[v, DEG]
    _place_edges(S, E, M, offsets, etok, eto)


@njit(cache=True, inline="always")
def _place_edges(S, E, M, offsets, etok, eto):
    """Scatter the edge rows into the CSR arrays by source and sort each state's row by token."""
    n = M[N_STATES]
    m = M[N_EDGES]
    fill = offsets[:n].copy()
    for e in range(m):
        v = E[e, SRC]
        k = fill[v]
        etok[k] = E[e, TOK]
        eto[k] = E[e, TO]
        fill[v] = k + 1
    _sort_rows(offsets, etok, eto, n)


@njit(cache=True, inline="always")
def sort_row(etok, eto, lo, hi):
    """Sort the CSR row lo:hi by token: insertion sort for the usual small degree, argsort for hubs
    like the root."""
    if hi - lo <= 16:
        for a in range(lo + 1, hi):
            t = etok[a]
            d = eto[a]
            b = a - 1
            while b >= lo and etok[b] > t:
                etok[b + 1] = etok[b]
                eto[b + 1] = eto[b]
                b -= 1
            etok[b + 1] = t
            eto[b + 1] = d
    else:
        order = np.argsort(etok[lo:hi], kind="mergesort")
        etok[lo:hi] = etok[lo:hi][order]
        eto[lo:hi] = eto[lo:hi][order]


@njit(cache=True, inline="always")
def _sort_rows(offsets, etok, eto, n):
    """Sort each of the n states' CSR rows by token."""
    for v in range(n):
        if offsets[v + 1] - offsets[v] > 1:
            sort_row(etok, eto, offsets[v], offsets[v + 1])


@njit(cache=True)
def implicit_ids(S, E, M, tokens, pstate, doc_starts, newid, haskid, count_cap):
    """Which states are implicit (frozen.py) and every state's id in the frozen layout, into
    `newid` int32[>= N_STATES] (`haskid` uint8[>= N_STATES] is scratch). S's CNT and LAST columns
    must hold the counts and last ends (`corpus_build.count_ends`), `pstate` each position's prefix
    state. A state is implicit when it is the prefix state of a position p with count 1, no
    suffix-link children and, in its document, no edge after the last position, else exactly the
    edge tokens[p + 1] -> prefix state of p + 1, itself implicit (so a document's implicit
    positions are its last ones). Stored states keep their order as ids 0..n_stored-1; implicit
    ones get n_stored + p. Returns (n_stored, stored edges, stored states counted `count_cap` times or
    more: those whose counts go to the escapes)."""
    ns = M[N_STATES]
    n = pstate.shape[0]
    for v in range(ns):
        haskid[v] = 0
        newid[v] = 0
    for v in range(1, ns):
        haskid[S[v, LINK]] = 1
    n_imp = 0
    imp_edges = 0
    n_docs = doc_starts.shape[0]
    for d in range(n_docs):
        lo = doc_starts[d]
        hi = doc_starts[d + 1] if d + 1 < n_docs else n
        for p in range(hi - 1, lo - 1, -1):
            v = pstate[p]
            ok = v > 0 and S[v, CNT] == 1 and haskid[v] == 0 and newid[v] == 0
            if ok:
                if p == hi - 1:
                    ok = S[v, DEG] == 0
                else:
                    e = S[v, HEAD]
                    ok = S[v, DEG] == 1 and e >= 0 and E[e, TOK] == tokens[p + 1] and E[e, TO] == pstate[p + 1]
            if not ok:
                break  # an earlier position's edge leads here: stored too
            newid[v] = -1 - p
            n_imp += 1
            imp_edges += S[v, DEG]
    n_stored = ns - n_imp
    k = 0
    n_big = 0
    for v in range(ns):
        if newid[v] >= 0:
            newid[v] = k
            k += 1
            if S[v, CNT] >= count_cap:
                n_big += 1
        else:
            newid[v] = n_stored + (-1 - newid[v])
    return n_stored, M[N_EDGES] - imp_edges, n_big


@njit(cache=True)
def freeze_implicit_into(S, E, M, newid, n_stored, pstate, doc_starts, offsets, etok, eto, links, lens, counts, lasts,
                         plink, big, len_cap, count_cap):
    """The frozen layout with implicit states (`implicit_ids` gave `newid` and n_stored) into given
    arrays: the stored states' LINK, LEN (capped at `len_cap`), CNT (from `count_cap` on: count_cap,
    the count in the escapes `big`, (state, count) pairs in state order) and LAST columns and CSR
    edges (sorted by token, targets renumbered), and `plink` int32[n_tokens] (frozen.py). False when
    a stored state's suffix link or an implicit state's is not a stored state, or the escapes do not
    fill `big` (not an automaton `implicit_ids` planned)."""
    ns = M[N_STATES]
    m = M[N_EDGES]
    n = pstate.shape[0]
    n_big = 0
    offsets[0] = 0
    for v in range(ns):
        nv = newid[v]
        if nv >= n_stored:
            continue
        lk = S[v, LINK]
        if lk >= 0 and newid[lk] >= n_stored:
            return False
        links[nv] = newid[lk] if lk >= 0 else -1
        ln = S[v, LEN]
        lens[nv] = ln if ln < len_cap else len_cap
        c = S[v, CNT]
        if c >= count_cap:
            if 2 * n_big + 2 > big.shape[0]:
                return False
            big[2 * n_big] = nv
            big[2 * n_big + 1] = c
            n_big += 1
            c = count_cap
        counts[nv] = c
        lasts[nv] = S[v, LAST]
        offsets[nv + 1] = offsets[nv] + S[v, DEG]
    fill = offsets[:n_stored].copy()
    for e in range(m):
        v = newid[E[e, SRC]]
        if v >= n_stored:
            continue
        k = fill[v]
        etok[k] = E[e, TOK]
        eto[k] = newid[E[e, TO]]
        fill[v] = k + 1
    _sort_rows(offsets, etok, eto, n_stored)
    if 2 * n_big != big.shape[0]:
        return False
    n_docs = doc_starts.shape[0]
    d = 0
    for p in range(n):
        while d + 1 < n_docs and doc_starts[d + 1] <= p:
            d += 1
        v = pstate[p]
        if newid[v] < n_stored:
            plink[p] = HOLE
            continue
        lk = newid[S[v, LINK]]
        if lk >= n_stored:
            return False
        end = doc_starts[d + 1] if d + 1 < n_docs else n
        plink[p] = ~lk if p + 1 == end else lk
    return True


@njit(cache=True, nogil=True)
def state_columns(S, M):
    """Copies of the LINK, LEN, CNT and LAST columns of the live states, in one pass over S."""
    n = M[N_STATES]
    links = np.empty(n, np.int32)
    lens = np.empty(n, np.int32)
    counts = np.empty(n, np.int32)
    lasts = np.empty(n, np.int32)
    state_columns_into(S, M, links, lens, counts, lasts)
    return links, lens, counts, lasts


@njit(cache=True)
def state_columns_into(S, M, links, lens, counts, lasts):
    """`state_columns` into given int32[N_STATES] arrays."""
    for v in range(M[N_STATES]):
        links[v] = S[v, LINK]
        lens[v] = S[v, LEN]
        counts[v] = S[v, CNT]
        lasts[v] = S[v, LAST]


@njit(cache=True, nogil=True)
def thaw(links, lens, counts, lasts, offsets, etok, eto, n_tokens, more_states, more_edges):
    """(S, E, H, M) in MODE_BULK of the automaton a frozen layout holds (`to_csr` and
    `state_columns` of an automaton over n_tokens tokens, counts accumulated), with room for
    `more_states` / `more_edges` rows, for `extend` to add documents to. The same automaton:
    its edges are listed by token instead of in the order they came, which no result depends on;
    CNT is each state's own positions (its count less its suffix-link children's) and LAST its
    frozen last end, the latest own position of its subtree (a subtree only ever gains states), so
    that `accumulate` after more documents gives what one build over all of them gives. The caller
    checks the layout first (`build.layout_ok`)."""
    n = links.shape[0]
    m = etok.shape[0]
    S = np.empty((n + more_states, STATE_COLS), np.int32)
    E = np.empty((m + more_edges, E_COLS), np.int32)
    hashed = 0
    for v in range(n):
        lo = offsets[v]
        hi = offsets[v + 1]
        S[v, LINK], S[v, LEN], S[v, CNT], S[v, LAST] = links[v], lens[v], counts[v], lasts[v]
        S[v, HEAD] = lo if hi > lo else -1
        S[v, DEG] = hi - lo
        if hi - lo > SMALL_DEG:
            hashed += hi - lo
        for k in range(lo, hi):
            E[k, SRC], E[k, TOK], E[k, TO], E[k, NEXT] = v, etok[k], eto[k], k + 1 if k + 1 < hi else -1
    for v in range(1, n):
        S[links[v], CNT] -= counts[v]
    size = 32  # room for the edges to come too, so that extend need not rehash
    while (hashed + more_edges) * HASH_LOAD_DEN > size * HASH_LOAD_NUM:
        size *= 2
    M = np.zeros(META, np.int64)
    M[N_STATES], M[N_EDGES], M[N_TOKENS], M[N_HASHED], M[MODE] = n, m, n_tokens, hashed, MODE_BULK
    return S, E, rehash(S, E, m, size), M
