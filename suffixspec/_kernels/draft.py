"""Best-first draft-tree building over a session's parts, and merging of candidate lists.

A part is an automaton and a matched context: (state, length) of a suffix of the request's
context found in it. Expanding a node through a part follows that automaton forward: the
children of state v are its outgoing edges, with their occurrence counts and most recent end
positions. A child's path probability in that part is

    p(child) = p(parent) * conf(L) * (count + recency * C * [most recent]) / (C * (1 + recency))

where L is the matched length at the parent (it grows by one per level), C the sum of the
children's counts, conf(L) the chance that a copy continues at all (learned per source class and
length bucket from the request's committed tokens, `learn.conf`; L / (L + match_prior) before any
count), and [most recent] marks the continuation of the most recent occurrence (recency matters
for text being edited). A frozen state with many children is read through its precomputed best
ones and their count total (`frozen.top_children`: the same children and shares as a scan of them
all, in max_children + 1 reads); elsewhere at most CHILD_BUF children of a state are read (a
frozen state with more, and no table, keeps its own count as C). Each expansion pushes at most `max_children` children on a max-heap shared by all
parts (`expand`); a path's node scores the max over the parts that propose it, and the `budget`
most probable nodes are kept. Probabilities never increase down a path.

Sibling calibration: a node's *rank* is the number of siblings created before it (nodes are
created best first), its *share* in a part is the factor above (conf(L) times the child's count
share). Each part's step into a node is multiplied by `learn.rank_factor` of that rank and share,
learned from which drafts the committed tokens accepted (`learn.count_tree`): alternatives to a
better sibling (often another part's disagreeing guess) are worth what they were seen to be
worth. The factor never grows with the rank, so a heap key computed at a lower rank is an upper
bound: a popped candidate whose rank has grown since is pushed back with its new key (lazy
re-evaluation), and the tree is still built best first. With an empty table the factor is 1.

Layouts: the live automaton (source -1) is read through its growable arrays, counts through its
link-cut tree, which expanding may restructure (the automaton must not be used concurrently);
frozen automata through `frozen.source_table` (read-only, safe to share across threads).
`_kernels/propose.py` lists the parts of a session. `merge` merges candidate lists that are not
best-first (a session's document-restricted corpus chains).
"""

import numpy as np
from numba import njit

from . import learn
from . import lct
from . import sam as sk
from .address import address, prefetch, view_f64, view_i32, view_i64
from .frozen import REC_COLS, REC_COUNT, REC_LAST, REC_TO, REC_TOK, source_arrays, top_arrays, top_min_children

(P_MATCH_PRIOR, P_RECENCY, P_MIN_PROB, P_MAX_DEPTH, P_MAX_CHILDREN, P_PRIOR_STRENGTH, P_SESSION_STRENGTH,
 P_CAL_STRENGTH) = range(8)
N_PARAMS = 8
CHILD_BUF = 512  # children of one state read per expansion (the work per proposal is bounded by it)
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


WS_HEADER = 3  # the int64 buffer's header: cap, budget, n_sources
WS_CAP, WS_BUDGET, WS_SOURCES = 0, 1, 2
# candidate rows: token, parent (output node, -1: the context), state, matched length, depth, part,
# group (`learn.group`)
C_TOK, C_PARENT, C_STATE, C_LEN, C_DEPTH, C_PART, C_GROUP = range(7)
CAND_COLS = 7
# rows of the children of one state: token, state, count, last end position
K_TOK, K_STATE, K_COUNT, K_LAST = range(4)
KID_COLS = 4
# the tuple of `workspace_views`, by position
(V_CAND, V_KEYS, V_VALS, V_KIDS, V_DEEP, V_FIRST_CHILD, V_NEXT_SIB, V_PART_SRC, V_PART_STATE,
 V_PART_LEN, V_CAND_P, V_CAND_SHARE, V_NODE_RANK) = range(13)


@njit(cache=True, nogil=True)
def workspace_buffers(budget, max_children, n_sources):
    """The flat buffers (int32, float64, int64) behind a workspace for trees of up to `budget`
    nodes from up to `n_sources` parts (named by a `workspace_frame`, carved by
    `workspace_views`). The int64 buffer starts with the layout's sizes. Candidates: each output
    node is expanded at most once per part, max_children each (the memory grows with the parts:
    ~36 (budget + 1) n_sources max_children bytes)."""
    cap = (budget + 1) * n_sources * max_children + 1
    i64 = np.empty(WS_HEADER + CHILD_BUF * KID_COLS, np.int64)
    i64[WS_CAP] = cap
    i64[WS_BUDGET] = budget
    i64[WS_SOURCES] = n_sources
    n_i32 = cap * (CAND_COLS + 1) + DEEP_BUF + 3 * budget + 1 + 3 * n_sources
    return np.empty(n_i32, np.int32), np.empty(3 * cap, np.float64), i64


