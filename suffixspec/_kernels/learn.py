"""Learned continuation confidence: how often a source's match continues, by source class and
matched length, counted from the tokens a request actually committed.

Terms. A *source class* is the kind of source a part reads: CLS_OWN (the request's own
automaton), CLS_CACHE (past responses), CLS_CORPUS (corpora). An *event* is one committed token
seen by one source whose current match (state, length) has length >= min_match: a *hit* when the
matched state has a transition on that token (the copy continues), a *trial* either way. Events
are counted whatever the tree drafted, so the estimate carries no selection bias from the drafts.

A stats table is float64 [N_CLASSES, N_BUCKETS, 2] (columns HITS, TRIALS), indexed by the
length bucket of `bucket` (1, 2, 3, 4-5, 6-7, 8-11, 12-15, 16-23, 24-31, 32-47, 48-63, 64+).
`conf` is the confidence the draft kernel multiplies a path by at each step,

    base(L) = L / (L + match_prior)                              (the hand-set prior)
    global(c, L) = (hits_g + prior_strength * base) / (trials_g + prior_strength)
    conf(c, L) = (hits_s + session_strength * global) / (trials_s + session_strength)

shrinking the session's own counts (`_s`) toward the proposer's counts over every request (`_g`),
and those toward the prior; with no counts at all it is exactly base(L). The global table halves a
bucket's counts once its trials pass GLOBAL_CAP (older requests fade).

`count_frozen` / `count_own` advance a cursor exactly as `frozen.advance` / `sam_query.advance` do,
adding the events to two tables (the session's and the proposer's).
"""

import numpy as np
from numba import njit

from . import frozen as fk
from . import sam as sk
from .address import borrowed
from .follow import follow

CLS_OWN, CLS_CACHE, CLS_CORPUS = 0, 1, 2
N_CLASSES = 3
N_BUCKETS = 12
HITS, TRIALS = 0, 1
GLOBAL_CAP = 4096.0


def new_stats() -> np.ndarray:
    """An empty stats table."""
    return np.zeros((N_CLASSES, N_BUCKETS, 2), np.float64)


@njit(cache=True, nogil=True, inline="always")
def bucket(length):
    """The length bucket of a matched length >= 1 (see the module docstring)."""
    if length <= 3:
        return max(length, 1) - 1
    if length < 64:
        # 4-5, 6-7 | 8-11, 12-15 | 16-23, 24-31 | 32-47, 48-63: two buckets per power of two
        k = 0
        x = length
        while x >= 8:
            x >>= 1
            k += 1
        return 3 + 2 * k + (1 if x >= 6 else 0)
    return N_BUCKETS - 1


@njit(cache=True, nogil=True, inline="always")
def conf(local, glob, cls, length, prior, prior_strength, session_strength):
    """The learned chance that a match of `length` in a source of class `cls` continues."""
    base = length / (length + prior)
    b = bucket(length)
    gt = glob[cls, b, TRIALS]
    g = base if gt <= 0 else (glob[cls, b, HITS] + prior_strength * base) / (gt + prior_strength)
    lt = local[cls, b, TRIALS]
    return g if lt <= 0 else (local[cls, b, HITS] + session_strength * g) / (lt + session_strength)


@njit(cache=True, nogil=True, inline="always")
def _add(local, glob, cls, length, hit):
    b = bucket(length)
    local[cls, b, TRIALS] += 1.0
    glob[cls, b, TRIALS] += 1.0
    if hit:
        local[cls, b, HITS] += 1.0
        glob[cls, b, HITS] += 1.0
    if glob[cls, b, TRIALS] > GLOBAL_CAP:
        glob[cls, b, TRIALS] *= 0.5
        glob[cls, b, HITS] *= 0.5


