"""Conversions between the growable automaton (sam.py) and the frozen CSR layout (frozen.py).

- `to_csr` / `to_csr_into`: per-state edge offsets and the edges sorted by token within each
  state; `state_columns` / `state_columns_into`: the LINK, LEN, CNT and LAST columns;
  `freeze_into`: the offsets, edges, LINK and LEN in one pass. The `_into` forms write into
  given arrays (e.g. views of a mapped shard file).
- `thaw`: the bulk-mode arrays (S, E, H, M) of the automaton a frozen layout holds, with room to
  `extend` it by more documents; the caller checks the layout first (`build.layout_ok`).
Freezing reads the arrays only; thawing builds new ones.
"""

import numpy as np
from numba import njit

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
    for v in range(n):
        lo = offsets[v]
        hi = offsets[v + 1]
        if hi - lo > 1:
            # insertion sort for the usual small degree, argsort for hubs like the root
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
