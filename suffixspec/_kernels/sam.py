"""Growable suffix automaton over int32 token ids: online extension and queries.

Arrays (owned by `suffixspec.automaton.SuffixAutomaton`, passed in and returned because
growth reallocates them):

- `S` int32[cap, 6]: per state LINK (suffix link, -1 for the root), LEN (longest string),
  HEAD (first outgoing edge, -1 for none), CNT (end positions), LAST (most recent end position),
  DEG (number of outgoing edges).
- `E` int32[cap, 4]: per edge SRC, TOK, TO, NEXT (next edge of the same source, -1 ends).
- `H` int32[2**b]: open-addressing hash table (linear probing) of edge ids keyed by (SRC, TOK),
  holding only the edges of states with more than SMALL_DEG edges (hubs such as the root);
  the edges of the many small states are found by walking their short list. -1 marks an empty
  slot; the size is a power of two, kept at most 70% full.
- `T` int32[cap]: the indexed tokens, all documents concatenated.
- `L` int32[cap, 5]: the link-cut tree (see lct.py), used once counts are kept online.
- `M` int64[META]: N_STATES, N_EDGES, LAST_STATE, N_TOKENS, MODE, N_HASHED.

MODE_BULK: CNT/LAST of each state hold only its *own* positions (the positions whose whole
document prefix ends in that state); `accumulate` turns them into subtree sums in O(n) and
switches to MODE_ONLINE, where every new position updates its root path through the
link-cut tree. Matching never needs counts, so bulk mode survives match queries.

Documents: the automaton is a generalized one; `M[LAST_STATE] = 0` starts a new document,
so no match spans two documents.
"""

import numpy as np
from numba import njit

from . import lct

LINK, LEN, HEAD, CNT, LAST, DEG = 0, 1, 2, 3, 4, 5
STATE_COLS = 6
SRC, TOK, TO, NEXT = 0, 1, 2, 3
N_STATES, N_EDGES, LAST_STATE, N_TOKENS, MODE, N_HASHED = 0, 1, 2, 3, 4, 5
META = 6
SMALL_DEG = 6
MODE_BULK, MODE_ONLINE = 0, 1
HASH_LOAD_NUM, HASH_LOAD_DEN = 7, 10


@njit(cache=True, inline="always")
def _slot(src, tok, mask):
    key = (np.uint64(src) << np.uint64(32)) | np.uint64(tok)
    h = key * np.uint64(0x9E3779B97F4A7C15)
    return np.int64((h >> np.uint64(29)) & np.uint64(mask))


@njit(cache=True)
def find_edge(S, E, H, src, tok):
    if S[src, DEG] <= SMALL_DEG:
        e = S[src, HEAD]
        while e != -1:
            if E[e, TOK] == tok:
                return e
            e = E[e, NEXT]
        return -1
    mask = H.shape[0] - 1
    i = _slot(src, tok, mask)
    while True:
        e = H[i]
        if e == -1:
            return -1
        if E[e, SRC] == src and E[e, TOK] == tok:
            return e
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def transition(S, E, H, src, tok):
    e = find_edge(S, E, H, src, tok)
    return -1 if e == -1 else E[e, TO]


@njit(cache=True)
def _grow_rows(a, need, fill):
    cap = a.shape[0]
    if need <= cap:
        return a
    new_cap = max(need, cap + (cap >> 1) + 16)
    b = np.empty((new_cap, a.shape[1]), a.dtype)
    b[:cap] = a
    b[cap:] = fill
    return b


@njit(cache=True, inline="always")
def _hash_insert(E, H, e):
    mask = H.shape[0] - 1
    i = _slot(E[e, SRC], E[e, TOK], mask)
    while H[i] != -1:
        i = (i + 1) & mask
    H[i] = e


@njit(cache=True)
def _rehash(S, E, n_edges, size):
    H = np.full(size, -1, np.int32)
    for e in range(n_edges):
        if S[E[e, SRC], DEG] > SMALL_DEG:
            _hash_insert(E, H, e)
    return H


