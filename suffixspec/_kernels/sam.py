"""Growable suffix automaton over int32 token ids: its arrays and their construction.

Arrays (owned by `suffixspec.draft.automaton.SuffixAutomaton`, passed in and returned because
growth reallocates them):

- `S` int32[cap, 6]: per state LINK (suffix link, -1 for the root), LEN (longest string),
  HEAD (first outgoing edge, -1 for none), CNT (end positions), LAST (most recent end position),
  DEG (number of outgoing edges).
- `E` int32[cap, 4]: per edge SRC, TOK, TO, NEXT (next edge of the same source, -1 ends).
- `H` int32[2**b]: open-addressing hash table (linear probing) of edge ids keyed by (SRC, TOK),
  holding only the edges of states with more than SMALL_DEG edges (hubs such as the root);
  -1 marks an empty slot; the size is a power of two, kept at most 70% full.
- `T` int32[cap]: the indexed tokens, all documents concatenated.
- `L` int32[cap, 5]: the link-cut tree (see lct.py), used once counts are kept online.
- `M` int64[META]: N_STATES, N_EDGES, LAST_STATE, N_TOKENS, MODE, N_HASHED.

MODE_BULK: CNT/LAST of each state hold only its *own* positions (those whose whole document
prefix ends in that state); `accumulate` turns them into subtree sums and switches to
MODE_ONLINE, where every new position updates its root path through the link-cut tree.
`extend` is the one construction of the automaton (`build.py` and the corpus shards run it too):
in bulk mode `_extend_bulk`, a loop that never reallocates, returning to `extend` to grow the
arrays; the online mode and over-long suffix-link walks use `_extend_general`. Conversions
to and from the frozen layout are in sam_freeze.py. The live frame (`write_live`, `live_arrays`) names the current arrays for the proposal kernels.

Documents: the automaton is a generalized one; `M[LAST_STATE] = 0` starts a new document,
so no match spans two documents. Queries over these arrays are in sam_query.py.
"""

import numpy as np
from numba import njit

from ..errors import InternalError
from . import lct
from .address import address, prefetch_address, view_i32, view_i32_2d, view_i64

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


@njit(cache=True, nogil=True, inline="always")
def edge_to(g, state, tok):
    """`follow.follow`'s lookup over g = (S, E, H)."""
    return transition(g[0], g[1], g[2], state, tok)


@njit(cache=True, nogil=True, inline="always")
def link_up(g, state, steps):
    """`follow.follow`'s suffix-link step over g = (S, E, H)."""
    p = g[0][state, LINK]
    return p, g[0][p, LEN]


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
def rehash(S, E, n_edges, size):
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
        H = rehash(S, E, e + 1, size)
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
def _extend_bulk(S, E, H, T, M, tokens, j, P):
    """MODE_BULK extension with tokens[j:] for as long as the arrays have room (P: see
    `extend_recording`).

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
    record = P.shape[0] > 0
    hmask = H.shape[0] - 1
    h_data = H.ctypes.data
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
                # the hash slot of (p, c) loads alongside p's row: a hub's lookup costs no second serial miss
                prefetch_address(h_data + 4 * _slot(p, c, hmask))
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
                    prefetch_address(h_data + 4 * _slot(p, c, hmask))
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
        if record:
            P[pos] = cur
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
    return extend_recording(S, E, H, T, L, M, tokens, stack, np.empty(0, np.int32))


@njit(cache=True, nogil=True)
def extend_recording(S, E, H, T, L, M, tokens, stack, P):
    """`extend`, in MODE_BULK also writing each new position's prefix state (the state of its
    whole document prefix, `M[LAST_STATE]` after it) at P[position]: P int32 with room for
    N_TOKENS + len(tokens) entries, or empty to record nothing (the online mode records nothing)."""
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
        j, need = _extend_bulk(S, E, H, T, M, tokens, j, P)
        if j == n:
            break
        if need < 0:
            S, E, H, T, L, stack = _extend_general(S, E, H, T, L, M, tokens[j : j + 1], stack)
            if P.shape[0] > 0:
                P[M[N_TOKENS] - 1] = M[LAST_STATE]
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
            H = rehash(S, E, ne, size)
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


@njit(cache=True)
def init_lct(S, L, M):
    n = M[N_STATES]
    for v in range(n):
        lct.reset_node(L, v, S[v, LINK])
