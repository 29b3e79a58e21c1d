"""Whole proposals: one session's draft tree from all its sources, and a batch of sessions in
parallel.

A session's parts (matched contexts), in this order:

- its live automaton (prompt + output): `match_levels` parts, the longest earlier match of the
  whole text and then the next shorter ones along suffix links;
- frozen automata (corpora, past-response generations): one cursor row `(state, length, anchor)`
  each, `state < 0` for a source the session does not use (anchor: `draft.CUR_ANCHOR`); `match_levels` parts each. Their arrays come
  as one table (`frozen.source_table`), each row of a source class (`learn.CLS_*`); the caller
  keeps them alive while a kernel runs, the kernels only read them.
- after the text left its longest earlier match, the recovery's two parts (`recover.py`: the
  copy going on past a replaced or inserted token) when the session has a recovery row.

A step's confidence is `learn.conf` over the session's and the proposer's learned counts (read
only here; `learn.count_*` write them when tokens are committed).

`draft.expand` grows the merged tree of all parts best-first with one heap, written into a
`draft.Tree` (views of the output arrays from the tree's first node) with parents local to the
tree (0-based), at most `budget` nodes. The kernels hand each other named tuples (`draft.Session`,
`draft.Shared`, `draft.Workspace`, `draft.Tree`), built once from the frames or the batch's arrays.

The batch kernels give each thread a strided share of the sessions, its own workspace and its own
link-cut stack; one thread runs no parallel region at all. Expanding a live automaton restructures
that automaton's link-cut tree, so a session must appear at most once in a batch and must not be
used by another thread meanwhile; frozen sources are only read.
"""

import numpy as np
from numba import njit, prange, typed, types

from ..errors import InternalError
from . import draft as dk
from . import learn
from . import recover as rk
from . import sam as sk
from .address import address, borrowed, keep_alive, prefetch, view_f64, view_i32, view_i64, view_i64_2d
from .frozen import N_TOP_ARRAYS, REC_COLS, SOURCE_COLS, link_of, source_arrays, source_len, source_plink

# A session frame (int64, see address.py): everything one proposal reads besides its workspace.
# a cursor row (int64): state (-1: the session does not use that source), matched length, anchor
CUR_STATE, CUR_LEN, CUR_ANCHOR, CUR_COLS = dk.CUR_STATE, dk.CUR_LEN, dk.CUR_ANCHOR, dk.CUR_COLS

(F_LIVE, F_CUR, F_CUR_ROWS, F_TABLE, F_TABLE_ROWS, F_PARAMS, F_PARAMS_LEN, F_MIN_MATCH, F_LEVELS, F_CLS, F_LOCAL,
 F_GLOBAL, F_CAL, F_TOPS, F_GCAL, F_REC) = range(16)
FRAME_LEN = 16
RECOVERY_PARTS = 2  # a session's parts beyond its sources': the recovery's (recover.SRC_SUBST, recover.SRC_INSERT)
STATS_LEN = learn.N_CLASSES * learn.N_BUCKETS * 2  # a learn stats table, flat


