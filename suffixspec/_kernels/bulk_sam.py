"""A corpus shard's suffix automaton built in cache-line rows: `sam.extend`'s construction, another layout.

Contract: `build_rows(tokens, starts, P)` returns a `RowAutomaton` holding the automaton that
`build.documents_automaton(tokens, starts, P)` builds (each document from the root, `starts` as
there: 0 first, increasing, each below len(tokens)): the same states in the same order, with the
same suffix links, lengths and edges (listed in another order), and the same prefix state of
every position in P int32[len(tokens)]. It runs the same algorithm (the bulk loop of sam.py: a
read-only suffix-link walk per token, then its edges, state and clone); only the storage
differs, for fewer cache misses per token:

- `S` int32[rows * ROW]: state v's row at v * ROW (32 bytes, two to a cache line): LINK, LEN,
  DEG (outgoing edges), OVF (first overflow slot, -1 none), then up to INLINE edges (token,
  target) in the row itself, so that a lookup at a state of small degree reads one line.
- `O` int32[size, O_COLS]: the edges of a state past its first INLINE, in an open-addressing
  table (linear probing, any size, at most half full) keyed by (source, token), a key's first slot
  the high half of its hash scaled to the size:
  O_SRC (-1: empty), O_TOK, O_TO, O_NEXT (the source's next overflow slot, -1 ends).
- `R0` int32[max token + 1]: the root's edges, dense (target or -1): the root is never cloned,
  and a walk ends there for every token not seen after its context. Empty when the largest
  token id is above `dense_root_limit(n)`: the root's edges are then stored as any state's.
- `M` int64[META]: N_STATES, N_EDGES, N_OVER (edges in O), N_TOKENS (positions done), LAST_STATE, NEXT_DOC.

A kernel call never reallocates (its arrays stay loop-invariant); it returns to `build_rows`
for a larger O (`rehash`) or S. Freezing these rows into a shard is bulk_freeze.py's.
"""

from dataclasses import dataclass

import numpy as np
from numba import njit

from .address import borrowed, keep_alive, prefetch_address
from .pages import Scratch, anonymous

LINK, LEN, DEG, OVF = 0, 1, 2, 3
EDGE0 = 4  # inline edge i: token at EDGE0 + 2 i, target at EDGE0 + 2 i + 1
INLINE = 2
ROW = 8
O_SRC, O_TOK, O_TO, O_NEXT = 0, 1, 2, 3
O_COLS = 4
N_STATES, N_EDGES, N_OVER, N_TOKENS, LAST_STATE, NEXT_DOC = range(6)
META = 6
DONE, GROW_O, GROW_S = 0, 1, 2


@dataclass
class RowAutomaton:
    """The arrays of a built automaton (see the module docstring); `S2` is S as rows int32[rows, ROW]."""

    S: np.ndarray
    O: np.ndarray
    R0: np.ndarray
    M: np.ndarray

    @property
    def S2(self) -> np.ndarray:
        return self.S.reshape(-1, ROW)

    @property
    def n_states(self) -> int:
        return int(self.M[N_STATES])

    @property
    def n_edges(self) -> int:
        return int(self.M[N_EDGES])


def aligned_rows(rows: int, scratch: Scratch | None = None) -> np.ndarray:
    """int32[rows * ROW] for state rows (page-aligned: every row within one cache line), uninitialised,
    from `scratch` when given."""
    return anonymous(rows * ROW, np.int32) if scratch is None else scratch.take("rows", rows * ROW, np.int32)


@njit(cache=True, inline="always")
def _slot(src, tok, size):
    key = (np.uint64(src) << np.uint64(32)) | np.uint64(tok)
    h = key * np.uint64(0x9E3779B97F4A7C15)
    return np.int64(((h >> np.uint64(32)) * np.uint64(size)) >> np.uint64(32))  # size < 2 ** 32


@njit(cache=True, inline="always")
def _find(S, O, R0, p, c):
    """A handle of the edge (p, c), -1 for none: >= 0, the index in S of an inline target; -2 - i,
    O's slot i; -2 - O.shape[0] - c, the root's."""
    if p == 0 and R0.shape[0] > 0:
        return -2 - O.shape[0] - c if R0[c] != -1 else -1
    b = p * ROW
    d = S[b + DEG]
    for i in range(d if d < INLINE else INLINE):
        if S[b + EDGE0 + 2 * i] == c:
            return b + EDGE0 + 2 * i + 1
    if d > INLINE:
        size = O.shape[0]
        i = _slot(p, c, size)
        while True:
            s = O[i, O_SRC]
            if s == -1:
                return -1
            if s == p and O[i, O_TOK] == c:
                return -2 - i
            i += 1
            if i == size:
                i = 0
    return -1


