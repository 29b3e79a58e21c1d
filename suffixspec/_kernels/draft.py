"""Best-first draft-tree building over one source, and merging of several sources' candidates.

A source is an automaton and a matched context: (state, length) of the longest suffix of the
request's context found in it. Expanding a candidate node follows the automaton forward: the
children of state v are its outgoing edges, with their occurrence counts and most recent end
positions. A child's path probability is

    p(child) = p(parent) * conf(L) * (count + recency * C * [most recent]) / (C * (1 + recency))

where L is the matched length at the parent (it grows by one per level), C the sum of the
children's counts, conf(L) = L / (L + match_prior) the chance that a copy continues at all, and
[most recent] marks the continuation of the most recent occurrence (recency matters for text
being edited). Each expansion pushes at most `max_children` children on a max-heap; the
`budget` most probable candidates are popped. Probabilities never increase down a path.

Layouts: `_expand(live=True, ...)` reads a growable automaton (counts through its link-cut tree,
which it may restructure: the automaton must not be used concurrently), `live=False` a frozen one
(read-only, safe to share across threads). `_kernels/propose.py` runs the expansions of a session.

An expansion's output: tokens, parents (workspace index of the parent node, -1 for children of
the matched context), probs and depths, in pop order: best-first, so probabilities never
increase along it and parents come before children. `merge_parts` merges several such outputs.
"""

import numpy as np
from numba import njit

from . import lct
from . import sam as sk
from .address import address, view_f64, view_i32, view_i64

P_MATCH_PRIOR, P_RECENCY, P_MIN_PROB, P_MAX_DEPTH, P_MAX_CHILDREN = 0, 1, 2, 3, 4
N_PARAMS = 5
CHILD_BUF = 4096
WALK_SPLAY = 24  # splay-tree depth past which a count read is followed by a splay (amortization)
DEEP_BUF = 256  # such splays per expansion (past that, reads stay exact but are not splayed)


@njit(cache=True, inline="always")
def _heap_push(hkey, hval, n, key, val):
    i = n
    hkey[i] = key
    hval[i] = val
    while i > 0:
        p = (i - 1) >> 1
        if hkey[p] >= hkey[i]:
            break
        hkey[p], hkey[i] = hkey[i], hkey[p]
        hval[p], hval[i] = hval[i], hval[p]
        i = p
    return n + 1


@njit(cache=True, inline="always")
def _heap_pop(hkey, hval, n):
    key = hkey[0]
    val = hval[0]
    n -= 1
    hkey[0] = hkey[n]
    hval[0] = hval[n]
    i = 0
    while True:
        a = 2 * i + 1
        if a >= n:
            break
        b = a + 1
        c = b if (b < n and hkey[b] > hkey[a]) else a
        if hkey[i] >= hkey[c]:
            break
        hkey[c], hkey[i] = hkey[i], hkey[c]
        hval[c], hval[i] = hval[i], hval[c]
        i = c
    return key, val, n


WS_HEADER = 4  # the int64 buffer's header: cap, n_out, budget, n_sources


@njit(cache=True, nogil=True)
def workspace_buffers(budget, max_children, n_sources):
    """The flat buffers (int32, float64, int64) behind a workspace for up to `n_sources`
    expansions of `budget` nodes: three array arguments, where the tuple of views cost ~0.5 us
    per call to type-check and unbox. The int64 buffer starts with the sizes of the layout."""
    cap = budget * max_children + max_children + 1
    n_out = budget * n_sources
    i64 = np.empty(WS_HEADER + CHILD_BUF * 4, np.int64)
    i64[0] = cap
    i64[1] = n_out
    i64[2] = budget
    i64[3] = n_sources
    n_i32 = cap * 6 + n_out * 3 + DEEP_BUF + n_out + 2 * budget + 1 + 2 * n_sources + 1
    return np.empty(n_i32, np.int32), np.empty(cap + n_out, np.float64), i64