def session_frame(live, cur, table, params, min_match, levels, cls_rows, local, glob, cal, tops, gcal,
                  rec) -> np.ndarray:
    """The frame of a session: its automaton's live frame, its cursor rows (int64 [n, CUR_COLS]), the
    `source_table` they index and their source classes (int64 [n]), the proposer's params and
    knobs, the session's and the proposer's learn stats tables, the proposer's calibration table,
    the sources' `frozen.top_table`, the proposer's group table (`learn.new_group_calibration`)
    and the session's recovery row (int64 [recover.RROW_COLS]; the caller keeps them alive)."""
    if cur.ndim != 2 or cur.shape[1] != CUR_COLS or table.ndim != 2 or table.shape != (cur.shape[0], SOURCE_COLS):
        raise InternalError(f"session_frame: expected cursors [n, {CUR_COLS}] and a table [n, {SOURCE_COLS}], "
                         f"got {cur.shape} and {table.shape}")
    stats_shape = (learn.N_CLASSES, learn.N_BUCKETS, 2)
    if (cls_rows.shape != (cur.shape[0],) or cls_rows.dtype != np.int64 or local.shape != stats_shape
            or glob.shape != stats_shape or not (local.flags.c_contiguous and glob.flags.c_contiguous)
            or cal.shape != (learn.N_RANKS, learn.N_SHARES, learn.CAL_COLS) or not cal.flags.c_contiguous
            or gcal.shape != (learn.N_GROUPS, learn.CAL_COLS) or gcal.dtype != np.float64 or not gcal.flags.c_contiguous):
        raise InternalError("session_frame: expected int64 classes per cursor row, two C stats tables, a C "
                            "calibration table and a C group table")
    if tops.shape != (cur.shape[0], 2 * N_TOP_ARRAYS) or tops.dtype != np.int64:
        raise InternalError(f"session_frame: expected a top table [n, {2 * N_TOP_ARRAYS}], got {tops.shape}")
    if rec.shape != (rk.RROW_COLS,) or rec.dtype != np.int64:
        raise InternalError(f"session_frame: expected an int64 recovery row of {rk.RROW_COLS}, got {rec.dtype}{rec.shape}")
    if live.shape != (sk.LIVE_LEN,):
        raise InternalError(f"session_frame: expected a live frame of {sk.LIVE_LEN}, got {live.shape}")
    frame = np.empty(FRAME_LEN, np.int64)
    frame[F_LIVE] = address(live, np.int64)
    frame[F_CUR], frame[F_CUR_ROWS] = address(cur, np.int64), cur.shape[0]
    frame[F_TABLE], frame[F_TABLE_ROWS] = address(table, np.int64), table.shape[0]
    frame[F_PARAMS], frame[F_PARAMS_LEN] = address(params, np.float64), params.shape[0]
    frame[F_MIN_MATCH], frame[F_LEVELS] = min_match, levels
    frame[F_CLS] = address(cls_rows, np.int64)
    frame[F_LOCAL], frame[F_GLOBAL] = address(local, np.float64), address(glob, np.float64)
    frame[F_CAL] = address(cal, np.float64)
    frame[F_TOPS] = address(tops, np.int64)
    frame[F_GCAL] = address(gcal, np.float64)
    frame[F_REC] = address(rec, np.int64)
    return frame


@njit(cache=True, nogil=True, inline="always")
def _set_parts(session, shared, ws):
    """The session's parts into the workspace's `part_*` (module docstring); returns their number.
    Every frozen part's first reads are prefetched, to be in flight together."""
    S, M, cur, frozen = session.S, session.M, session.cur, shared.frozen
    levels, min_match = shared.levels, shared.min_match
    part_src, part_state, part_len = ws.part_src, ws.part_state, ws.part_len
    n_parts = 0
    last = M[sk.LAST_STATE]
    state = S[last, sk.LINK] if last > 0 else 0
    length = S[state, sk.LEN] if state > 0 else 0
    for level in range(levels):
        if length < min_match or n_parts >= part_src.shape[0]:
            break
        part_src[n_parts] = -1
        part_state[n_parts] = state
        part_len[n_parts] = length
        n_parts += 1
        state = S[state, sk.LINK]
        length = S[state, sk.LEN] if state > 0 else 0
    for j in range(cur.shape[0]):
        state = cur[j, CUR_STATE]
        length = cur[j, CUR_LEN]
        if state < 0:
            continue
        offsets, _lasts, links, _rec = source_arrays(frozen, j)
        plink = source_plink(frozen, j)
        for level in range(levels):
            if length < min_match or n_parts >= part_src.shape[0]:
                break
            part_src[n_parts] = j
            part_state[n_parts] = state
            part_len[n_parts] = length
            n_parts += 1
            prefetch(offsets, state)
            state = link_of(links, plink, state)  # a stored state (an implicit one is no link)
            if state < 0:
                break
            length = source_len(frozen, j, state)
            if length < 0:
                break  # damaged arrays: no shorter match
            if state == 0:
                length = 0
    recovery = session.rec
    if recovery[rk.RROW_STATE] > 0 and n_parts + RECOVERY_PARTS <= part_src.shape[0]:
        for i in range(RECOVERY_PARTS):  # the substitution's part, then the insertion's
            part_src[n_parts] = rk.SRC_SUBST if i == 0 else rk.SRC_INSERT
            part_state[n_parts] = recovery[rk.RROW_STATE]
            part_len[n_parts] = recovery[rk.RROW_LEN]
            n_parts += 1
    for i in range(n_parts):
        if part_src[i] >= 0:
            offsets, _lasts, _links, rec = source_arrays(frozen, part_src[i])
            v = part_state[i]
            if 0 <= v < offsets.shape[0]:
                prefetch(rec, REC_COLS * offsets[v])
    return n_parts


