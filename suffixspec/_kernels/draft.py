"""Best-first draft-tree building over a session's parts.

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
ones and their count total (`frozen.top_children`, the shares a full scan gives); elsewhere at most
CHILD_BUF children of a state are read (a frozen state with more, and no table, keeps its own
count as C). A corpus part's bonus goes to the child nearest the session's anchor instead
(`_near_anchor`). Each expansion pushes at most `max_children` children on a max-heap shared by
all parts (`expand`); a node scores the max over the parts that propose it, and the `budget`
most probable nodes are kept. Probabilities never increase down a path.

Sibling calibration: each part's step into a node is multiplied by `learn.rank_factor` of its
rank (siblings created before it) and share (the factor above). It never grows with the rank, so a
key computed at a lower rank bounds the node's score: a popped candidate whose rank has grown is
pushed back with its new key (lazy re-evaluation), and the tree is still built best first.

Layouts: the live automaton (source -1) through its growable arrays, counts through its link-cut
tree, which expanding may restructure (not to be used concurrently); frozen automata through
`frozen.source_table` (read-only). propose.py lists a session's parts; merge.py merges candidate
lists that are not best-first (a session's document-restricted corpus chains).
"""

from collections import namedtuple

import numpy as np
from numba import njit

from . import lct, learn
from . import sam as sk
from .address import address, prefetch, view_f64, view_i32, view_i64
from .children import (
    CHILD_BUF,
    DEEP_BUF,
    K_COUNT,
    K_LAST,
    K_STATE,
    K_TOK,
    KID_COLS,
    best_first,
    frozen_part,
    gather_frozen,
    gather_live,
    implicit_child,
    no_frozen_part,
)
from .frozen import REC_COLS, REC_COUNT, REC_TO, REC_TOK, top_min_children
from .recover import RROW_TOK, SRC_INSERT, SRC_SUBST

(P_MATCH_PRIOR, P_RECENCY, P_MIN_PROB, P_MAX_DEPTH, P_MAX_CHILDREN, P_PRIOR_STRENGTH, P_SESSION_STRENGTH,
 P_CAL_STRENGTH, P_CORPUS_LOCALITY, P_NEAR_BACK, P_NEAR_AHEAD, P_RECOVER) = range(12)
N_PARAMS = 12


# A cursor row (int64) into a frozen source: state (-1: the session does not use that source),
# matched length, and for a corpus source the session's anchor: the end position (in that source)
# where its text is taken to be in the corpus, -1 when unknown (session.py keeps it)
CUR_STATE, CUR_LEN, CUR_ANCHOR = 0, 1, 2
CUR_COLS = 3
# a corpus child is near the anchor when its most recent end lies within [-NEAR_BACK, NEAR_AHEAD]
# of where the anchored text would put it (the proposer passes them as P_NEAR_BACK, P_NEAR_AHEAD)
NEAR_BACK, NEAR_AHEAD = 64, 256


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

# One thread's scratch (`workspace_views`), [rows] per array; `cap` candidates, `budget` nodes:
#   cand        int32 [cap, CAND_COLS]  candidates (C_* columns): a child of (output node, part)
#   heap_key    float64 [cap]   the max-heap of waiting candidates: their probabilities ...
#   heap_val    int32 [cap]     ... and their candidate indexes
#   kids        int64 [CHILD_BUF, KID_COLS]  the children of one state (`children.py`)
#   deep        int32 [DEEP_BUF]  live states to splay once the tree is built
#   first_child int32 [budget + 1]  each output node's most recent child (index budget: the context)
#   next_sib    int32 [budget]  each output node's next older sibling (-1 ends)
#   part_src    int32 [n_sources]  each part's source: a cursor row, -1 for the live automaton
#   part_state  int32 [n_sources]  each part's matched state ...
#   part_len    int32 [n_sources]  ... and matched length
#   cand_p      float64 [cap]   each candidate's path probability before its rank factor
#   cand_share  float64 [cap]   each candidate's share in its part (conf(L) times its count share)
#   node_rank   int32 [budget]  each output node's rank (siblings created before it)
#   memo        float64 [MEMO_LEN]  one proposal's factors, each computed once (`expand`)
Workspace = namedtuple("Workspace", "cand heap_key heap_val kids deep first_child next_sib part_src part_state "
                                    "part_len cand_p cand_share node_rank memo")