@njit(cache=True, nogil=True, inline="always")
def workspace_views(i32, f64, i64):
    """The scratch arrays of one thread, carved out of `workspace_buffers`:
    candidates (token, parent's output index, state, matched length, depth), the heap of candidate
    probabilities and their candidate indexes, the children of one state (token, state, count,
    last end); then the expansions' outputs (tokens, parents, probs,
    depths; written one after another), the states to splay after an expansion, and the scratch of
    `merge_parts` (output node -> merged node, first child and next sibling of merged nodes, the
    bounds and read heads of the expansions)."""
    cap, n_out, budget, n_sources = i64[0], i64[1], i64[2], i64[3]
    cand = i32[: cap * 5].reshape((cap, 5))
    vals = i32[cap * 5 : cap * 6]
    o = cap * 6
    out_tok = i32[o : o + n_out]
    out_par = i32[o + n_out : o + 2 * n_out]
    out_depth = i32[o + 2 * n_out : o + 3 * n_out]
    o += 3 * n_out
    deep = i32[o : o + DEEP_BUF]
    o += DEEP_BUF
    merged_of = i32[o : o + n_out]
    o += n_out
    first_child = i32[o : o + budget + 1]
    next_sib = i32[o + budget + 1 : o + 2 * budget + 1]
    o += 2 * budget + 1
    bounds = i32[o : o + n_sources + 1]
    heads = i32[o + n_sources + 1 : o + 2 * n_sources + 1]
    keys = f64[:cap]
    out_prob = f64[cap : cap + n_out]
    kids = i64[WS_HEADER : WS_HEADER + CHILD_BUF * 4].reshape((CHILD_BUF, 4))
    return (cand, keys, vals, kids, out_tok, out_par, out_prob, out_depth, deep,
            merged_of, first_child, next_sib, bounds, heads)


# A workspace frame (int64, see address.py): the addresses and lengths of the three buffers, then
# the thread's output arena (see propose.py: `set_arena`, `propose_framed`).
WS_I32, WS_I32_LEN, WS_F64, WS_F64_LEN, WS_I64, WS_I64_LEN, WS_OUT_I32, WS_OUT_F64, WS_OUT_CAP, WS_OUT_OFF = range(10)
WS_FRAME_LEN = 10


def workspace_frame(i32, f64, i64) -> np.ndarray:
    """The frame naming `workspace_buffers` (the caller keeps them alive); no arena yet."""
    wsf = np.zeros(WS_FRAME_LEN, np.int64)
    wsf[WS_I32], wsf[WS_I32_LEN] = address(i32, np.int32), i32.shape[0]
    wsf[WS_F64], wsf[WS_F64_LEN] = address(f64, np.float64), f64.shape[0]
    wsf[WS_I64], wsf[WS_I64_LEN] = address(i64, np.int64), i64.shape[0]
    return wsf


@njit(cache=True, nogil=True, inline="always")
def framed_workspace(wsf):
    """`workspace_views` of the buffers a workspace frame names."""
    return workspace_views(view_i32(wsf[WS_I32], wsf[WS_I32_LEN]), view_f64(wsf[WS_F64], wsf[WS_F64_LEN]),
                           view_i64(wsf[WS_I64], wsf[WS_I64_LEN]))


@njit(cache=True, nogil=True)
def make_workspace(budget, max_children, n_sources):
    """A fresh workspace (see `workspace_views`)."""
    i32, f64, i64 = workspace_buffers(budget, max_children, n_sources)
    return workspace_views(i32, f64, i64)