@njit(cache=True)
def _add_edge(S, E, H, M, src, tok, dst):
    e = M[N_EDGES]
    E = _grow_rows(E, e + 1, -1)
    E[e, SRC] = src
    E[e, TOK] = tok
    E[e, TO] = dst
    E[e, NEXT] = S[src, HEAD]
    S[src, HEAD] = e
    M[N_EDGES] = e + 1
    deg = S[src, DEG] + 1
    S[src, DEG] = deg
    if deg > SMALL_DEG:
        added = deg if deg == SMALL_DEG + 1 else 1  # a state turning into a hub moves all its edges
        if (M[N_HASHED] + added) * HASH_LOAD_DEN > H.shape[0] * HASH_LOAD_NUM:
            size = H.shape[0]
            while (M[N_HASHED] + added) * HASH_LOAD_DEN > size * HASH_LOAD_NUM:
                size *= 2
            H = _rehash(S, E, e + 1, size)
        else:
            f = e
            for _ in range(added):
                _hash_insert(E, H, f)
                f = E[f, NEXT]
        M[N_HASHED] += added
    return E, H


@njit(cache=True)
def _new_state(S, L, M, length, link):
    v = M[N_STATES]
    S = _grow_rows(S, v + 1, -1)
    S[v, LINK] = link
    S[v, LEN] = length
    S[v, HEAD] = -1
    S[v, CNT] = 0
    S[v, LAST] = -1
    S[v, DEG] = 0
    if M[MODE] == MODE_ONLINE:
        L = _grow_rows(L, v + 1, -1)
        lct.reset_node(L, v, -1)
    M[N_STATES] = v + 1
    return S, L, v


@njit(cache=True)
def _clone(S, E, H, L, M, q, length, stack):
    """Split q: a new state takes q's strings of length <= `length`; returns the clone."""
    S, L, c = _new_state(S, L, M, length, S[q, LINK])
    e = S[q, HEAD]
    while e != -1:
        E, H = _add_edge(S, E, H, M, c, E[e, TOK], E[e, TO])
        e = E[e, NEXT]
    if M[MODE] == MODE_ONLINE:
        # The clone's end positions are exactly q's (before the current position is added).
        stack = lct.splay(L, S, q, stack)
        S[c, CNT] = S[q, CNT]
        S[c, LAST] = S[q, LAST]
        parent = S[q, LINK]
        stack = lct.cut(L, S, q, stack)
        L[c, lct.PAR] = parent
        L[q, lct.PAR] = c
    S[q, LINK] = c
    return S, E, H, L, c, stack


@njit(cache=True)
def _set_link(S, L, M, v, target):
    S[v, LINK] = target
    if M[MODE] == MODE_ONLINE:
        L[v, lct.PAR] = target


@njit(cache=True)
def extend(S, E, H, T, L, M, tokens, stack):
    """Append `tokens` to the current document."""
    for j in range(tokens.shape[0]):
        c = tokens[j]
        pos = M[N_TOKENS]
        if pos == T.shape[0]:
            T2 = np.empty(max(pos + 1, pos + (pos >> 1) + 16), np.int32)
            T2[:pos] = T[:pos]
            T = T2
        T[pos] = c
        last = M[LAST_STATE]
        q = -1 if S[last, HEAD] == -1 else transition(S, E, H, last, c)
        if q != -1:
            # Generalized automaton: the new prefix already occurs (only after a document
            # start, where `last` may have outgoing edges).
            if S[q, LEN] == S[last, LEN] + 1:
                cur = q
            else:
                S, E, H, L, cur, stack = _clone(S, E, H, L, M, q, S[last, LEN] + 1, stack)
                p = last
                while p != -1:
                    e = find_edge(S, E, H, p, c)
                    if e == -1 or E[e, TO] != q:
                        break
                    E[e, TO] = cur
                    p = S[p, LINK]
        else:
            S, L, cur = _new_state(S, L, M, S[last, LEN] + 1, -1)
            p = last
            while p != -1 and find_edge(S, E, H, p, c) == -1:
                E, H = _add_edge(S, E, H, M, p, c, cur)
                p = S[p, LINK]
            if p == -1:
                _set_link(S, L, M, cur, 0)
            else:
                q = transition(S, E, H, p, c)
                if S[p, LEN] + 1 == S[q, LEN]:
                    _set_link(S, L, M, cur, q)
                else:
                    S, E, H, L, cl, stack = _clone(S, E, H, L, M, q, S[p, LEN] + 1, stack)
                    while p != -1:
                        e = find_edge(S, E, H, p, c)
                        if e == -1 or E[e, TO] != q:
                            break
                        E[e, TO] = cl
                        p = S[p, LINK]
                    _set_link(S, L, M, cur, cl)
        M[LAST_STATE] = cur
        if M[MODE] == MODE_ONLINE:
            stack = lct.add_position(L, S, cur, pos, stack)
        else:
            S[cur, CNT] += 1
            S[cur, LAST] = pos
        M[N_TOKENS] = pos + 1
    return S, E, H, T, L, stack