@njit(cache=True, inline="always")
def _target(S, O, R0, h):
    if h >= 0:
        return S[h]
    i = -2 - h
    return O[i, O_TO] if i < O.shape[0] else R0[i - O.shape[0]]


@njit(cache=True, inline="always")
def _retarget(S, O, R0, h, v):
    if h >= 0:
        S[h] = v
    else:
        i = -2 - h
        if i < O.shape[0]:
            O[i, O_TO] = v
        else:
            R0[i - O.shape[0]] = v


@njit(cache=True, inline="always")
def _insert(O, src, tok, dst, nxt):
    size = O.shape[0]
    i = _slot(src, tok, size)
    while O[i, O_SRC] != -1:
        i += 1
        if i == size:
            i = 0
    O[i, O_SRC] = src
    O[i, O_TOK] = tok
    O[i, O_TO] = dst
    O[i, O_NEXT] = nxt
    return i


@njit(cache=True, inline="always")
def _push(S, O, R0, src, tok, dst):
    """Add the edge src -tok-> dst (src has none for tok); returns the edges it put in O (0 or 1)."""
    b = src * ROW
    d = S[b + DEG]
    S[b + DEG] = d + 1
    if src == 0 and R0.shape[0] > 0:
        R0[tok] = dst
        return 0
    if d < INLINE:
        S[b + EDGE0 + 2 * d] = tok
        S[b + EDGE0 + 2 * d + 1] = dst
        return 0
    S[b + OVF] = _insert(O, src, tok, dst, S[b + OVF])
    return 1


@njit(cache=True, inline="always")
def _init(S, v, length, link):
    b = v * ROW
    S[b + LINK] = link
    S[b + LEN] = length
    S[b + DEG] = 0
    S[b + OVF] = -1


@njit(cache=True, nogil=True)
def rehash(S, O, size):
    """O's edges in a new table of `size` slots, the overflow lists rebuilt."""
    table = np.full((size, O_COLS), -1, np.int32)
    S, O, out = borrowed(S), borrowed(O), borrowed(table)
    for i in range(O.shape[0]):
        s = O[i, O_SRC]
        if s != -1:
            S[s * ROW + OVF] = -1
    for i in range(O.shape[0]):
        s = O[i, O_SRC]
        if s != -1:
            b = s * ROW
            S[b + OVF] = _insert(out, s, O[i, O_TOK], O[i, O_TO], S[b + OVF])
    keep_alive(table)
    return table


@njit(cache=True, nogil=True)
def _run(S, O, R0, M, tokens, starts, P):
    """Add tokens from position M[N_TOKENS] on (documents restart at the root at `starts`) while
    the arrays have room: (DONE, 0), or (GROW_O, edges O must take for the next token) or
    (GROW_S, 2) with nothing of that token applied."""
    # views without reference counts (the caller holds the arrays): the inlined helpers take arrays
    S, O, R0, M, tokens, starts, P = (borrowed(S), borrowed(O), borrowed(R0), borrowed(M), borrowed(tokens),
                                      borrowed(starts), borrowed(P))
    n = tokens.shape[0]
    ns = M[N_STATES]
    ne = M[N_EDGES]
    no = M[N_OVER]
    pos = M[N_TOKENS]
    last = M[LAST_STATE]
    doc = M[NEXT_DOC]
    n_docs = starts.shape[0]
    cap_s = S.shape[0] // ROW
    cap_o = O.shape[0] // 2
    s_data = S.ctypes.data
    o_data = O.ctypes.data
    o_size = O.shape[0]
    status = DONE
    need = 0
    while pos < n:
        if doc < n_docs and starts[doc] == pos:
            last = 0
            doc += 1
        c = tokens[pos]
        bl = last * ROW
        last_len = S[bl + LEN]
        # -- read-only walk: the first state p (from `last` up) with an edge c, k = edges to add
        h = -1 if S[bl + DEG] == 0 else _find(S, O, R0, last, c)
        k = 0
        p = last
        if h == -1:
            k = 1
            p = S[bl + LINK]
            while p != -1:
                nxt = S[p * ROW + LINK]
                if nxt > 0:  # its row and its overflow slot for c load while p is searched
                    prefetch_address(s_data + 4 * ROW * nxt)
                    prefetch_address(o_data + 4 * O_COLS * _slot(nxt, c, o_size))
                h = _find(S, O, R0, p, c)
                if h != -1:
                    break
                k += 1
                p = nxt
        q = -1
        clone = False
        if h != -1:
            q = _target(S, O, R0, h)
            clone = S[q * ROW + LEN] != S[p * ROW + LEN] + 1
        need = k + (S[q * ROW + DEG] + 1 if clone else 0)  # q may itself gain an edge c first
        if ns + 2 > cap_s:
            status = GROW_S
            need = 2
            break
        if no + need > cap_o:
            status = GROW_O
            break
        # -- apply
        if k == 0 and not clone:
            cur = q  # generalized automaton: the new prefix already occurs (after a document start)
        else:
            if k == 0:
                cur = -1
            else:
                cur = ns
                _init(S, cur, last_len + 1, -1)
                ns += 1
                r = last
                for _ in range(k):
                    no += _push(S, O, R0, r, c, cur)
                    r = S[r * ROW + LINK]
                ne += k
            if p == -1:
                link = 0
            elif not clone:
                link = q
            else:
                cl = ns
                bq = q * ROW
                _init(S, cl, S[p * ROW + LEN] + 1, S[bq + LINK])
                ns += 1
                d = S[bq + DEG]
                for i in range(d if d < INLINE else INLINE):
                    no += _push(S, O, R0, cl, S[bq + EDGE0 + 2 * i], S[bq + EDGE0 + 2 * i + 1])
                f = S[bq + OVF]
                while f != -1:
                    no += _push(S, O, R0, cl, O[f, O_TOK], O[f, O_TO])
                    f = O[f, O_NEXT]
                ne += d
                S[bq + LINK] = cl
                while True:
                    _retarget(S, O, R0, h, cl)
                    p = S[p * ROW + LINK]
                    if p == -1:
                        break
                    nxt = S[p * ROW + LINK]
                    if nxt > 0:
                        prefetch_address(s_data + 4 * ROW * nxt)
                        prefetch_address(o_data + 4 * O_COLS * _slot(nxt, c, o_size))
                    h = _find(S, O, R0, p, c)
                    if h == -1 or _target(S, O, R0, h) != q:
                        break
                link = cl
            if cur == -1:
                cur = link  # generalized case with a clone: the clone is the new prefix's state
            else:
                S[cur * ROW + LINK] = link
        last = cur
        P[pos] = cur
        pos += 1
        if pos < n:  # the next token's first lookup, at this one's suffix link
            lk = S[cur * ROW + LINK]
            if lk > 0:
                prefetch_address(o_data + 4 * O_COLS * _slot(lk, tokens[pos], o_size))
                prefetch_address(s_data + 4 * ROW * S[lk * ROW + LINK])
    M[N_STATES] = ns
    M[N_EDGES] = ne
    M[N_OVER] = no
    M[N_TOKENS] = pos
    M[LAST_STATE] = last
    M[NEXT_DOC] = doc
    return status, need