@njit(cache=True, nogil=True)
def count_frozen(offsets, etok, eto, links, lens, text, plink, state, length, tokens, min_match, cls, local, glob):
    """`frozen.advance` of (state, length) over `tokens`, counting each token's event (`text` and
    `plink`: the automaton's implicit states, frozen.py)."""
    n = offsets.shape[0] - 1
    guard = 0
    while state > 0 and guard <= n:
        p = fk.link_of(links, plink, state)
        if p < 0 or p >= n:
            return fk.CORRUPT, 0
        if lens[p] < length:
            break
        state = p
        guard += 1
    g = (borrowed(offsets), borrowed(etok), borrowed(eto), borrowed(links), borrowed(lens), borrowed(text), borrowed(plink))
    for j in range(tokens.shape[0]):
        before = length
        state, length, first = follow(fk.edge_to, fk.link_up, g, state, length, tokens[j])
        if first >= 0 and before >= min_match:
            _add(local, glob, cls, before, first == 1)
        if state == fk.CORRUPT:
            return fk.CORRUPT, 0
    return state, length


@njit(cache=True, nogil=True)
def count_own(S, E, H, M, tokens, min_match, local, glob):
    """The events of the request's own match (the longest earlier occurrence of the context's
    suffix: the suffix link of the whole text), advanced like `sam_query.advance` through the automaton
    as it stands, before `tokens` are added to it; returns the final matched length."""
    last = M[sk.LAST_STATE]
    state = S[last, sk.LINK] if last > 0 else 0
    length = S[state, sk.LEN] if state > 0 else 0
    g = (S, E, H)
    for j in range(tokens.shape[0]):
        before = length
        state, length, first = follow(sk.edge_to, sk.link_up, g, state, length, tokens[j])
        if before >= min_match:
            _add(local, glob, CLS_OWN, before, first == 1)
    return length


# -- Sibling calibration. A node's *rank* is the number of siblings created before it (siblings
# are created best first, so rank 0 is its parent's best child), its *share* the step
# probability its part gave it (its score over that part's probability of the parent). Every
# committed token after a proposal judges the nodes whose parent lay on the committed path
# (`count_tree`): a trial, a hit when the node's token is the one committed. A calibration table
# is float64 [N_RANKS, N_SHARES, 3] (columns CAL_HITS, CAL_EXPECT: the sum of the judged nodes'
# shares, CAL_TRIALS); ranks 0, 1, 2, 3+ and share buckets by SHARE_EDGES. `rank_factor` is what
# the draft kernel multiplies a new node's share by:
#
#     raw(r, s) = min(1, (hits + strength) / (expected + strength))       over the cell (r, bucket(s))
#     factor(r, s) = min over r' <= r of raw(r', s)
#
# (never more than 1, never more for a later sibling than for an earlier one at the same share,
# so a key computed at a lower rank bounds the node's score from above). With no trials it is 1.
# The proposer's table halves a cell once its trials pass GLOBAL_CAP.
N_RANKS = 4
SHARE_EDGES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
N_SHARES = len(SHARE_EDGES) + 1
CAL_HITS, CAL_EXPECT, CAL_TRIALS = 0, 1, 2
CAL_COLS = 3
CAL_LEN = N_RANKS * N_SHARES * CAL_COLS  # a calibration table, flat


def new_calibration() -> np.ndarray:
    """An empty calibration table."""
    return np.zeros((N_RANKS, N_SHARES, CAL_COLS), np.float64)


@njit(cache=True, nogil=True, inline="always")
def share_bucket(share):
    """The bucket of a share: the number of SHARE_EDGES at or below it."""
    b = 0
    while b < N_SHARES - 1 and share >= SHARE_EDGES[b]:
        b += 1
    return b


@njit(cache=True, nogil=True, inline="always")
def rank_factor(cal, rank, share, strength):
    """The calibration factor of a new node at `rank` with `share` (see above)."""
    return rank_factor_bucket(cal, rank, share_bucket(share), strength)


@njit(cache=True, nogil=True, inline="always")
def rank_factor_bucket(cal, rank, b, strength):
    """`rank_factor` of a share in bucket `b` (`share_bucket`)."""
    f = 1.0
    for r in range(min(rank, N_RANKS - 1) + 1):
        if cal[r, b, CAL_TRIALS] > 0:
            g = (cal[r, b, CAL_HITS] + strength) / (cal[r, b, CAL_EXPECT] + strength)
            if g < f:
                f = g
    return f


