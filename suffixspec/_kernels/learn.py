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

`count_frozen` / `count_own` advance a cursor exactly as `frozen.advance` / `sam.advance` do,
adding the events to two tables (the session's and the proposer's).
"""

import numpy as np
from numba import njit

from . import frozen as fk
from . import sam as sk

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
def count_frozen(offsets, etok, eto, links, lens, state, length, tokens, min_match, cls, local, glob):
    """`frozen.advance` of (state, length) over `tokens`, counting each token's event."""
    n = offsets.shape[0] - 1
    guard = 0
    while state > 0 and guard <= n:
        p = links[state]
        if p < 0 or p >= n:
            return fk.CORRUPT, 0
        if lens[p] < length:
            break
        state = p
        guard += 1
    for j in range(tokens.shape[0]):
        c = tokens[j]
        steps = 0
        first = True
        while True:
            nxt = fk.transition(offsets, etok, eto, state, c)
            if nxt == fk.CORRUPT:
                return fk.CORRUPT, 0
            if first and length >= min_match:
                _add(local, glob, cls, length, nxt != -1)
            first = False
            if nxt != -1:
                state = nxt
                length += 1
                break
            if state == 0:
                length = 0
                break
            p = links[state]
            steps += 1
            if p < 0 or p >= n or steps > n:
                return fk.CORRUPT, 0
            state = p
            length = lens[state]
            if length < 0:
                return fk.CORRUPT, 0
    return state, length


@njit(cache=True, nogil=True)
def count_own(S, E, H, M, tokens, min_match, local, glob):
    """The events of the request's own match (the longest earlier occurrence of the context's
    suffix: the suffix link of the whole text), advanced like `sam.advance` through the automaton
    as it stands, before `tokens` are added to it; returns the final matched length."""
    last = M[sk.LAST_STATE]
    state = S[last, sk.LINK] if last > 0 else 0
    length = S[state, sk.LEN] if state > 0 else 0
    for j in range(tokens.shape[0]):
        c = tokens[j]
        first = True
        while True:
            nxt = sk.transition(S, E, H, state, c)
            if first and length >= min_match:
                _add(local, glob, CLS_OWN, length, nxt != -1)
            first = False
            if nxt != -1:
                state = nxt
                length += 1
                break
            if state == 0:
                length = 0
                break
            state = S[state, sk.LINK]
            length = S[state, sk.LEN]
    return length