def dense_root_limit(n_tokens: int) -> int:
    """The largest token id (exclusive) for which the root's edges are kept dense."""
    return min(max(1 << 16, 4 * n_tokens), 1 << 24)


def _table_size(edges: int) -> int:
    """Slots of a table at most half full with `edges` (whole cache lines of them)."""
    return max(1024, -(-2 * int(edges) // 64) * 64)


def build_rows(tokens: np.ndarray, starts: np.ndarray, P: np.ndarray, state_rows: int | None = None,
               table_slots: int | None = None, scratch: Scratch | None = None) -> RowAutomaton:
    """The automaton of the documents (see the module docstring); `tokens` int32 (each >= 0),
    `starts` int64, P int32[len(tokens)] filled with each position's prefix state. `state_rows` and
    `table_slots` size S and O at first (default: room for every state, a table for 0.45 overflow
    edges a token: code takes about 0.4, prose about 0.5, and growing the table on the way rehashes
    every edge in it); they grow as needed, and change no result. With `scratch`, S and O are its
    buffers "rows" and "overflow" (valid until the next build from it)."""
    n = tokens.shape[0]
    # a generalized automaton over n tokens has at most 2n states
    S = aligned_rows(2 * n + 2 if state_rows is None else max(int(state_rows), 1), scratch)
    top = int(tokens.max()) if n else 0
    R0 = np.full(top + 1 if top < dense_root_limit(n) else 0, -1, np.int32)
    size = _table_size(n * 45 // 100) if table_slots is None else int(table_slots)
    O = (anonymous(size * O_COLS, np.int32) if scratch is None else scratch.take("overflow", size * O_COLS, np.int32)
         ).reshape(size, O_COLS)
    O.fill(-1)
    M = np.zeros(META, np.int64)
    M[N_STATES] = 1
    S[:ROW] = 0
    S[LINK], S[OVF] = -1, -1
    while True:
        status, need = _run(S, O, R0, M, tokens, starts, P)
        if status == DONE:
            return RowAutomaton(S, O, R0, M)
        if status == GROW_O:
            O = rehash(S, O, _table_size(int(M[N_OVER]) + need + (O.shape[0] >> 1)))  # about twice the slots
        else:
            rows = int(M[N_STATES])
            # (a new buffer, S keeping its pages meanwhile; or the scratch's own, if it has room: then the
            # copy below writes S onto itself)
            S2 = aligned_rows(rows + max(rows >> 1, need) + 16, scratch)
            S2[: rows * ROW] = S[: rows * ROW]
            S = S2
