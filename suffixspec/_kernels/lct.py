"""Link-cut tree over the suffix-link tree, for exact online occurrence counts.

Every indexed position adds +1 to the occurrence count, and sets the most recent end position,
of every state on the suffix-link path from its state to the root. Done naively this costs the
depth of the suffix-link tree, which is the text length on degenerate input ("aaaa..."). A
link-cut tree makes each such root-path update, and each relinking caused by a clone, cost
O(log n) amortized, whatever the input.

Layout: `L` is int32[capacity, 5] with columns CH0, CH1 (splay children), PAR (splay parent, or
path-parent when the node is the root of its splay tree), TADD (pending count increment for
the splay subtree, already applied to the node itself) and TLAST (pending max end position,
same convention, -1 for none). The values themselves live in the automaton's state rows
`S[:, CNT]` and `S[:, LAST]`. The represented tree is always rooted at state 0 and is never
re-rooted, so no reversal flags are needed.

Invariant: the true value of node x is S[x] plus the TADD (max with TLAST) of its strict
ancestors *within its splay tree*; after `splay(x)` it is exactly S[x].
"""

import numpy as np
from numba import njit

CH0, CH1, PAR, TADD, TLAST = 0, 1, 2, 3, 4
CNT, LAST = 3, 4  # columns of the automaton's state rows, see sam.py


@njit(cache=True, inline="always")
def is_splay_root(L, x):
    p = L[x, PAR]
    return p == -1 or (L[p, CH0] != x and L[p, CH1] != x)


@njit(cache=True, inline="always")
def push(L, S, x):
    add = L[x, TADD]
    lst = L[x, TLAST]
    if add == 0 and lst < 0:
        return
    for k in range(2):
        c = L[x, k]
        if c != -1:
            if add != 0:
                S[c, CNT] += add
                L[c, TADD] += add
            if lst > S[c, LAST]:
                S[c, LAST] = lst
            if lst > L[c, TLAST]:
                L[c, TLAST] = lst
    L[x, TADD] = 0
    L[x, TLAST] = -1


@njit(cache=True, inline="always")
def rotate(L, x):
    p = L[x, PAR]
    g = L[p, PAR]
    d = 0 if L[p, CH0] == x else 1
    b = L[x, 1 - d]
    if not is_splay_root(L, p):
        if L[g, CH0] == p:
            L[g, CH0] = x
        else:
            L[g, CH1] = x
    L[x, PAR] = g
    L[p, d] = b
    if b != -1:
        L[b, PAR] = p
    L[x, 1 - d] = p
    L[p, PAR] = x


@njit(cache=True)
def splay(L, S, x, stack):
    # Push pending tags from the splay root down to x before rotating.
    k = 0
    y = x
    while True:
        if k == stack.shape[0]:
            bigger = np.empty(2 * stack.shape[0], np.int32)
            bigger[:k] = stack[:k]
            stack = bigger
        stack[k] = y
        k += 1
        if is_splay_root(L, y):
            break
        y = L[y, PAR]
    for j in range(k - 1, -1, -1):
        push(L, S, stack[j])
    while not is_splay_root(L, x):
        p = L[x, PAR]
        if not is_splay_root(L, p):
            g = L[p, PAR]
            if (L[g, CH0] == p) == (L[p, CH0] == x):
                rotate(L, p)
            else:
                rotate(L, x)
        rotate(L, x)
    return stack


@njit(cache=True)
def access(L, S, x, stack):
    """Make the root..x path preferred; x ends as the root of the whole auxiliary tree."""
    prev = -1
    y = x
    while y != -1:
        stack = splay(L, S, y, stack)
        L[y, CH1] = prev
        prev = y
        y = L[y, PAR]
    stack = splay(L, S, x, stack)
    return stack


@njit(cache=True)
def add_position(L, S, x, pos, stack):
    """Count one more end position `pos` on every state of the root..x path."""
    stack = access(L, S, x, stack)
    S[x, CNT] += 1
    L[x, TADD] += 1
    if pos > S[x, LAST]:
        S[x, LAST] = pos
    if pos > L[x, TLAST]:
        L[x, TLAST] = pos
    return stack


@njit(cache=True)
def cut(L, S, x, stack):
    """Detach x (and its subtree) from its parent; x becomes a lone splay root."""
    stack = access(L, S, x, stack)
    left = L[x, CH0]
    if left != -1:
        L[left, PAR] = -1
        L[x, CH0] = -1
    return stack


@njit(cache=True)
def reset_node(L, x, parent):
    L[x, CH0] = -1
    L[x, CH1] = -1
    L[x, PAR] = parent
    L[x, TADD] = 0
    L[x, TLAST] = -1


@njit(cache=True)
def settle(L, S, n):
    """Push every pending tag down to the nodes (O(n)); afterwards S holds true values."""
    stack = np.empty(64, np.int32)
    for r in range(n):
        if not is_splay_root(L, r):
            continue
        k = 0
        stack[k] = r
        k += 1
        while k > 0:
            k -= 1
            x = stack[k]
            push(L, S, x)
            for c in range(2):
                ch = L[x, c]
                if ch != -1:
                    if k == stack.shape[0]:
                        bigger = np.empty(2 * k, np.int32)
                        bigger[:k] = stack[:k]
                        stack = bigger
                    stack[k] = ch
                    k += 1
