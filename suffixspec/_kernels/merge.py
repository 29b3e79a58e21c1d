"""Merging of draft candidate lists that are not best-first into one tree (a session's document-
restricted corpus chains beside its kernel tree: `draft/session.py`).
"""

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def merge(tok, par, prob, budget, min_prob):
    """Merge candidate lists (parents already offset into the concatenation) into one tree.

    Shared prefixes become one node scoring the max over sources; the `budget` best nodes are
    kept (ancestor-closed, since scores never increase down a path and ties keep index order),
    ordered parents first and siblings by descending score.
    Returns tokens, parents, depths, scores.
    """
    n = tok.shape[0]
    mtok = np.empty(n, np.int32)
    mpar = np.empty(n, np.int32)
    mprob = np.empty(n, np.float64)
    mdepth = np.empty(n, np.int32)
    first_child = np.full(n + 1, -1, np.int32)  # index n stands for the root
    next_sib = np.full(n, -1, np.int32)
    merged_of = np.empty(n, np.int32)
    m = 0
    for i in range(n):
        mp = -1 if par[i] < 0 else merged_of[par[i]]
        slot = n if mp < 0 else mp
        c = first_child[slot]
        while c != -1 and mtok[c] != tok[i]:
            c = next_sib[c]
        if c == -1:
            c = m
            m += 1
            mtok[c] = tok[i]
            mpar[c] = mp
            mprob[c] = prob[i]
            mdepth[c] = 1 if mp < 0 else mdepth[mp] + 1
            next_sib[c] = first_child[slot]
            first_child[slot] = c
        elif prob[i] > mprob[c]:
            mprob[c] = prob[i]
        merged_of[i] = c
    # a node may have been raised above its parent by another source: cap down the path
    for c in range(m):
        if mpar[c] >= 0 and mprob[c] > mprob[mpar[c]]:
            mprob[c] = mprob[mpar[c]]
    order = np.argsort(-mprob[:m], kind="mergesort")
    keep = min(budget, m)
    while keep > 0 and mprob[order[keep - 1]] < min_prob:
        keep -= 1
    out_of = np.full(m, -1, np.int32)
    otok = np.empty(keep, np.int32)
    opar = np.empty(keep, np.int32)
    odepth = np.empty(keep, np.int32)
    oprob = np.empty(keep, np.float64)
    k = 0
    for j in range(keep):
        c = order[j]
        p = mpar[c]
        if p >= 0 and out_of[p] < 0:
            continue  # parent not kept (only possible on exact ties); drop the orphan
        out_of[c] = k
        otok[k] = mtok[c]
        opar[k] = -1 if p < 0 else out_of[p]
        odepth[k] = mdepth[c]
        oprob[k] = mprob[c]
        k += 1
    return otok[:k], opar[:k], odepth[:k], oprob[:k]
