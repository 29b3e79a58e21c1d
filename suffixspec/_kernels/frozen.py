"""Queries over the frozen (read-only, CSR) automaton layout.

Arrays: `links`, `lens`, `counts`, `lasts` int32[n_states]; `offsets` int64[n_states + 1], int32
in a `source_table` (edges of state v are offsets[v]:offsets[v+1]); `etok`, `eto` int32[n_edges],
sorted by token within each state. They may be memory-mapped from a file that was damaged after
its header was checked, so every index read from an array is range-checked before it is
followed: a kernel returns CORRUPT (-2) instead of reading out of bounds, and callers raise.
"""

import numpy as np
from numba import njit

from .address import address, view_i32
from ..errors import InternalError

CORRUPT = -2


@njit(cache=True)
def transition(offsets, etok, eto, state, tok):
    n = offsets.shape[0] - 1
    m = etok.shape[0]
    if state < 0 or state >= n:
        return CORRUPT
    lo = offsets[state]
    hi = offsets[state + 1]
    if lo < 0 or hi > m or lo > hi:
        return CORRUPT
    while lo < hi:
        mid = (lo + hi) >> 1
        t = etok[mid]
        if t < tok:
            lo = mid + 1
        elif t > tok:
            hi = mid
        else:
            d = eto[mid]
            if d < 0 or d >= n:
                return CORRUPT
            return d
    return -1


@njit(cache=True)
def advance(offsets, etok, eto, links, lens, state, length, tokens):
    n = offsets.shape[0] - 1
    # a cursor taken on an earlier snapshot of a growing automaton: its strings of the
    # current length may have moved to a clone on the suffix-link path
    guard = 0
    while state > 0 and guard <= n:
        p = links[state]
        if p < 0 or p >= n:
            return CORRUPT, 0
        if lens[p] < length:
            break
        state = p
        guard += 1
    for j in range(tokens.shape[0]):
        c = tokens[j]
        steps = 0
        while True:
            nxt = transition(offsets, etok, eto, state, c)
            if nxt == CORRUPT:
                return CORRUPT, 0
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
                return CORRUPT, 0
            state = p
            length = lens[state]
            if length < 0:
                return CORRUPT, 0
    return state, length


@njit(cache=True)
def locate(offsets, etok, eto, pattern):
    state = 0
    for j in range(pattern.shape[0]):
        state = transition(offsets, etok, eto, state, pattern[j])
        if state < 0:
            return state
    return state


@njit(cache=True)
def out_edges(offsets, etok, eto, state):
    n = offsets.shape[0] - 1
    m = etok.shape[0]
    if state < 0 or state >= n:
        return np.empty(0, np.int32), np.empty(0, np.int32), False
    lo = offsets[state]
    hi = offsets[state + 1]
    if lo < 0 or hi > m or lo > hi:
        return np.empty(0, np.int32), np.empty(0, np.int32), False
    dst = eto[lo:hi].copy()
    for i in range(dst.shape[0]):
        if dst[i] < 0 or dst[i] >= n:
            return np.empty(0, np.int32), np.empty(0, np.int32), False
    return etok[lo:hi].copy(), dst, True


# The proposal kernels take every frozen source of a session as one table: row j holds the
# addresses of source j's seven int32 arrays (offsets, etok, eto, counts, lasts, links, lens),
# then their lengths. One array argument, where a typed list of tuples cost ~0.9 us per call to
# type-check and unbox. The caller keeps the arrays alive while kernels may read them.
N_SOURCE_ARRAYS = 7
SRC_OFFSETS, SRC_ETOK, SRC_ETO, SRC_COUNTS, SRC_LASTS, SRC_LINKS, SRC_LENS = range(N_SOURCE_ARRAYS)


def source_table(arrays) -> np.ndarray:
    """The table of frozen sources from their arrays (7 C-contiguous int32 arrays each)."""
    table = np.zeros((len(arrays), 2 * N_SOURCE_ARRAYS), np.int64)
    for j, arrs in enumerate(arrays):
        if len(arrs) != N_SOURCE_ARRAYS:
            raise InternalError(f"source_table: expected {N_SOURCE_ARRAYS} arrays per source, got {len(arrs)}")
        for k, a in enumerate(arrs):
            if a.dtype != np.int32 or a.ndim != 1 or not a.flags.c_contiguous:
                raise InternalError(f"source_table: expected 1-D C-contiguous int32 arrays, got {a.dtype} {a.shape}")
            table[j, k] = address(a, np.int32)
            table[j, N_SOURCE_ARRAYS + k] = a.shape[0]
    return table


@njit(cache=True, nogil=True, inline="always")
def source_arrays(table, j):
    """(offsets, etok, eto, counts, lasts, links, lens) of row j of a `source_table`."""
    n = N_SOURCE_ARRAYS
    return (view_i32(table[j, 0], table[j, n]), view_i32(table[j, 1], table[j, n + 1]),
            view_i32(table[j, 2], table[j, n + 2]), view_i32(table[j, 3], table[j, n + 3]),
            view_i32(table[j, 4], table[j, n + 4]), view_i32(table[j, 5], table[j, n + 5]),
            view_i32(table[j, 6], table[j, n + 6]))