@njit(cache=True, nogil=True, inline="always")
def workspace_views(i32, f64, i64):
    """The scratch arrays of one thread, carved out of `workspace_buffers`: candidates (CAND_COLS),
    the heap of candidate probabilities and their candidate indexes, the children of one state
    (token, state, count, last end), the states to splay after an expansion, the first child and
    next sibling of output nodes (index budget: the context), and the parts (source, -1 for the
    live automaton; state; matched length)."""
    cap, budget, n_sources = i64[WS_CAP], i64[WS_BUDGET], i64[WS_SOURCES]
    cand = i32[: cap * CAND_COLS].reshape((cap, CAND_COLS))
    o = cap * CAND_COLS
    vals = i32[o : o + cap]
    o += cap
    deep = i32[o : o + DEEP_BUF]
    o += DEEP_BUF
    first_child = i32[o : o + budget + 1]
    next_sib = i32[o + budget + 1 : o + 2 * budget + 1]
    o += 2 * budget + 1
    part_src = i32[o : o + n_sources]
    part_state = i32[o + n_sources : o + 2 * n_sources]
    part_len = i32[o + 2 * n_sources : o + 3 * n_sources]
    o += 3 * n_sources
    node_rank = i32[o : o + budget]
    keys = f64[:cap]
    cand_p = f64[cap : 2 * cap]
    cand_share = f64[2 * cap : 3 * cap]
    kids = i64[WS_HEADER : WS_HEADER + CHILD_BUF * KID_COLS].reshape((CHILD_BUF, KID_COLS))
    return (cand, keys, vals, kids, deep, first_child, next_sib, part_src, part_state, part_len, cand_p, cand_share,
            node_rank)


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
def expand(S, E, L, M, stack, frozen, tops, cls_rows, local, glob, cal, gcal, n_parts, budget, params, ws, out_tok,
           out_par, out_depth, out_prob, out_share, out_group, out_step, at):
    """The merged tree of the session's parts, best-first, into `out_*[at:]` (parents local to
    the tree); returns (nodes written, link-cut stack). Part i (workspace `part_*`) is a matched
    context in a source: the live automaton (source -1, counts through its link-cut tree, which
    this may restructure) or row `source` of the `frozen` table (read only), of source class
    `cls_rows[source]` (learn.CLS_OWN for the live one). A path's confidence per step is
    `learn.conf` over the session's stats `local` and the proposer's `glob`.

    One heap serves every part: a candidate is a child of (output node, part) scored by that
    part's path probability. Popped, it becomes the output node of its path (found among the
    node's children, or created next: pop order is best-first, so a node is created at its
    highest probability over the parts, after its parent) and is expanded again through its part.
    The tree is the `budget` most probable paths of the union of every part's own tree, a shared
    path scoring the max over parts, and the work stops there: no part is expanded past what the
    merged tree keeps. Every part's step into a node is calibrated at the node's rank (module
    docstring; `cal` is the calibration table, `out_share` gets each node's share in the part that
    created it). A part's step is also multiplied by `learn.group_factor` of the node's group in
    `gcal` (its class, and at the root how many parts proposed the token: known once every part's
    context is expanded, when the root candidates are re-scored: no candidate is popped and no
    chain taken before), never above 1; `out_group` and `out_step` get each node's group and its step before that
    factor (`learn.count_tree` judges both tables). `tops` (a `frozen.top_table`) gives the best
    children of frozen states with many.

    Written as one loop on purpose: passing arrays to helper functions costs reference-count
    traffic per call, which dominated the per-node cost.
    """
    (cand, hkey, hval, kids, deep, first_child, next_sib, part_src, part_state, part_len, cand_p, cand_share,
     node_rank) = ws
    n_deep = 0  # children whose count read walked a long splay path: splayed at the end
    budget = min(budget, out_tok.shape[0] - at, first_child.shape[0] - 1)
    online = M[sk.MODE] == sk.MODE_ONLINE
    max_children = int(params[P_MAX_CHILDREN])
    max_depth = params[P_MAX_DEPTH]
    rec = params[P_RECENCY]
    prior = params[P_MATCH_PRIOR]
    min_prob = params[P_MIN_PROB]
    prior_strength = params[P_PRIOR_STRENGTH]
    session_strength = params[P_SESSION_STRENGTH]
    cal_strength = params[P_CAL_STRENGTH]
    cal_on = False  # any judged rank-0 node (else rank 0 is never discounted)
    for b in range(learn.N_SHARES):
        if cal[0, b, learn.CAL_TRIALS] > 0:
            cal_on = True
    cls = learn.CLS_OWN
    for i in range(budget + 1):
        first_child[i] = -1
    offsets = view_i32(0, 0)  # the arrays of the frozen part at hand
    counts, lasts, erec = offsets, offsets, offsets  # (its children: through its edge records)
    row_of, top_edges, top_totals = offsets, offsets, offsets  # its best children of big states
    width = max_children + 1
    min_row = top_min_children(width)  # states with no more children have no top row
    n_frozen = 0
    n_edges = 0
    n_cand = 0
    n_heap = 0
    n_out = 0
    seeded = 0  # parts whose context was expanded; until all are, the heap is not complete
    # the root candidates re-scored with their groups, once every part is seeded (only needed when
    # some part has groups: until then nothing is popped and no chain is taken)
    rooted = True
    for i in range(n_parts):
        if part_src[i] >= 0 and learn.group(cls_rows[part_src[i]], 1) >= 0:
            rooted = False
    gf = 1.0  # the group factor of inner nodes of the part at hand
    direct = -1  # a candidate to pop next without going through the heap
    direct_p = 0.0
    here = -1  # the expansion at hand: output node `here` (-1: the context) through part q
    q = 0
    v = 0
    length = 0
    depth = 0
    p = 1.0
    while budget > 0:
        if seeded == n_parts and not rooted:
            # every part's root candidates are in (nothing popped yet): each gets its group, with
            # the number of parts that proposed its token, and its factor; the heap is rebuilt
            rooted = True
            direct = -1
            n_heap = 0
            for c in range(n_cand):
                src = part_src[cand[c, C_PART]]
                if src >= 0 and learn.group(cls_rows[src], 1) >= 0:  # only parts with groups
                    agree = 0
                    for c2 in range(n_cand):
                        if cand[c2, C_TOK] == cand[c, C_TOK]:
                            agree += 1
                    g = learn.group(cls_rows[src], agree)
                    cand[c, C_GROUP] = g
                    cand_p[c] = min(1.0, cand_share[c] * learn.group_factor(gcal, g, cal_strength))
                n_heap = _heap_push(hkey, hval, n_heap, cand_p[c], c)
        if seeded < n_parts:
            q = seeded
            seeded += 1
            here = -1
            v = part_state[q]
            length = part_len[q]
            depth = 0
            p = 1.0
        else:
            if direct >= 0:
                c = direct
                p = direct_p
                direct = -1
            elif n_heap == 0:
                break
            else:
                p, c, n_heap = _heap_pop(hkey, hval, n_heap)
            # the candidate's output node, found or created (written out again in the chain
            # below: as an inline helper it made the batch kernel 2.7x slower)
            parent = cand[c, C_PARENT]
            tok = cand[c, C_TOK]
            slot = budget if parent < 0 else parent
            x = first_child[slot]
            rank = 0  # a new node's rank: the number of its siblings
            while x != -1 and out_tok[at + x] != tok:
                x = next_sib[x]
                rank += 1
            if x != -1:
                rank = node_rank[x]
            # the step is calibrated for the node's rank; a key computed at a lower rank bounds
            # it from above, so a discounted candidate waits in the heap for its turn
            pc = cand_p[c]
            rf = 1.0
            if rank > 0 or cal_on:
                rf = learn.rank_factor(cal, rank, cand_share[c], cal_strength)
                pc *= rf
            if pc < p:
                if pc >= min_prob:
                    n_heap = _heap_push(hkey, hval, n_heap, pc, c)
                continue
            if x == -1:
                x = n_out
                out_tok[at + x] = tok
                out_par[at + x] = parent
                out_prob[at + x] = p
                out_share[at + x] = cand_share[c]
                out_group[at + x] = cand[c, C_GROUP]
                out_step[at + x] = cand_share[c] * rf
                node_rank[x] = rank
                out_depth[at + x] = cand[c, C_DEPTH]
                next_sib[x] = first_child[slot]
                first_child[slot] = x
                n_out += 1
                if n_out >= budget:
                    break
            here = x
            v = cand[c, C_STATE]
            length = cand[c, C_LEN]
            depth = cand[c, C_DEPTH]
            q = cand[c, C_PART]
        live = part_src[q] < 0
        cls = learn.CLS_OWN if live else cls_rows[part_src[q]]
        gf = learn.group_factor(gcal, learn.group(cls, 0), cal_strength)
        if not live:
            offsets, _etok, _eto, counts, lasts, _links, _lens, erec = source_arrays(frozen, part_src[q])
            row_of, top_edges, top_totals = top_arrays(tops, part_src[q])
            # every index read below is checked against these (a damaged source drafts nothing)
            n_frozen = min(offsets.shape[0] - 1, counts.shape[0], lasts.shape[0])
            n_edges = erec.shape[0] // REC_COLS
        # -- a chain: while v has one child, more probable than every waiting candidate, that
        # child is the next pop whatever happens; it is taken without candidate, heap or
        # child-selection bookkeeping (the usual case along a copied block). Same formula as
        # below, where a lone child's share is (cnt + rec cnt) / (cnt (1 + rec)).
        while seeded >= n_parts and rooted and not (max_depth > 0 and depth + 1 > max_depth):
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
                if offsets[v + 1] != lo + 1 or not 0 <= lo < n_edges:
                    break
                w = erec[REC_COLS * lo + REC_TO]
                if w < 0 or w >= n_frozen:
                    break
                tok = erec[REC_COLS * lo + REC_TOK]
                cnt = erec[REC_COLS * lo + REC_COUNT]
            if cnt <= 0:
                break
            total = float(cnt)
            cf = learn.conf(local, glob, cls, length, prior, prior_strength, session_strength)
            prob = (cnt + rec * total) * (p * cf / (total * (1.0 + rec)))
            if gf < 1.0:
                prob *= gf
            if prob < min_prob or (n_heap > 0 and not prob > hkey[0]):
                break
            slot = budget if here < 0 else here
            x = first_child[slot]
            rank = 0
            while x != -1 and out_tok[at + x] != tok:
                x = next_sib[x]
                rank += 1
            if x != -1:
                rank = node_rank[x]
            rf = 1.0
            if rank > 0 or cal_on:
                rf = learn.rank_factor(cal, rank, cf, cal_strength)
                pc = prob * rf
                if pc < prob:  # discounted at its rank: still the next pop?
                    if pc < min_prob or (n_heap > 0 and not pc > hkey[0]):
                        break
                    prob = pc
            if x == -1:
                x = n_out
                out_tok[at + x] = tok
                out_par[at + x] = here
                out_prob[at + x] = prob
                out_share[at + x] = cf
                out_group[at + x] = learn.group(cls, 0)
                out_step[at + x] = cf * rf
                node_rank[x] = rank
                out_depth[at + x] = depth + 1
                next_sib[x] = first_child[slot]
                first_child[slot] = x
                n_out += 1
                if n_out >= budget:
                    break
            here = x
            v = w
            length += 1
            depth += 1
            p = prob
        if n_out >= budget:
            break
        if max_depth > 0 and depth + 1 > max_depth:
            continue
        # -- gather the children of state v in part q, their count total and the last end of the
        # most recent one (ends of different children are distinct positions)
        k = 0
        total = 0.0
        top = -1
        if live:
            e = S[v, sk.HEAD]
            if e != -1 and E[e, sk.NEXT] == -1:
                # one child: its share is 1 whatever its count, so no count read is needed
                kids[0, K_TOK] = E[e, sk.TOK]
                kids[0, K_STATE] = E[e, sk.TO]
                kids[0, K_COUNT] = 1
                kids[0, K_LAST] = 0
                k = 1
                total = 1.0
                top = 0
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
                kids[k, K_TOK] = E[e, sk.TOK]
                kids[k, K_STATE] = w
                kids[k, K_COUNT] = cnt
                kids[k, K_LAST] = lst
                total += cnt
                if k == 0 or lst > top:
                    top = lst
                k += 1
                e = E[e, sk.NEXT]
        elif 0 <= v < n_frozen:
            lo = offsets[v]
            hi = offsets[v + 1]
            r = row_of[v] if hi - lo > min_row and v < row_of.shape[0] else -1
            if r >= 0 and 0 <= lo <= hi <= n_edges and (r + 1) * width <= top_edges.shape[0] and r < top_totals.shape[0]:
                # a state with many children: its best ones and their count total, precomputed
                # (`frozen.top_children`), instead of a scan of them all
                for i in range(width):
                    e = top_edges[r * width + i]
                    if e < 0:
                        break
                    w = erec[REC_COLS * e + REC_TO] if lo <= e < hi else -1
                    if w < 0 or w >= n_frozen:
                        k = 0  # damaged arrays: draft nothing from here
                        break
                    lst = erec[REC_COLS * e + REC_LAST]
                    kids[k, K_TOK] = erec[REC_COLS * e + REC_TOK]
                    kids[k, K_STATE] = w
                    kids[k, K_COUNT] = erec[REC_COLS * e + REC_COUNT]
                    kids[k, K_LAST] = lst
                    if k == 0 or lst > top:
                        top = lst
                    k += 1
                total = float(top_totals[r])
            elif 0 <= lo <= hi <= n_edges:
                for e in range(lo, min(hi, lo + CHILD_BUF)):
                    w = erec[REC_COLS * e + REC_TO]
                    if w < 0 or w >= n_frozen:
                        k = 0  # damaged arrays: draft nothing from here
                        break
                    cnt = erec[REC_COLS * e + REC_COUNT]
                    lst = erec[REC_COLS * e + REC_LAST]
                    kids[k, K_TOK] = erec[REC_COLS * e + REC_TOK]
                    kids[k, K_STATE] = w
                    kids[k, K_COUNT] = cnt
                    kids[k, K_LAST] = lst
                    total += cnt
                    if k == 0 or lst > top:
                        top = lst
                    k += 1
                if hi - lo > CHILD_BUF and counts[v] > total:
                    total = float(counts[v])  # children past the bound still hold their share
        # -- score them and push the best max_children
        if k == 0 or total <= 0:
            continue
        step = learn.conf(local, glob, cls, length, prior, prior_strength, session_strength) / (total * (1.0 + rec))
        scale = p * step * (gf if here >= 0 else 1.0)  # a root's factor waits for its agreement
        bonus = rec * total  # the most recent child's (kids[i, K_LAST] == top)
        # the best m children into rows 0..m-1, by weight (count, plus the bonus of the most
        # recent one), ties in gather order: one pass over the k children, inserting into the
        # top m (a state may have thousands of children; most are not compared twice)
        m = min(max_children, k)
        for i in range(1, k):
            wi = kids[i, K_COUNT] + (bonus if kids[i, K_LAST] == top else 0.0)
            j = i
            if i >= m:
                if not wi > kids[m - 1, K_COUNT] + (bonus if kids[m - 1, K_LAST] == top else 0.0):
                    continue
                for col in range(KID_COLS):
                    kids[i, col], kids[m - 1, col] = kids[m - 1, col], kids[i, col]
                j = m - 1
            while j > 0 and wi > kids[j - 1, K_COUNT] + (bonus if kids[j - 1, K_LAST] == top else 0.0):
                for col in range(KID_COLS):
                    kids[j, col], kids[j - 1, col] = kids[j - 1, col], kids[j, col]
                j -= 1
        for taken in range(m):
            best_w = kids[taken, K_COUNT] + (bonus if kids[taken, K_LAST] == top else 0.0)
            prob = best_w * scale
            if prob < min_prob or n_cand >= cand.shape[0]:
                break
            cand_p[n_cand] = prob
            cand_share[n_cand] = best_w * step
            cand[n_cand, C_TOK] = kids[taken, K_TOK]
            cand[n_cand, C_PARENT] = here
            cand[n_cand, C_STATE] = kids[taken, K_STATE]
            cand[n_cand, C_LEN] = length + 1
            cand[n_cand, C_DEPTH] = depth + 1
            cand[n_cand, C_PART] = q
            cand[n_cand, C_GROUP] = learn.group(cls, 0)
            if not live:
                prefetch(offsets, kids[taken, K_STATE])  # read when the candidate is expanded
            if taken == 0 and seeded >= n_parts and rooted and (n_heap == 0 or prob > hkey[0]):
                # the best child, more probable than every waiting candidate, is the next pop:
                # it skips the heap (its siblings score no higher)
                direct = n_cand
                direct_p = prob
            else:
                n_heap = _heap_push(hkey, hval, n_heap, prob, n_cand)
            n_cand += 1
    for i in range(n_deep):
        stack = lct.splay(L, S, deep[i], stack)
    return n_out, stack


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