@njit(cache=True, nogil=True, inline="always")
def propose_one(session, shared, stack, budget, ws, tree):
    """One session's tree into `tree` (a `dk.Tree`, views from the tree's first node); returns
    (nodes written, link-cut stack). `session` is a `dk.Session`, `shared` a `dk.Shared`: row j
    of `shared.frozen` holds the source of cursor row j of `session.cur`; `ws` is the thread's
    `dk.Workspace`, `stack` its link-cut stack (`dk.expand`)."""
    n_parts = _set_parts(session, shared, ws)
    if n_parts == 0:
        return 0, stack
    return dk.expand(session, shared, stack, n_parts, budget, ws, tree)


@njit(cache=True, nogil=True, inline="always")
def _tree_at(out_tok, out_par, out_depth, out_prob, out_share, out_group, out_step, at):
    """The `dk.Tree` of the output arrays from node `at` on."""
    return dk.Tree(out_tok[at:], out_par[at:], out_depth[at:], out_prob[at:], out_share[at:], out_group[at:],
                   out_step[at:])


# propose_framed's result: the tree's first arena node above TREE_SHIFT bits, its node count below
TREE_SHIFT = 32
TREE_COUNT_MASK = (1 << TREE_SHIFT) - 1


@njit(cache=True, nogil=True, inline="always")
def _framed_session(frame):
    """(`dk.Session`, link-cut stack) of the session a `session_frame` names."""
    S, E, L, M, stack = sk.live_arrays(view_i64(frame[F_LIVE], sk.LIVE_LEN))
    cur = view_i64_2d(frame[F_CUR], frame[F_CUR_ROWS], CUR_COLS)
    local = view_f64(frame[F_LOCAL], STATS_LEN).reshape((learn.N_CLASSES, learn.N_BUCKETS, 2))
    return dk.Session(S, E, L, M, cur, local, view_i64(frame[F_REC], rk.RROW_COLS)), stack


@njit(cache=True, nogil=True, inline="always")
def _framed_shared(frame):
    """The `dk.Shared` a `session_frame` names."""
    table = view_i64_2d(frame[F_TABLE], frame[F_TABLE_ROWS], SOURCE_COLS)
    tops = view_i64_2d(frame[F_TOPS], frame[F_TABLE_ROWS], 2 * N_TOP_ARRAYS)
    params = view_f64(frame[F_PARAMS], frame[F_PARAMS_LEN])
    cls_rows = view_i64(frame[F_CLS], frame[F_CUR_ROWS])
    glob = view_f64(frame[F_GLOBAL], STATS_LEN).reshape((learn.N_CLASSES, learn.N_BUCKETS, 2))
    cal = view_f64(frame[F_CAL], learn.CAL_LEN).reshape((learn.N_RANKS, learn.N_SHARES, learn.CAL_COLS))
    gcal = view_f64(frame[F_GCAL], learn.N_GROUPS * learn.CAL_COLS).reshape((learn.N_GROUPS, learn.CAL_COLS))
    return dk.Shared(table, tops, cls_rows, glob, cal, gcal, params, frame[F_MIN_MATCH], frame[F_LEVELS])


def tree_span(r: int) -> tuple[int, int]:
    """(first, end) arena nodes of a non-negative `propose_framed` result (empty when equal)."""
    a = r >> TREE_SHIFT
    return a, a + (r & TREE_COUNT_MASK)


