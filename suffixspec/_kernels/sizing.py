"""The automatic budget's per-round arithmetic over flat arrays of draft trees.

Trees of a round's rows are concatenated: row i's nodes are `offsets[i]:offsets[i + 1]` of
`scores` (float64) and `depths` (int32). Both kernels do, in the same order of floating-point
operations, what `BudgetPolicy.size_round` and `prune_tree` did with numpy per row, so their
results are bit-identical to it.

`round_gains`: gains[k] = the weighted sum over rows of the row's k best calibrated estimates
(each a node's score, times the chance the output runs past its depth where the row uses
`cont`, times the calibration factor of its rank and the row's scale, at most 1).
`prune_keep`: the nodes of one tree that its best `size` by score keep (best first, ties in
index order, a node only after its parent and only within `max_depth`), and their parents
renumbered.
"""

import numpy as np
from numba import njit


@njit(cache=True)
def round_gains(scores, depths, offsets, scale, weights, cont, use_cont, factors, kmax):
    """float64[kmax + 1]; `cont` float64[rows, D] ([i, d]: row i's output runs past depth d,
    depths beyond D - 1 read D - 1), read only where `use_cont[i]`; `factors[r]`: rank r + 1."""
    gains = np.zeros(kmax + 1)
    last = cont.shape[1] - 1
    for i in range(offsets.shape[0] - 1):
        a = offsets[i]
        n = offsets[i + 1] - a
        if n == 0:
            continue  # its gains are 0 at every size
        worth = np.empty(n)
        for j in range(n):
            s = scores[a + j]
            if use_cont[i]:
                d = depths[a + j]
                s = s * cont[i, d if d < last else last]
            worth[j] = s
        worth = np.sort(worth)
        wi = weights[i]
        total = 0.0
        for r in range(n):
            x = worth[n - 1 - r] * (factors[r] * scale[i])
            if x > 1.0:
                x = 1.0
            total += x
            gains[r + 1] += wi * total
        for k in range(n + 1, kmax + 1):
            gains[k] += wi * total
    return gains


@njit(cache=True)
def prune_keep(scores, parents, depths, size, max_depth):
    """(kept node indexes ascending int64, their parents among the kept int32, -1: the root)."""
    n = scores.shape[0]
    order = np.argsort(-scores, kind="mergesort")  # stable: ties stay in index order
    keep = np.zeros(n, np.bool_)
    count = 0
    for i in order:
        if count >= size:
            break
        p = parents[i]
        if depths[i] <= max_depth and (p < 0 or keep[p]):
            keep[i] = True
            count += 1
    idx = np.empty(count, np.int64)
    remap = np.full(n, -1, np.int64)
    m = 0
    for i in range(n):
        if keep[i]:
            idx[m] = i
            remap[i] = m
            m += 1
    new_parents = np.empty(count, np.int32)
    for m in range(count):
        p = parents[idx[m]]
        new_parents[m] = -1 if p < 0 else remap[p]
    return idx, new_parents
