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

Speed: `extend` in bulk mode runs `_extend_bulk`, a loop that never reallocates (arrays that a
loop may rebind make numba emit far slower code, about 2x here): each token first walks its
suffix-link path read-only to learn how many rows it needs, and the loop returns to `extend`
to grow the arrays (sized by projecting the rows-per-token rate seen so far) when they would
not fit. The online mode and over-long walks use `_extend_general`.

Documents: the automaton is a generalized one; `M[LAST_STATE] = 0` starts a new document,
so no match spans two documents.
"""

import numpy as np
from numba import njit

from . import lct
from .address import address, view_i32, view_i32_2d, view_i64
from ..errors import InternalError

LINK, LEN, HEAD, CNT, LAST, DEG = 0, 1, 2, 3, 4, 5
STATE_COLS = 6
SRC, TOK, TO, NEXT = 0, 1, 2, 3
N_STATES, N_EDGES, LAST_STATE, N_TOKENS, MODE, N_HASHED = 0, 1, 2, 3, 4, 5
META = 6
SMALL_DEG = 6
MODE_BULK, MODE_ONLINE = 0, 1
HASH_LOAD_NUM, HASH_LOAD_DEN = 7, 10
E_COLS, L_COLS = 4, 5

# The live frame (int64, see address.py): what a proposal reads of an automaton (S, E, L, M and
# the link-cut stack) as addresses and row counts. Its owner rewrites it whenever an array is
# replaced; a kernel that outgrows the stack works on a grown copy that it drops.
LIVE_S, LIVE_S_ROWS, LIVE_E, LIVE_E_ROWS, LIVE_L, LIVE_L_ROWS, LIVE_M, LIVE_STACK, LIVE_STACK_LEN = range(9)
LIVE_LEN = 9


def write_live(live, S, E, L, M, stack) -> None:
    if S.shape[1:] != (STATE_COLS,) or E.shape[1:] != (E_COLS,) or L.shape[1:] != (L_COLS,) or M.shape != (META,):
        raise InternalError(f"write_live: unexpected shapes S {S.shape}, E {E.shape}, L {L.shape}, M {M.shape}")
    live[LIVE_S], live[LIVE_S_ROWS] = address(S, np.int32), S.shape[0]
    live[LIVE_E], live[LIVE_E_ROWS] = address(E, np.int32), E.shape[0]
    live[LIVE_L], live[LIVE_L_ROWS] = address(L, np.int32), L.shape[0]
    live[LIVE_M] = address(M, np.int64)
    live[LIVE_STACK], live[LIVE_STACK_LEN] = address(stack, np.int32), stack.shape[0]


@njit(cache=True, nogil=True, inline="always")
def live_arrays(live):
    """(S, E, L, M, stack) named by a live frame."""
    return (view_i32_2d(live[LIVE_S], live[LIVE_S_ROWS], STATE_COLS),
            view_i32_2d(live[LIVE_E], live[LIVE_E_ROWS], E_COLS),
            view_i32_2d(live[LIVE_L], live[LIVE_L_ROWS], L_COLS),
            view_i64(live[LIVE_M], META),
            view_i32(live[LIVE_STACK], live[LIVE_STACK_LEN]))


@njit(cache=True, inline="always")
def _slot(src, tok, mask):
    key = (np.uint64(src) << np.uint64(32)) | np.uint64(tok)
    h = key * np.uint64(0x9E3779B97F4A7C15)
    return np.int64((h >> np.uint64(29)) & np.uint64(mask))


@njit(cache=True, inline="always")
def _find_edge(S, E, H, src, tok):
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


@njit(cache=True)
def find_edge(S, E, H, src, tok):
    return _find_edge(S, E, H, src, tok)


@njit(cache=True, inline="always")
def transition(S, E, H, src, tok):
    e = find_edge(S, E, H, src, tok)
    return -1 if e == -1 else E[e, TO]


@njit(cache=True)
def _resized(a, used, new_cap):
    b = np.empty((new_cap, a.shape[1]), a.dtype)
    b[:used] = a[:used]
    return b


@njit(cache=True)
def _resized_1d(a, used, new_cap):
    b = np.empty(new_cap, a.dtype)
    b[:used] = a[:used]
    return b


@njit(cache=True)
def _grown(a, used, need, added, done, todo):
    """A larger copy of the full row array `a` during an extend call that has added `added`
    rows over its first `done` tokens and has `todo` tokens to go: sized by projecting that
    rate over the rest of the call (+3%), so that a bulk build reallocates about once; plain
    1.5x growth when the projection says little (few tokens seen, or few left)."""
    cap = a.shape[0]
    new_cap = cap + (cap >> 1) + 16
    if done >= 4096 and todo >= 4096:
        more = (added * todo) // done
        new_cap = max(used + more + (more >> 5) + 4096, cap + (cap >> 3) + 16)
    return _resized(a, used, max(new_cap, used + need))


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
def _index_hub_edge(S, E, H, M, e, deg):
    """Edge e was just pushed on a state now of degree `deg` > SMALL_DEG: put it in the hash
    (all of the state's edges when it just turned into a hub), growing the table if needed."""
    added = deg if deg == SMALL_DEG + 1 else 1
    hashed = M[N_HASHED] + added
    if hashed * HASH_LOAD_DEN > H.shape[0] * HASH_LOAD_NUM:
        size = H.shape[0]
        while hashed * HASH_LOAD_DEN > size * HASH_LOAD_NUM:
            size *= 2
        H = _rehash(S, E, e + 1, size)
    else:
        f = e
        for _ in range(added):
            _hash_insert(E, H, f)
            f = E[f, NEXT]
    M[N_HASHED] = hashed
    return H


@njit(cache=True, inline="always")
def _add_edge(S, E, H, M, e, src, tok, dst, e0, done, todo):
    """Push edge number `e` (the next free row) src -> dst on src's list (e0: edges before
    this extend call, done/todo: its tokens processed/left, to size a reallocation)."""
    if e == E.shape[0]:
        E = _grown(E, e, 1, e - e0, done, todo)
    E[e, SRC] = src
    E[e, TOK] = tok
    E[e, TO] = dst
    E[e, NEXT] = S[src, HEAD]
    S[src, HEAD] = e
    deg = S[src, DEG] + 1
    S[src, DEG] = deg
    if deg > SMALL_DEG:
        H = _index_hub_edge(S, E, H, M, e, deg)
    return E, H


@njit(cache=True, inline="always")
def _new_state(S, L, v, online, length, link, v0, done, todo):
    if v == S.shape[0]:
        S = _grown(S, v, 1, v - v0, done, todo)
    S[v, LINK] = link
    S[v, LEN] = length
    S[v, HEAD] = -1
    S[v, CNT] = 0
    S[v, LAST] = -1
    S[v, DEG] = 0
    if online:
        if v >= L.shape[0]:
            L = _resized(L, L.shape[0], S.shape[0])
        lct.reset_node(L, v, -1)
    return S, L


@njit(cache=True)
def _online_split(S, L, q, c, stack):
    """Link-cut tree side of cloning q into c: c takes q's values and its place under q's parent."""
    stack = lct.splay(L, S, q, stack)
    S[c, CNT] = S[q, CNT]
    S[c, LAST] = S[q, LAST]
    parent = S[q, LINK]
    stack = lct.cut(L, S, q, stack)
    L[c, lct.PAR] = parent
    L[q, lct.PAR] = c
    return stack


@njit(cache=True)
def _extend_general(S, E, H, T, L, M, tokens, stack):
    """Append `tokens` in any mode (the online one, and single tokens the bulk loop hands over).

    One fused loop (helpers inlined, counters kept in locals, capacity checks inline) with at
    most one edge lookup per (state, token) pair: the edge found where the suffix-link walk
    stops is reused for the transition and for the first redirect after a clone.
    """
    online = M[MODE] == MODE_ONLINE
    ns = M[N_STATES]
    ne = M[N_EDGES]
    pos = M[N_TOKENS]
    last = M[LAST_STATE]
    n = tokens.shape[0]
    ns0 = ns
    ne0 = ne
    # every token adds a state and an edge, except after a document start: reserve that much
    if ns + n > S.shape[0]:
        S = _resized(S, ns, max(ns + n + 16, S.shape[0] + (S.shape[0] >> 1) + 16))
    if ne + n > E.shape[0]:
        E = _resized(E, ne, max(ne + n + 16, E.shape[0] + (E.shape[0] >> 1) + 16))
    if pos + n > T.shape[0]:
        T2 = np.empty(max(pos + n, pos + (pos >> 1) + 16), np.int32)
        T2[:pos] = T[:pos]
        T = T2
    for j in range(n):
        c = tokens[j]
        T[pos] = c
        last_len = S[last, LEN]
        e = -1 if S[last, HEAD] == -1 else _find_edge(S, E, H, last, c)
        if e != -1:
            # Generalized automaton: the new prefix already occurs (only after a document
            # start, where `last` may have outgoing edges).
            q = E[e, TO]
            if S[q, LEN] == last_len + 1:
                cur = q
            else:
                p = last
                cur = ns
                S, L = _new_state(S, L, cur, online, last_len + 1, S[q, LINK], ns0, j, n - j)
                ns += 1
                f = S[q, HEAD]
                while f != -1:
                    E, H = _add_edge(S, E, H, M, ne, cur, E[f, TOK], E[f, TO], ne0, j, n - j)
                    ne += 1
                    f = E[f, NEXT]
                if online:
                    stack = _online_split(S, L, q, cur, stack)
                S[q, LINK] = cur
                while True:
                    E[e, TO] = cur
                    p = S[p, LINK]
                    if p == -1:
                        break
                    e = _find_edge(S, E, H, p, c)
                    if e == -1 or E[e, TO] != q:
                        break
        else:
            cur = ns
            S, L = _new_state(S, L, cur, online, last_len + 1, -1, ns0, j, n - j)
            ns += 1
            p = last
            while p != -1:
                e = _find_edge(S, E, H, p, c)
                if e != -1:
                    break
                E, H = _add_edge(S, E, H, M, ne, p, c, cur, ne0, j, n - j)
                ne += 1
                p = S[p, LINK]
            if p == -1:
                link = 0
            else:
                q = E[e, TO]
                if S[p, LEN] + 1 == S[q, LEN]:
                    link = q
                else:
                    cl = ns
                    S, L = _new_state(S, L, cl, online, S[p, LEN] + 1, S[q, LINK], ns0, j, n - j)
                    ns += 1
                    f = S[q, HEAD]
                    while f != -1:
                        E, H = _add_edge(S, E, H, M, ne, cl, E[f, TOK], E[f, TO], ne0, j, n - j)
                        ne += 1
                        f = E[f, NEXT]
                    if online:
                        stack = _online_split(S, L, q, cl, stack)
                    S[q, LINK] = cl
                    while True:
                        E[e, TO] = cl
                        p = S[p, LINK]
                        if p == -1:
                            break
                        e = _find_edge(S, E, H, p, c)
                        if e == -1 or E[e, TO] != q:
                            break
                    link = cl
            S[cur, LINK] = link
            if online:
                L[cur, lct.PAR] = link
        last = cur
        if online:
            stack = lct.add_position(L, S, cur, pos, stack)
        else:
            S[cur, CNT] += 1
            S[cur, LAST] = pos
        pos += 1
    M[N_STATES] = ns
    M[N_EDGES] = ne
    M[N_TOKENS] = pos
    M[LAST_STATE] = last
    return S, E, H, T, L, stack


WALK_LIMIT = 1 << 12  # longer suffix-link walks (one token adding that many edges) go to _extend_general


@njit(cache=True, inline="always")
def _push_edge(S, E, H, e, src, tok, dst, hashed):
    """Push edge row `e` src -> dst on src's list, indexing it if src is a hub; the caller
    guarantees room in E and H. Returns the new number of hashed edges."""
    E[e, SRC] = src
    E[e, TOK] = tok
    E[e, TO] = dst
    E[e, NEXT] = S[src, HEAD]
    S[src, HEAD] = e
    deg = S[src, DEG] + 1
    S[src, DEG] = deg
    if deg > SMALL_DEG:
        if deg == SMALL_DEG + 1:  # src just turned into a hub: index all its edges
            f = e
            while f != -1:
                _hash_insert(E, H, f)
                f = E[f, NEXT]
            hashed += deg
        else:
            _hash_insert(E, H, e)
            hashed += 1
    return hashed


@njit(cache=True, inline="always")
def _init_state(S, v, length, link):
    S[v, LINK] = link
    S[v, LEN] = length
    S[v, HEAD] = -1
    S[v, CNT] = 0
    S[v, LAST] = -1
    S[v, DEG] = 0


@njit(cache=True)
def _extend_bulk(S, E, H, T, M, tokens, j):
    """MODE_BULK extension with tokens[j:] for as long as the arrays have room.

    Never reallocates, so S, E, H, T stay loop-invariant (much faster code than a loop that
    may rebind them). Each token first walks its suffix-link path read-only, to learn how
    many edges it adds (`k` new ones plus the edges of a clone); if they do not fit, it
    returns (j, need) before touching anything and the caller grows the arrays and calls
    again; need = -1 when the walk is longer than WALK_LIMIT (the caller hands that token to
    `_extend_general`). Returns (n, 0) when all tokens are in. T must hold every token.
    """
    n = tokens.shape[0]
    ns = M[N_STATES]
    ne = M[N_EDGES]
    nh = M[N_HASHED]
    pos = M[N_TOKENS]
    last = M[LAST_STATE]
    cap_s = S.shape[0]
    cap_e = E.shape[0]
    cap_h = (H.shape[0] * HASH_LOAD_NUM) // HASH_LOAD_DEN
    need = 0
    while j < n:
        c = tokens[j]
        last_len = S[last, LEN]
        # -- read-only walk: first state p (from `last` up) with an edge c, and k = edges to add
        e = -1 if S[last, HEAD] == -1 else _find_edge(S, E, H, last, c)
        k = 0
        p = last
        if e == -1:
            k = 1
            p = S[last, LINK]
            while p != -1:
                e = _find_edge(S, E, H, p, c)
                if e != -1:
                    break
                k += 1
                if k > WALK_LIMIT:
                    break
                p = S[p, LINK]
            if k > WALK_LIMIT:
                need = -1
                break
        q = -1
        clone = False
        if e != -1:
            q = E[e, TO]
            clone = S[q, LEN] != S[p, LEN] + 1
        need = k + (S[q, DEG] + 1 if clone else 0)  # q may itself gain an edge c first
        if ns + 2 > cap_s or ne + need > cap_e or nh + (SMALL_DEG + 1) * need > cap_h:
            need = max(need, 1)
            break
        need = 0
        # -- apply
        T[pos] = c
        if k == 0 and not clone:
            cur = q  # generalized automaton: the new prefix already occurs (after a document start)
        else:
            if k == 0:
                cur = -1
            else:
                cur = ns
                _init_state(S, cur, last_len + 1, -1)
                ns += 1
                r = last
                for _ in range(k):
                    nh = _push_edge(S, E, H, ne, r, c, cur, nh)
                    ne += 1
                    r = S[r, LINK]
            if p == -1:
                link = 0
            elif not clone:
                link = q
            else:
                cl = ns
                _init_state(S, cl, S[p, LEN] + 1, S[q, LINK])
                ns += 1
                f = S[q, HEAD]
                while f != -1:
                    nh = _push_edge(S, E, H, ne, cl, E[f, TOK], E[f, TO], nh)
                    ne += 1
                    f = E[f, NEXT]
                S[q, LINK] = cl
                while True:
                    E[e, TO] = cl
                    p = S[p, LINK]
                    if p == -1:
                        break
                    e = _find_edge(S, E, H, p, c)
                    if e == -1 or E[e, TO] != q:
                        break
                link = cl
            if cur == -1:
                cur = link  # generalized case with a clone: the clone is the new prefix's state
            else:
                S[cur, LINK] = link
        last = cur
        S[cur, CNT] += 1
        S[cur, LAST] = pos
        pos += 1
        j += 1
    M[N_STATES] = ns
    M[N_EDGES] = ne
    M[N_HASHED] = nh
    M[N_TOKENS] = pos
    M[LAST_STATE] = last
    return j, need


@njit(cache=True, nogil=True)
def extend(S, E, H, T, L, M, tokens, stack):
    """Append `tokens` to the current document."""
    n = tokens.shape[0]
    pos = M[N_TOKENS]
    if pos + n > T.shape[0]:
        T = _resized_1d(T, pos, max(pos + n, pos + (pos >> 1) + 16))
    if M[MODE] == MODE_ONLINE:
        return _extend_general(S, E, H, T, L, M, tokens, stack)
    ns0 = M[N_STATES]
    ne0 = M[N_EDGES]
    # every token adds a state and an edge, except after a document start: reserve that much
    if ns0 + n > S.shape[0]:
        S = _resized(S, ns0, max(ns0 + n + 16, S.shape[0] + (S.shape[0] >> 1) + 16))
    if ne0 + n > E.shape[0]:
        E = _resized(E, ne0, max(ne0 + n + 16, E.shape[0] + (E.shape[0] >> 1) + 16))
    j = 0
    while j < n:
        j, need = _extend_bulk(S, E, H, T, M, tokens, j)
        if j == n:
            break
        if need < 0:
            S, E, H, T, L, stack = _extend_general(S, E, H, T, L, M, tokens[j : j + 1], stack)
            j += 1
            continue
        ns, ne = M[N_STATES], M[N_EDGES]
        if ns + 2 > S.shape[0]:
            S = _grown(S, ns, 2, ns - ns0, j, n - j)
        if ne + need > E.shape[0]:
            E = _grown(E, ne, need, ne - ne0, j, n - j)
        hashed = M[N_HASHED] + (SMALL_DEG + 1) * need
        if hashed * HASH_LOAD_DEN > H.shape[0] * HASH_LOAD_NUM:
            size = H.shape[0]
            while hashed * HASH_LOAD_DEN > size * HASH_LOAD_NUM:
                size *= 2
            H = _rehash(S, E, ne, size)
    return S, E, H, T, L, stack


@njit(cache=True, nogil=True)
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
    return S, E, _rehash(S, E, m, size), M


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
    n = M[N_STATES]
    m = M[N_EDGES]
    offsets[0] = 0
    for v in range(n):
        offsets[v + 1] = offsets[v] + S[v, DEG]
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