@njit(cache=True, nogil=True, inline="always")
def _expand(live, S, E, L, M, stack, offsets, etok, eto, counts, lasts, state, match_len, budget, params, floor, ws,
            at):
    """Best-first expansion from (state, match_len); `live` picks the layout read. Writes its
    nodes into the workspace outputs from index `at` (parents offset accordingly) and returns
    how many it wrote. Candidates less probable than `floor` (or the min_prob knob) are not kept.

    Written as one loop on purpose: passing arrays to helper functions costs reference-count
    traffic per call, which dominated the per-node cost.
    """
    cand, hkey, hval, kids, out_tok, out_par, out_prob, out_depth, deep = ws[:9]
    n_deep = 0  # children whose count read walked a long splay path: splayed at the end
    budget = min(budget, out_tok.shape[0] - at)
    online = live and M[sk.MODE] == sk.MODE_ONLINE
    n_frozen = offsets.shape[0] - 1
    max_children = int(params[P_MAX_CHILDREN])
    max_depth = params[P_MAX_DEPTH]
    rec = params[P_RECENCY]
    prior = params[P_MATCH_PRIOR]
    min_prob = max(params[P_MIN_PROB], floor)
    n_cand = 0
    n_heap = 0
    n_out = 0
    direct = -1  # a candidate to output next without going through the heap
    direct_p = 0.0
    c = -1
    p = 1.0
    v = state
    length = match_len
    depth = 0
    here = -1  # output index of the node of state v (-1: the matched context itself)
    while True:
        # -- a chain: while v has one child, more probable than every waiting candidate, that
        # child is the next pop whatever happens; it goes to the output without candidate, heap
        # or child-selection bookkeeping (the usual case along a copied block). Same formula as
        # below, where a lone child's share is (cnt + rec cnt) / (cnt (1 + rec)).
        while n_out < budget and not (max_depth > 0 and depth + 1 > max_depth):
            if live:
                e = S[v, sk.HEAD]
                if e == -1 or E[e, sk.NEXT] != -1:
                    break
                tok = E[e, sk.TOK]
                w = E[e, sk.TO]
                cnt = 1  # a lone child's share is 1: no count read
            else:
                if not 0 <= v < n_frozen:
                    break
                lo = offsets[v]
                if offsets[v + 1] != lo + 1 or not 0 <= lo < etok.shape[0]:
                    break
                w = eto[lo]
                if w < 0 or w >= n_frozen:
                    break
                tok = etok[lo]
                cnt = counts[w]
            if cnt <= 0:
                break
            total = float(cnt)
            prob = (cnt + rec * total) * (p * length / ((length + prior) * total * (1.0 + rec)))
            if prob < min_prob or (n_heap > 0 and not prob > hkey[0]):
                break
            out_tok[at + n_out] = tok
            out_par[at + n_out] = here
            out_prob[at + n_out] = prob
            out_depth[at + n_out] = depth + 1
            here = at + n_out
            n_out += 1
            v = w
            length += 1
            depth += 1
            p = prob
        if n_out >= budget:
            break
        # -- gather the children of state v
        k = 0
        if live:
            e = S[v, sk.HEAD]
            if e != -1 and E[e, sk.NEXT] == -1:
                # one child: its share is 1 whatever its count, so no count read (a link-cut
                # walk) is needed; the usual case along a long copied block
                kids[0, 0] = E[e, sk.TOK]
                kids[0, 1] = E[e, sk.TO]
                kids[0, 2] = 1
                kids[0, 3] = 0
                k = 1
                e = -1
            while e != -1 and k < CHILD_BUF:
                w = E[e, sk.TO]
                cnt = S[w, sk.CNT]
                lst = S[w, sk.LAST]
                if online:
                    # true values without restructuring: add the pending tags of w's strict
                    # ancestors in its splay tree (lct.py); a long path is splayed after the
                    # loop (splaying here would rebind `stack` in the loop, which made the
                    # whole loop ~3x slower), paying for this walk as the amortization needs
                    x = w
                    steps = 0
                    while True:
                        y = L[x, lct.PAR]
                        if y == -1 or (L[y, lct.CH0] != x and L[y, lct.CH1] != x):
                            break
                        x = y
                        cnt += L[x, lct.TADD]
                        if L[x, lct.TLAST] > lst:
                            lst = L[x, lct.TLAST]
                        steps += 1
                    if steps > WALK_SPLAY and n_deep < deep.shape[0]:
                        deep[n_deep] = w
                        n_deep += 1
                kids[k, 0] = E[e, sk.TOK]
                kids[k, 1] = w
                kids[k, 2] = cnt
                kids[k, 3] = lst
                k += 1
                e = E[e, sk.NEXT]
        elif 0 <= v < n_frozen:
            lo = offsets[v]
            hi = offsets[v + 1]
            if 0 <= lo <= hi <= etok.shape[0]:
                for e in range(lo, min(hi, lo + CHILD_BUF)):
                    w = eto[e]
                    if w < 0 or w >= n_frozen:
                        k = 0  # damaged arrays: draft nothing from here
                        break
                    kids[k, 0] = etok[e]
                    kids[k, 1] = w
                    kids[k, 2] = counts[w]
                    kids[k, 3] = lasts[w]
                    k += 1
        # -- score them and push the best max_children
        if k > 0 and not (max_depth > 0 and depth + 1 > max_depth):
            total = 0.0
            recent = 0
            for i in range(k):
                total += kids[i, 2]
                if kids[i, 3] > kids[recent, 3]:
                    recent = i
            if total > 0:
                scale = p * length / ((length + prior) * total * (1.0 + rec))
                for taken in range(min(max_children, k)):
                    best = taken
                    best_w = kids[taken, 2] + (rec * total if taken == recent else 0.0)
                    for i in range(taken + 1, k):
                        wgt = kids[i, 2] + (rec * total if i == recent else 0.0)
                        if wgt > best_w:
                            best_w = wgt
                            best = i
                    if best != taken:
                        for col in range(4):
                            kids[best, col], kids[taken, col] = kids[taken, col], kids[best, col]
                        if recent == taken:
                            recent = best
                        elif recent == best:
                            recent = taken
                    prob = best_w * scale
                    if prob < min_prob or n_cand >= cand.shape[0]:
                        break
                    cand[n_cand, 0] = kids[taken, 0]
                    cand[n_cand, 1] = here
                    cand[n_cand, 2] = kids[taken, 1]
                    cand[n_cand, 3] = length + 1
                    cand[n_cand, 4] = depth + 1
                    if taken == 0 and (n_heap == 0 or prob > hkey[0]):
                        # the best child, more probable than every waiting candidate, is the
                        # next pop: it skips the heap (its siblings score no higher)
                        direct = n_cand
                        direct_p = prob
                    else:
                        n_heap = _heap_push(hkey, hval, n_heap, prob, n_cand)
                    n_cand += 1
        # -- pop the most probable candidate into the output
        if n_out >= budget:
            break
        if direct >= 0:
            c = direct
            p = direct_p
            direct = -1
        elif n_heap == 0:
            break
        else:
            p, c, n_heap = _heap_pop(hkey, hval, n_heap)
        out_tok[at + n_out] = cand[c, 0]
        out_par[at + n_out] = cand[c, 1]
        out_prob[at + n_out] = p
        out_depth[at + n_out] = cand[c, 4]
        here = at + n_out
        n_out += 1
        if n_out >= budget:
            break
        v = cand[c, 2]
        length = cand[c, 3]
        depth = cand[c, 4]
    for i in range(n_deep):
        stack = lct.splay(L, S, deep[i], stack)
    return n_out, stack