# The memo of a proposal's factors, which the learned tables (fixed while a proposal runs) decide:
# `learn.conf` of class c and matched length L < CONF_MEMO at [M_CONF + c CONF_MEMO + L], the rank
# factor of rank r (min(r, N_RANKS - 1)) and share bucket b at [M_RANK + r N_SHARES + b] (both -1
# until computed: factors are never negative), each class's inner group factor at [M_GROUP + c].
CONF_MEMO = 64
M_CONF = 0
M_RANK = M_CONF + learn.N_CLASSES * CONF_MEMO
M_GROUP = M_RANK + learn.N_RANKS * learn.N_SHARES
MEMO_LEN = M_GROUP + learn.N_CLASSES


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
    return np.empty(n_i32, np.int32), np.empty(3 * cap + MEMO_LEN, np.float64), i64


@njit(cache=True, nogil=True, inline="always")
def workspace_views(i32, f64, i64):
    """The `Workspace` of one thread, carved out of `workspace_buffers`."""
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
    memo = f64[3 * cap : 3 * cap + MEMO_LEN]
    kids = i64[WS_HEADER : WS_HEADER + CHILD_BUF * KID_COLS].reshape((CHILD_BUF, KID_COLS))
    return Workspace(cand, keys, vals, kids, deep, first_child, next_sib, part_src, part_state, part_len, cand_p,
                     cand_share, node_rank, memo)


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


# -- The tree growth (`expand`), in phases. Every phase is inlined into the one compiled loop
# (`inline="always"`): a call that passes arrays costs reference-count traffic per node, and the
# phases run per node.

# A session's own inputs to a proposal (propose.py builds it):
#   S      int32 [states, sk.STATE_COLS]  the live automaton's states (HEAD, CNT, LAST, LINK, LEN)
#   E      int32 [edges, sk.E_COLS]  its edges (TOK, TO, NEXT)
#   L      int32 [states, sk.L_COLS]  its link-cut tree, which `expand` may restructure (lct.py)
#   M      int64 [sk.META]  its counters and mode (counts through L once MODE_ONLINE)
#   cur    int64 [rows, CUR_COLS]  its cursor (state, matched length, anchor) in each frozen source
#   local  float64 [N_CLASSES, N_BUCKETS, 2]  its learn stats (`learn.conf`)
#   rec    int64 [recover.RROW_COLS]  its recovery row
Session = namedtuple("Session", "S E L M cur local rec")

# What the proposer's sessions share (read only here):
#   frozen     int64 [rows, SOURCE_COLS]  the frozen sources (`frozen.source_table`)
#   tops       int64 [rows, 2 N_TOP_ARRAYS]  their best children of big states (`frozen.top_table`)
#   cls_rows   int64 [rows]  each source's class (`learn.CLS_*`)
#   glob       float64 [N_CLASSES, N_BUCKETS, 2]  the proposer's learn stats
#   cal        float64 [N_RANKS, N_SHARES, CAL_COLS]  the sibling calibration (`learn.rank_factor`)
#   gcal       float64 [N_GROUPS, CAL_COLS]  the group calibration (`learn.group_factor`)
#   params     float64 [N_PARAMS]  the knobs (P_* above)
#   min_match  a part needs a match at least this long
#   levels     parts per source: its match, then shorter ones along suffix links
Shared = namedtuple("Shared", "frozen tops cls_rows glob cal gcal params min_match levels")

# The output tree, views from its first node, parents local to it, [at least budget] each:
#   tok int32, par int32 (-1: the context), depth int32, prob float64 (path probability),
#   share float64 (the node's share in the part that created it), group int32 (`learn.group`),
#   step float64 (its share times its rank factor: its step before the group factor)
Tree = namedtuple("Tree", "tok par depth prob share group step")