@njit(cache=True)
def accumulate(S, M):
    """MODE_BULK -> true counts: add each state's own positions into its suffix-link ancestors."""
    n = M[N_STATES]
    max_len = 0
    for v in range(n):
        if S[v, LEN] > max_len:
            max_len = S[v, LEN]
    # counting sort by LEN, deepest first
    bucket = np.zeros(max_len + 2, np.int64)
    for v in range(n):
        bucket[S[v, LEN] + 1] += 1
    for i in range(1, max_len + 2):
        bucket[i] += bucket[i - 1]
    order = np.empty(n, np.int32)
    for v in range(n):
        ln = S[v, LEN]
        order[bucket[ln]] = v
        bucket[ln] += 1
    for k in range(n - 1, 0, -1):
        v = order[k]
        p = S[v, LINK]
        if p >= 0:
            S[p, CNT] += S[v, CNT]
            if S[v, LAST] > S[p, LAST]:
                S[p, LAST] = S[v, LAST]


@njit(cache=True)
def init_lct(S, L, M):
    n = M[N_STATES]
    for v in range(n):
        lct.reset_node(L, v, S[v, LINK])


@njit(cache=True)
def advance(S, E, H, state, length, tokens):
    """Follow a growing context: longest suffix of (context + tokens) present in the text."""
    for j in range(tokens.shape[0]):
        c = tokens[j]
        while True:
            nxt = transition(S, E, H, state, c)
            if nxt != -1:
                state = nxt
                length += 1
                break
            if state == 0:
                length = 0
                break
            state = S[state, LINK]
            length = S[state, LEN]
    return state, length


@njit(cache=True)
def normalize(S, state, length):
    """A (state, length) pair may predate a clone that took its shorter strings: fix it up."""
    while state > 0 and S[S[state, LINK], LEN] >= length:
        state = S[state, LINK]
    return state


@njit(cache=True)
def locate(S, E, H, pattern):
    state = 0
    for j in range(pattern.shape[0]):
        state = transition(S, E, H, state, pattern[j])
        if state == -1:
            return -1
    return state


@njit(cache=True)
def true_values(S, L, M, states, stack):
    """Exact (count, last end position) of each state; splays in online mode."""
    out = np.empty((states.shape[0], 2), np.int64)
    online = M[MODE] == MODE_ONLINE
    for i in range(states.shape[0]):
        v = states[i]
        if online:
            stack = lct.splay(L, S, v, stack)
        out[i, 0] = S[v, CNT]
        out[i, 1] = S[v, LAST]
    return out, stack


@njit(cache=True)
def out_edges(S, E, state):
    """Outgoing (token, target) pairs of a state, sorted by token."""
    deg = 0
    e = S[state, HEAD]
    while e != -1:
        deg += 1
        e = E[e, NEXT]
    toks = np.empty(deg, np.int32)
    dsts = np.empty(deg, np.int32)
    e = S[state, HEAD]
    i = 0
    while e != -1:
        toks[i] = E[e, TOK]
        dsts[i] = E[e, TO]
        i += 1
        e = E[e, NEXT]
    order = np.argsort(toks, kind="mergesort")
    return toks[order], dsts[order]


@njit(cache=True)
def to_csr(S, E, M):
    """Frozen layout: per-state edge offsets and edges sorted by token within each state."""
    n = M[N_STATES]
    offsets = np.zeros(n + 1, np.int64)
    for v in range(n):
        deg = 0
        e = S[v, HEAD]
        while e != -1:
            deg += 1
            e = E[e, NEXT]
        offsets[v + 1] = offsets[v] + deg
    m = offsets[n]
    etok = np.empty(m, np.int32)
    eto = np.empty(m, np.int32)
    for v in range(n):
        lo = offsets[v]
        k = lo
        e = S[v, HEAD]
        while e != -1:
            etok[k] = E[e, TOK]
            eto[k] = E[e, TO]
            k += 1
            e = E[e, NEXT]
        hi = k
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
    return offsets, etok, eto