def set_arena(wsf, out_i32, out_f64) -> None:
    """Give a workspace frame a fresh output arena: tokens, parents, depths and groups of up to
    `cap` nodes in out_i32 (int32[4 cap]: four blocks of cap), probabilities, shares and steps in
    out_f64 (float64[3 cap]: three blocks).
    Trees are written one after another and handed out as views, so the arrays must never be
    written again by anyone else (the caller keeps them alive while the frame can be read)."""
    cap = out_f64.shape[0] // 3
    if out_i32.dtype != np.int32 or out_i32.shape != (4 * cap,) or out_f64.shape != (3 * cap,):
        raise InternalError(f"set_arena: expected int32[{4 * cap}] beside float64[{3 * cap}], got {out_i32.dtype}{out_i32.shape}")
    wsf[dk.WS_OUT_I32], wsf[dk.WS_OUT_F64] = address(out_i32, np.int32), address(out_f64, np.float64)
    wsf[dk.WS_OUT_CAP], wsf[dk.WS_OUT_OFF] = cap, 0


@njit(cache=True, nogil=True, inline="always")
def _prefetch_arena(out, out_f64, cap, at, n):
    """Prefetch the cache lines of arena nodes [at, at + n) in all seven blocks (`set_arena`): the
    lines a tree written there stores to, each tree's lines no recent proposal touched."""
    end = min(at + n, cap)
    if at >= end:
        return
    for block in range(4):  # a line holds 16 int32 ...
        for i in range(block * cap + at, block * cap + end, 16):
            prefetch(out, i)
        prefetch(out, block * cap + end - 1)
    for block in range(3):  # ... or 8 float64
        for i in range(block * cap + at, block * cap + end, 8):
            prefetch(out_f64, i)
        prefetch(out_f64, block * cap + end - 1)


@njit(cache=True, nogil=True)
def propose_framed(frame_addr, wsf_addr, budget):
    """`propose_one` for the session whose `session_frame` lies at `frame_addr`, in the workspace
    whose `dk.workspace_frame` lies at `wsf_addr`, into the next free nodes of its output arena.
    Returns (offset << TREE_SHIFT) | count (`tree_span` decodes it): the tree lies at
    [offset, offset + count) of the arena's seven blocks; -1 (nothing written) when the workspace
    is too small for `budget` nodes from the session's parts or the arena has no room for them.
    Three integer arguments and no output allocation (passing the arrays themselves costs the
    dispatcher a type check and unboxing per array); the addresses
    must come from `address.address` of live frames (see address.py). A link-cut stack outgrown
    here is dropped with the call (the automaton's own operations grow its stack as they need)."""
    frame = view_i64(frame_addr, FRAME_LEN)
    wsf = view_i64(wsf_addr, dk.WS_FRAME_LEN)
    header = view_i64(wsf[dk.WS_I64], dk.WS_HEADER)
    cap = wsf[dk.WS_OUT_CAP]
    off = wsf[dk.WS_OUT_OFF]
    n_parts = (1 + frame[F_CUR_ROWS]) * frame[F_LEVELS] + RECOVERY_PARTS
    if budget < 1 or budget > header[dk.WS_BUDGET] or n_parts > header[dk.WS_SOURCES] or off + budget > cap:
        return -1
    out = view_i32(wsf[dk.WS_OUT_I32], 4 * cap)
    session, stack = _framed_session(frame)
    out_f64 = view_f64(wsf[dk.WS_OUT_F64], 3 * cap)
    tree = _tree_at(out[:cap], out[cap : 2 * cap], out[2 * cap : 3 * cap], out_f64[:cap], out_f64[cap : 2 * cap],
                    out[3 * cap :], out_f64[2 * cap :], off)
    _prefetch_arena(out, out_f64, cap, off, budget)  # in flight while the parts are found
    k, stack = propose_one(session, _framed_shared(frame), stack, budget, dk.framed_workspace(wsf), tree)
    wsf[dk.WS_OUT_OFF] = off + k
    _prefetch_arena(out, out_f64, cap, off + k, budget)  # the next tree's, most often of the same budget
    return (off << TREE_SHIFT) | k