# `params` read once per proposal; cal_on: some rank-0 node was judged (else rank 0 is never
# discounted and the rank factor of a first child is not computed)
Knobs = namedtuple("Knobs", "match_prior recency min_prob max_depth max_children prior_strength "
                            "session_strength cal_strength cal_on locality near_back near_ahead recover")

# The expansion at hand: output node `node` (-1: the context) through part `part`, at its
# automaton's `state` with matched length `length`, `depth` nodes below the context, with path
# probability `prob`.
Cursor = namedtuple("Cursor", "node part state length depth prob")


@njit(cache=True, nogil=True, inline="always")
def knobs(params, cal):
    """The `Knobs` of a proposal."""
    cal_on = False
    for b in range(learn.N_SHARES):
        if cal[0, b, learn.CAL_TRIALS] > 0:
            cal_on = True
    return Knobs(params[P_MATCH_PRIOR], params[P_RECENCY], params[P_MIN_PROB], params[P_MAX_DEPTH],
                 int(params[P_MAX_CHILDREN]), params[P_PRIOR_STRENGTH], params[P_SESSION_STRENGTH],
                 params[P_CAL_STRENGTH], cal_on, params[P_CORPUS_LOCALITY],
                 int(params[P_NEAR_BACK]), int(params[P_NEAR_AHEAD]), params[P_RECOVER])


@njit(cache=True, nogil=True, inline="always")
def _cursor(node, part, state, length, depth, prob):
    return Cursor(np.int64(node), np.int64(part), np.int64(state), np.int64(length), np.int64(depth), np.float64(prob))


@njit(cache=True, nogil=True, inline="always")
def _conf(k, local, glob, cls, length, memo):
    """`learn.conf` with the proposal's knobs, through the proposal's `memo` (see M_CONF)."""
    if length < CONF_MEMO:
        i = M_CONF + cls * CONF_MEMO + length
        f = memo[i]
        if f < 0.0:
            f = learn.conf(local, glob, cls, length, k.match_prior, k.prior_strength, k.session_strength)
            memo[i] = f
        return f
    return learn.conf(local, glob, cls, length, k.match_prior, k.prior_strength, k.session_strength)


@njit(cache=True, nogil=True, inline="always")
def _rank_factor(cal, rank, share, strength, memo):
    """`learn.rank_factor` through the proposal's `memo` (see M_RANK)."""
    b = learn.share_bucket(share)
    i = M_RANK + min(rank, learn.N_RANKS - 1) * learn.N_SHARES + b
    f = memo[i]
    if f < 0.0:
        f = learn.rank_factor_bucket(cal, rank, b, strength)
        memo[i] = f
    return f


@njit(cache=True, nogil=True, inline="always")
def _fresh_scratch(first_child, budget, memo, gcal, strength):
    """A proposal's scratch: no output node (nor the context, slot `budget`) has a child yet, and
    the memo is empty but for each class's inner group factor."""
    for i in range(budget + 1):
        first_child[i] = -1
    for i in range(M_GROUP):
        memo[i] = -1.0
    for c in range(learn.N_CLASSES):
        memo[M_GROUP + c] = learn.group_factor(gcal, learn.group(c, 0), strength)


# The phases take the arrays they touch one by one (unpacked once from the named tuples in
# `expand`): reading an array out of a tuple inside the loop costs a reference count per read.
# Argument names, as in `Workspace` and `Tree`: cand, cand_p, cand_share (candidates),
# heap_key, heap_val (the heap), first_child, next_sib, node_rank (the output nodes' links),
# out_tok, out_par, out_depth, out_prob, out_share, out_group, out_step (the `Tree`'s columns).


@njit(cache=True, nogil=True, inline="always")
def _find_node(first_child, next_sib, node_rank, out_tok, slot, tok):
    """(node, rank): the child with token `tok` of output node `slot` (the root slot: the
    context), -1 if none, and its rank (if none: the rank a new one would get, its sibling count)."""
    x = first_child[slot]
    rank = 0
    while x != -1 and out_tok[x] != tok:
        x = next_sib[x]
        rank += 1
    if x != -1:
        rank = node_rank[x]
    return x, rank


