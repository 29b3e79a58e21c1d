"""Recovery after a mismatch: where a copy of the request's own text goes on once the model wrote a
token that the copy did not have.

A copy drafted from the request's longest earlier match u (of the committed text but its last
token x) breaks when x is not a continuation of u: the model replaced the copied token (it writes
the same code with another name) or inserted x before it. Either way the copy often goes on as
before: after u's continuation y (substitution: what followed u y; insertion: y itself, then the
same). `recovery_row` finds that state for a session (`session.py`, before x is added to its
automaton): u is the suffix link of the prefix state of the text without x; y its continuation of
the most recent end (what a copy of the latest occurrence drafted). The row (`RROW_*`) names
the state reached through y, the matched length there and y; the draft kernel seeds two parts from
it (`SRC_SUBST`, `SRC_INSERT`; the insertion's part is a session's last), weighed by the proposer's `recover` knob.
"""

import numpy as np
from numba import njit

from . import sam as sk
from .children import CHILD_BUF, DEEP_BUF, K_LAST, K_STATE, K_TOK, KID_COLS, gather_live

# A session's recovery row (int64 [RROW_COLS]): the state reached from the broken match through its
# continuation y, the length matched there, and y; state -1: none. The parts it seeds (`part_src`
# values of the draft kernel's workspace) read the live automaton like the session's own parts.
RROW_STATE, RROW_LEN, RROW_TOK = 0, 1, 2
RROW_COLS = 3
SRC_SUBST, SRC_INSERT = -2, -3  # the substitution's part (what followed y), the insertion's (y, then the same)


@njit(cache=True, nogil=True)
def recovery_row(S, E, L, M, prefix_state, x, min_len, rec):
    """Fill `rec` (int64 [RROW_COLS]) for a text whose prefix state without its last token
    `x` is `prefix_state`: the recovery when the longest earlier match u of that text is at least
    `min_len` long and has no continuation `x`, else state -1. Returns the row's state."""
    rec[RROW_STATE] = -1
    rec[RROW_LEN] = 0
    rec[RROW_TOK] = -1
    if not 0 < prefix_state < M[sk.N_STATES]:
        return -1
    u = S[prefix_state, sk.LINK]
    if u <= 0 or S[u, sk.LEN] < min_len:
        return -1
    e = S[u, sk.HEAD]
    while e != -1:
        if E[e, sk.TOK] == x:
            return -1  # the copy continues: nothing to recover
        e = E[e, sk.NEXT]
    kids = np.empty((CHILD_BUF, KID_COLS), np.int64)
    deep = np.empty(DEEP_BUF, np.int32)
    n, _total, top, _n_deep = gather_live(S, E, L, M[sk.MODE] == sk.MODE_ONLINE, u, kids, deep, 0)
    best = -1
    for i in range(n):  # the continuation of the most recent end (a lone child: its own)
        if kids[i, K_LAST] == top:
            best = i
            break
    if best < 0:
        return -1
    rec[RROW_STATE] = kids[best, K_STATE]
    rec[RROW_LEN] = S[u, sk.LEN] + 1
    rec[RROW_TOK] = kids[best, K_TOK]
    return rec[RROW_STATE]
