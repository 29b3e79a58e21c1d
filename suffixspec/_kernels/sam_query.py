"""Queries over the growable suffix automaton (sam.py's arrays): matching, counts, edges.

- `advance` follows a growing context to the longest suffix present in the text (`normalize` first
  fixes a cursor that predates a clone); `locate` finds the state of a pattern (-1: absent).
- `true_values` gives exact (count, last end) of states, splaying the link-cut tree in online mode.
- `out_edges` lists a state's outgoing (token, target) pairs sorted by token.
Nothing here changes the automaton's strings; only `true_values` restructures the link-cut tree.
"""

import numpy as np
from numba import njit

from . import lct
from .follow import follow
from .sam import CNT, HEAD, LAST, LEN, LINK, MODE, MODE_ONLINE, NEXT, TO, TOK, edge_to, link_up, transition


@njit(cache=True)
def advance(S, E, H, state, length, tokens):
    """Follow a growing context: longest suffix of (context + tokens) present in the text."""
    g = (S, E, H)
    for j in range(tokens.shape[0]):
        state, length, _ = follow(edge_to, link_up, g, state, length, tokens[j])
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