@njit(cache=True, nogil=True, inline="always")
def _link_node(first_child, next_sib, node_rank, x, slot, rank):
    """Make output node x the newest child of `slot`, at `rank`."""
    node_rank[x] = rank
    next_sib[x] = first_child[slot]
    first_child[slot] = x


@njit(cache=True, nogil=True, inline="always")
def _write_node(out_tok, out_par, out_depth, out_prob, out_share, out_group, out_step, x, tok, parent, depth, prob,
                share, group, step):
    """Write output node x's columns."""
    out_tok[x] = tok
    out_par[x] = parent
    out_depth[x] = depth
    out_prob[x] = prob
    out_share[x] = share
    out_group[x] = group
    out_step[x] = step


@njit(cache=True, nogil=True, inline="always")
def _has_groups(part_src, n_parts, cls_rows):
    """Whether some part's class has groups (root candidates then wait to be re-scored)."""
    for i in range(n_parts):
        if part_src[i] >= 0 and learn.group(cls_rows[part_src[i]], 1) >= 0:
            return True
    return False


@njit(cache=True, nogil=True, inline="always")
def _reroot(cand, cand_p, cand_share, heap_key, heap_val, part_src, n_cand, cls_rows, gcal, cal_strength):
    """Every part's root candidates are in and nothing was popped: each candidate of a part with
    groups gets its group, with the number of parts that proposed its token, and that group's
    factor; returns the size of the heap, rebuilt over every candidate."""
    n_heap = 0
    for c in range(n_cand):
        src = part_src[cand[c, C_PART]]
        if src >= 0 and learn.group(cls_rows[src], 1) >= 0:
            agree = 0
            for c2 in range(n_cand):
                if cand[c2, C_TOK] == cand[c, C_TOK]:
                    agree += 1
            g = learn.group(cls_rows[src], agree)
            cand[c, C_GROUP] = g
            cand_p[c] = min(1.0, cand_share[c] * learn.group_factor(gcal, g, cal_strength))
        n_heap = _heap_push(heap_key, heap_val, n_heap, cand_p[c], c)
    return n_heap


@njit(cache=True, nogil=True, inline="always")
def _start_prob(src, k):
    """The probability a part's context starts at: the recovery's substitution at its weight."""
    return k.recover if src == SRC_SUBST else 1.0


@njit(cache=True, nogil=True, inline="always")
def _seed_insert(cand, cand_p, cand_share, heap_key, heap_val, part_src, part_state, part_len, n_parts, rec, k):
    """Before the growth: when the last part is the recovery's insertion (`recover.py`), its one root
    candidate (the row's token, probability `recover`, then on through that part) on the empty heap.
    Returns (parts left to expand, candidates, heap size)."""
    if n_parts == 0 or part_src[n_parts - 1] != SRC_INSERT:
        return n_parts, 0, 0
    if cand.shape[0] == 0 or k.recover < k.min_prob or k.recover <= 0:
        return n_parts - 1, 0, 0
    cand[0, C_TOK] = rec[RROW_TOK]
    cand[0, C_PARENT] = -1
    cand[0, C_STATE] = part_state[n_parts - 1]
    cand[0, C_LEN] = part_len[n_parts - 1]
    cand[0, C_DEPTH] = 1
    cand[0, C_PART] = n_parts - 1
    cand[0, C_GROUP] = learn.group(learn.CLS_OWN, 0)
    cand_p[0] = k.recover
    cand_share[0] = k.recover
    return n_parts - 1, 1, _heap_push(heap_key, heap_val, 0, k.recover, 0)