@njit(cache=True, nogil=True, inline="always")
def merge_parts(ws, n_parts, budget, min_prob, out_tok, out_par, out_depth, out_prob, at):
    """Merge the expansions in the workspace outputs (part i at [bounds[i], bounds[i + 1]), parents
    as workspace indexes) into one tree at `out_*[at:]`, parents local to the tree; returns its
    node count, at most `budget`.

    Each part is best-first: probabilities never increase along it and parents come first. A
    k-way merge by probability (ties: lower part first) therefore meets every node of the union
    at its highest probability first, after its parent: a merged node is written when first met
    and scores the max over the parts that hold it (as `merge` does), and the merge stops at
    `budget` nodes or below `min_prob` without reading the rest. No allocation, no sort."""
    wtok, wpar, wprob = ws[4], ws[5], ws[6]
    merged_of, first_child, next_sib, bounds, heads = ws[9], ws[10], ws[11], ws[12], ws[13]
    for i in range(n_parts):
        heads[i] = bounds[i]
    for i in range(budget + 1):
        first_child[i] = -1  # index budget stands for the root
    m = 0
    while m < budget:
        best = -1
        bp = 0.0
        for i in range(n_parts):
            h = heads[i]
            if h < bounds[i + 1] and (best < 0 or wprob[h] > bp):
                best = i
                bp = wprob[h]
        if best < 0 or bp < min_prob:
            break
        h = heads[best]
        heads[best] = h + 1
        mp = -1 if wpar[h] < 0 else merged_of[wpar[h]]
        slot = budget if mp < 0 else mp
        c = first_child[slot]
        while c != -1 and out_tok[at + c] != wtok[h]:
            c = next_sib[c]
        if c == -1:
            c = m
            m += 1
            out_tok[at + c] = wtok[h]
            out_par[at + c] = mp
            out_prob[at + c] = bp
            out_depth[at + c] = 1 if mp < 0 else out_depth[at + mp] + 1
            next_sib[c] = first_child[slot]
            first_child[slot] = c
        merged_of[h] = c
    return m


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