@njit(cache=True, nogil=True)
def _batch_share(live, slots, curs, recs, frozen, tops, cls_rows, locals_, glob, cal, gcal, budgets, params, min_match, levels,
                 c, n_chunks, starts, out_tok, out_par, out_depth, out_prob, out_share, out_group, out_step, counts):
    """Sessions c, c + n_chunks, ... of the batch, with one workspace and one link-cut stack.
    Not inlined: inlined into the prange body, numba's parfor passes miscompiled the expansion
    loops (some trees differed from the serial kernel's); a call per share costs nothing.
    The expansion sees `borrowed` views only (as `propose_framed` does): the arrays it passes to
    its inlined phases then cost no reference counting."""
    n = slots.shape[0]
    bmax = 64
    for i in range(n):
        bmax = max(bmax, budgets[i])
    n_sources = max((1 + curs.shape[1]) * levels + RECOVERY_PARTS, 4)
    i32, f64, i64 = dk.workspace_buffers(bmax, int(params[dk.P_MAX_CHILDREN]), n_sources)
    ws = dk.workspace_views(borrowed(i32), borrowed(f64), borrowed(i64))
    stack = np.empty(64, np.int32)
    shared = dk.Shared(borrowed(frozen), borrowed(tops), borrowed(cls_rows), borrowed(glob), borrowed(cal),
                       borrowed(gcal), borrowed(params), min_match, levels)
    for i in range(c, n, n_chunks):
        S, E, L, M = live[slots[i]]  # the list keeps them alive
        session = dk.Session(borrowed(S), borrowed(E), borrowed(L), borrowed(M), borrowed(curs[i]), borrowed(locals_[i]),
                             borrowed(recs[i]))
        tree = _tree_at(borrowed(out_tok), borrowed(out_par), borrowed(out_depth), borrowed(out_prob),
                        borrowed(out_share), borrowed(out_group), borrowed(out_step), starts[i])
        k, stack = propose_one(session, shared, stack, budgets[i], ws, tree)
        counts[i] = k
    keep_alive(i32) + keep_alive(f64) + keep_alive(i64)  # the workspace's views are borrowed


@njit(cache=True, nogil=True)
def propose_batch_serial(live, slots, curs, recs, frozen, tops, cls_rows, locals_, glob, cal, gcal, budgets, params, min_match,
                         levels, starts, out_tok, out_par, out_depth, out_prob, out_share, out_group, out_step):
    """Session i (live arrays (S, E, L, M) at `live[slots[i]]`, cursor rows `curs[i]`, recovery row
    `recs[i]`, learn stats `locals_[i]`) gets its tree at `out_*[starts[i]:]`; returns the node count of each. One thread,
    no parallel region: nothing to share with (or wait for) the model's OpenMP threads."""
    counts = np.zeros(slots.shape[0], np.int64)
    _batch_share(live, slots, curs, recs, frozen, tops, cls_rows, locals_, glob, cal, gcal, budgets, params, min_match,
                 levels, 0, 1, starts, out_tok, out_par, out_depth, out_prob, out_share, out_group, out_step, counts)
    return counts


@njit(cache=True, nogil=True, parallel=True)
def propose_batch(live, slots, curs, recs, frozen, tops, cls_rows, locals_, glob, cal, gcal, budgets, params, min_match, levels,
                  n_chunks, starts, out_tok, out_par, out_depth, out_prob, out_share, out_group, out_step):
    """`propose_batch_serial` split into `n_chunks` strided shares run in parallel (prange)."""
    counts = np.zeros(slots.shape[0], np.int64)
    for c in prange(n_chunks):
        _batch_share(live, slots, curs, recs, frozen, tops, cls_rows, locals_, glob, cal, gcal, budgets, params,
                     min_match, levels, c, n_chunks, starts, out_tok, out_par, out_depth, out_prob, out_share, out_group, out_step,
                     counts)
    return counts


@njit(cache=True, nogil=True)
def normalize_frozen(links, lens, state, length):
    """A cursor (state, length) taken in an earlier snapshot of the same growing automaton may
    predate a clone that took its shorter strings; walk to the state that holds them now."""
    while 0 < state < links.shape[0] and 0 <= links[state] < lens.shape[0] and lens[links[state]] >= length:
        state = links[state]
    return state


# The batch kernels' typed list of live automata: built and filled through these cached functions,
# because typed List's own methods are compiled afresh in every process on first use (a delay on a
# first request).
LIVE_ITEM = types.Tuple((types.int32[:, ::1], types.int32[:, ::1], types.int32[:, ::1], types.int64[::1]))  # S, E, L, M


@njit(cache=True)
def new_live_list():
    return typed.List.empty_list(LIVE_ITEM)


@njit(cache=True)
def list_append(lst, item):
    lst.append(item)


@njit(cache=True)
def list_set(lst, i, item):
    lst[i] = item