@njit(cache=True, nogil=True, inline="always")
def _lone_frozen(fp, v):
    """(token, state, count) of the only child of state v of a frozen part (a `FrozenPart`),
    count 0 when v has not exactly one (or the arrays are damaged); an implicit state's child
    is read from the text."""
    if fp.n_states <= v < fp.n_ids:
        tok, w = implicit_child(fp, v)
        if tok < 0:
            return np.int64(0), np.int64(0), np.int64(0)
        return np.int64(tok), np.int64(w), np.int64(1)
    offsets, records, n_states, n_edges = fp.offsets, fp.records, fp.n_states, fp.n_edges
    if not 0 <= v < n_states:
        return np.int64(0), np.int64(0), np.int64(0)
    lo = offsets[v]
    if offsets[v + 1] != lo + 1 or not 0 <= lo < n_edges:
        return np.int64(0), np.int64(0), np.int64(0)
    w = records[REC_COLS * lo + REC_TO]
    if w < 0 or w >= fp.n_ids:
        return np.int64(0), np.int64(0), np.int64(0)
    return np.int64(records[REC_COLS * lo + REC_TOK]), np.int64(w), np.int64(records[REC_COLS * lo + REC_COUNT])


@njit(cache=True, nogil=True, inline="always")
def expand(session, shared, stack, n_parts, budget, ws, tree):
    """The merged tree of the session's parts, best-first, into `tree` (a `Tree`); returns (nodes
    written, link-cut stack). `session` (a `Session`) and `shared` (a `Shared`) are the inputs,
    `ws` (a `Workspace`) the scratch whose first n_parts parts are set (propose.py), `stack` the
    link-cut stack (`lct.splay` may grow it). Part i reads the live automaton (part_src -1,
    counts through its link-cut tree, which this may restructure) or row part_src of `frozen`.

    One heap serves every part: a candidate is a child of (output node, part) scored by that
    part's path probability. Popped, it becomes the output node of its path (pop order is
    best-first, so a node is created at its highest probability over the parts, after its parent)
    and is expanded again through its part: the tree is the `budget` most probable paths of the
    union of the parts' trees, a shared path scoring the max over parts. Steps are calibrated at
    the node's rank and by its group (module docstring; root groups are known once every part's
    context is expanded, `_reroot`); `tree.share`, `tree.group` and `tree.step` feed
    `learn.count_tree`.
    """
    S, E, L, cur_rows = session.S, session.E, session.L, session.cur
    online = session.M[sk.MODE] == sk.MODE_ONLINE
    cls_rows, glob, cal, gcal = shared.cls_rows, shared.glob, shared.cal, shared.gcal
    (cand, heap_key, heap_val, kids, deep, first_child, next_sib, part_src, part_state, part_len, cand_p, cand_share,
     node_rank, memo) = ws
    out_tok, out_par, out_depth, out_prob, out_share, out_group, out_step = tree
    k = knobs(shared.params, cal)
    budget = min(budget, out_tok.shape[0], first_child.shape[0] - 1)  # also the context's slot
    _fresh_scratch(first_child, budget, memo, gcal, k.cal_strength)
    width = k.max_children + 1
    min_row = top_min_children(width)  # states with no more children have no top row
    fp = no_frozen_part()  # the arrays of the frozen part at hand
    f_offsets = fp.offsets  # the children's states are prefetched in it
    n_deep = 0  # children whose count read walked a long splay path: splayed at the end
    n_parts, n_cand, n_heap = _seed_insert(cand, cand_p, cand_share, heap_key, heap_val, part_src, part_state, part_len,
                                           n_parts, session.rec, k)
    n_out = 0
    seeded = 0  # parts whose context was expanded; until all are, the heap is not complete
    rooted = not _has_groups(part_src, n_parts, cls_rows)  # see `_reroot`
    direct = -1  # a candidate to pop next without going through the heap
    direct_p = 0.0
    cur = _cursor(-1, 0, 0, 0, 0, 1.0)
    while budget > 0:
        if seeded == n_parts and not rooted:
            rooted = True
            direct = -1
            n_heap = _reroot(cand, cand_p, cand_share, heap_key, heap_val, part_src, n_cand, cls_rows, gcal,
                             k.cal_strength)
        if seeded < n_parts:
            cur = _cursor(-1, seeded, part_state[seeded], part_len[seeded], 0, _start_prob(part_src[seeded], k))
            seeded += 1
        else:
            if direct >= 0:
                c = direct
                p = direct_p
                direct = -1
            elif n_heap == 0:
                break
            else:
                p, c, n_heap = _heap_pop(heap_key, heap_val, n_heap)
            # -- take: the candidate becomes its output node, found or created. Its step is
            # calibrated for the node's rank; a key computed at a lower rank bounds it from above,
            # so a discounted candidate is pushed back to wait for its turn
            parent = cand[c, C_PARENT]
            slot = budget if parent < 0 else parent
            x, rank = _find_node(first_child, next_sib, node_rank, out_tok, slot, cand[c, C_TOK])
            pc = cand_p[c]
            rf = 1.0
            if rank > 0 or k.cal_on:
                rf = _rank_factor(cal, rank, cand_share[c], k.cal_strength, memo)
                pc *= rf
            if pc < p:
                if pc >= k.min_prob:
                    n_heap = _heap_push(heap_key, heap_val, n_heap, pc, c)
                continue
            if x == -1:
                x = n_out
                _write_node(out_tok, out_par, out_depth, out_prob, out_share, out_group, out_step, x, cand[c, C_TOK],
                            parent, cand[c, C_DEPTH], p, cand_share[c], cand[c, C_GROUP], cand_share[c] * rf)
                _link_node(first_child, next_sib, node_rank, x, slot, rank)
                n_out += 1
                if n_out >= budget:
                    break
            cur = _cursor(x, cand[c, C_PART], cand[c, C_STATE], cand[c, C_LEN], cand[c, C_DEPTH], p)
        src = part_src[cur.part]
        live = src < 0
        cls = learn.CLS_OWN if live else cls_rows[src]
        gf = memo[M_GROUP + cls]  # inner nodes' group factor
        if not live:
            fp = frozen_part(shared.frozen, shared.tops, src)
            f_offsets = fp.offsets
        ready = seeded >= n_parts and rooted  # the heap holds every waiting candidate
        # -- a chain: a lone child more probable than every waiting candidate is the next pop
        # whatever happens: taken at once, no candidate or heap (the usual case along a copy)
        here, v, length, depth, p = cur.node, cur.state, cur.length, cur.depth, cur.prob
        while ready and not (k.max_depth > 0 and depth + 1 > k.max_depth):
            if live:
                e = S[v, sk.HEAD]
                if e == -1 or E[e, sk.NEXT] != -1:
                    break
                tok, w, cnt = E[e, sk.TOK], E[e, sk.TO], 1  # a lone child's share is 1: no count read
            else:
                tok, w, cnt = _lone_frozen(fp, v)
            if cnt <= 0:
                break
            total = float(cnt)
            cf = _conf(k, session.local, glob, cls, length, memo)
            prob = (cnt + k.recency * total) * (p * cf / (total * (1.0 + k.recency)))
            if gf < 1.0:
                prob *= gf
            if prob < k.min_prob or (n_heap > 0 and not prob > heap_key[0]):
                break
            slot = budget if here < 0 else here
            x, rank = _find_node(first_child, next_sib, node_rank, out_tok, slot, tok)
            rf = 1.0
            if rank > 0 or k.cal_on:
                rf = _rank_factor(cal, rank, cf, k.cal_strength, memo)
                pc = prob * rf
                if pc < prob:  # discounted at its rank: still the next pop?
                    if pc < k.min_prob or (n_heap > 0 and not pc > heap_key[0]):
                        break
                    prob = pc
            if x == -1:
                x = n_out
                _write_node(out_tok, out_par, out_depth, out_prob, out_share, out_group, out_step, x, tok, here,
                            depth + 1, prob, cf, learn.group(cls, 0), cf * rf)
                _link_node(first_child, next_sib, node_rank, x, slot, rank)
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
        cur = _cursor(here, cur.part, v, length, depth, p)
        if k.max_depth > 0 and depth + 1 > k.max_depth:
            continue
        # -- the children of the state at hand, scored; the best max_children become candidates
        if live:
            n_kids, total, top, n_deep = gather_live(S, E, L, online, v, kids, deep, n_deep)
        else:
            n_kids, total, top = gather_frozen(fp, v, width, min_row, kids)
        if n_kids == 0 or total <= 0:
            continue
        n_cand, n_heap, direct, direct_p = _push_children(cand, cand_p, cand_share, heap_key, heap_val, kids, f_offsets, live,
                                                          cls, gf, k, session.local, glob, memo, cur_rows, src, cur, n_kids,
                                                          total, top, ready, n_cand, n_heap)
    for i in range(n_deep):
        stack = lct.splay(L, S, deep[i], stack)
    return n_out, stack