# -- Source calibration. A node's *group* names the part that created it: its source class and, at
# the root, how many parts proposed its token there (1, 2, 3+: parts that agree on the next token
# are right more often than a lone one; an inner node's agreement bucket is 0). Only corpus parts
# have groups (the table keeps a row per class): discounting the request's own and past responses'
# parts as well, measured, lost acceptance on chat without a corpus. Its *step* is the
# probability it was given over its parent's before the group's factor: its share times its rank
# factor. A group table is float64 [N_GROUPS, 3] (columns CAL_HITS, CAL_EXPECT: the sum of the
# judged nodes' steps, CAL_TRIALS), judged like the sibling calibration; `group_factor` is what the
# draft kernel multiplies a part's step by (the path probability never above its parent's):
#
#     factor(g) = min(GROUP_MAX, (hits + strength) / (expected + strength))     (1 with no trials)
#
# Never above 1, like the sibling factor: a group that was over-trusted (a stale corpus's lone
# guess at the next token) is lowered; one accepted more often than its steps said is left as it
# is (raising the request's own deep chains, measured, lost acceptance). The proposer's table halves
# a group once its trials pass GLOBAL_CAP.
N_AGREE = 4
N_GROUPS = N_CLASSES * N_AGREE
GROUP_MAX = 1.0


def new_group_calibration() -> np.ndarray:
    """An empty group table."""
    return np.zeros((N_GROUPS, CAL_COLS), np.float64)


@njit(cache=True, nogil=True, inline="always")
def group(cls, agree):
    """The group of a node created by a part of class `cls`; `agree`: at the root, the number of
    parts that proposed its token (>= 1), 0 for an inner node. -1 (no group: factor 1, not
    judged) unless `cls` is CLS_CORPUS."""
    if cls != CLS_CORPUS:
        return -1
    return cls * N_AGREE + min(agree, N_AGREE - 1)


@njit(cache=True, nogil=True, inline="always")
def group_factor(gcal, g, strength):
    """The factor of group `g` (see above)."""
    if g < 0:
        return 1.0
    t = gcal[g, CAL_TRIALS]
    if t <= 0:
        return 1.0
    return min(GROUP_MAX, (gcal[g, CAL_HITS] + strength) / (gcal[g, CAL_EXPECT] + strength))


@njit(cache=True, nogil=True, inline="always")
def _judge(cal, r, b, share, hit):
    cal[r, b, CAL_TRIALS] += 1.0
    cal[r, b, CAL_EXPECT] += share
    if hit:
        cal[r, b, CAL_HITS] += 1.0
    if cal[r, b, CAL_TRIALS] > GLOBAL_CAP:
        cal[r, b, CAL_TRIALS] *= 0.5
        cal[r, b, CAL_EXPECT] *= 0.5
        cal[r, b, CAL_HITS] *= 0.5


@njit(cache=True, nogil=True)
def count_tree(tokens, parents, shares, groups, steps, a, e, committed, cal, gcal):
    """Judge the tree at [a, e) of the arena blocks (parents local to the tree, parents before
    children) by the tokens committed after it: every node whose parent lay on the committed path
    (the root does), at a depth the committed tokens reach, is a trial of its (rank, share) cell of
    `cal` and of its group of `gcal` (expected: its step), a hit when its token is the committed
    one. Returns the number of hits (accepted drafts)."""
    n = e - a
    on_path = np.zeros(n, np.bool_)
    depth = np.zeros(n, np.int64)
    kids = np.zeros(n + 1, np.int64)  # children seen so far, per node (index n: the root)
    gcal2 = gcal.reshape((1, gcal.shape[0], gcal.shape[1]))
    hits = 0
    m = committed.shape[0]
    for i in range(n):
        p = parents[a + i]
        slot = n if p < 0 else p
        rank = kids[slot]
        kids[slot] += 1
        d = 1 if p < 0 else depth[p] + 1
        depth[i] = d
        if d > m or (p >= 0 and not on_path[p]):
            continue
        hit = tokens[a + i] == committed[d - 1]
        on_path[i] = hit
        if hit:
            hits += 1
        _judge(cal, min(rank, N_RANKS - 1), share_bucket(shares[a + i]), shares[a + i], hit)
        g = groups[a + i]
        if 0 <= g < gcal.shape[0]:
            _judge(gcal2, 0, g, steps[a + i], hit)
    return hits