@njit(cache=True, nogil=True, inline="always")
def _near_anchor(kids, n_kids, top, cls, cur, src, depth, k):
    """(end, weight) of the bonus of the gathered children of a node at `depth` of part source
    `src`: (`top`, recency) but for a corpus; there, the most recent end of the child nearest the
    anchor (`cur[src, CUR_ANCHOR]`) moved on by depth + 1, within [-near_back, near_ahead], first
    in gather order on ties, and the locality; (-1, 0.0) when there is no anchor or no child near.
    In a corpus the most recent occurrence means nothing; where the request stands in it does."""
    if cls != learn.CLS_CORPUS:
        return top, k.recency
    target = cur[src, CUR_ANCHOR] + depth + 1
    if target < 1:
        return np.int64(-1), 0.0
    best = np.int64(-1)
    best_d = k.near_ahead + k.near_back + 1
    for i in range(n_kids):
        d = kids[i, K_LAST] - target
        if -k.near_back <= d <= k.near_ahead and abs(d) < best_d:
            best_d = abs(d)
            best = kids[i, K_LAST]
    return best, (k.locality if best >= 0 else 0.0)


@njit(cache=True, nogil=True, inline="always")
def _push_children(cand, cand_p, cand_share, heap_key, heap_val, kids, f_offsets, live, cls, gf, k, local, glob, memo,
                   cur_rows, src, cur, n_kids, total, top, may_direct, n_cand, n_heap):
    """Score the n_kids gathered children of the state at hand of part source `src` (count
    `total`, most recent end `top`; the bonus: `_near_anchor` over the cursor rows `cur_rows`)
    and make the best max_children of them candidates. The best one skips the heap when
    `may_direct` and it beats every waiting candidate (its siblings score no higher): returns
    (n_cand, n_heap, direct, direct_p), direct the candidate to pop next (-1: none)."""
    top, rec = _near_anchor(kids, n_kids, top, cls, cur_rows, src, cur.depth, k)
    step = _conf(k, local, glob, cls, cur.length, memo) / (total * (1.0 + rec))
    scale = cur.prob * step * (gf if cur.node >= 0 else 1.0)  # a root's factor waits for its agreement
    bonus = rec * total  # the child's whose kids[i, K_LAST] == top
    m = min(k.max_children, n_kids)
    best_first(kids, n_kids, m, bonus, top)
    direct = -1
    direct_p = 0.0
    for taken in range(m):
        best_w = kids[taken, K_COUNT] + (bonus if kids[taken, K_LAST] == top else 0.0)
        prob = best_w * scale
        if prob < k.min_prob or n_cand >= cand.shape[0]:
            break
        cand_p[n_cand] = prob
        cand_share[n_cand] = best_w * step
        cand[n_cand, C_TOK] = kids[taken, K_TOK]
        cand[n_cand, C_PARENT] = cur.node
        cand[n_cand, C_STATE] = kids[taken, K_STATE]
        cand[n_cand, C_LEN] = cur.length + 1
        cand[n_cand, C_DEPTH] = cur.depth + 1
        cand[n_cand, C_PART] = cur.part
        cand[n_cand, C_GROUP] = learn.group(cls, 0)
        if not live:
            prefetch(f_offsets, kids[taken, K_STATE])  # read when the candidate is expanded
        if taken == 0 and may_direct and (n_heap == 0 or prob > heap_key[0]):
            direct = n_cand
            direct_p = prob
        else:
            n_heap = _heap_push(heap_key, heap_val, n_heap, prob, n_cand)
        n_cand += 1
    return n_cand, n_heap, direct, direct_p
