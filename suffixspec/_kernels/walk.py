"""Forward walks from the root: how long a prefix of a pattern occurs in the text.

Used by the copy-oracle of the simulator. `prefix_live` reads the growable layout (no counts
needed, so it never touches the link-cut tree); `prefix_frozen` the frozen one.
"""

from numba import njit

from . import frozen as fk
from . import sam as sk
from .address import borrowed


@njit(cache=True, nogil=True)
def prefix_live(S, E, H, pattern):
    state = 0
    for j in range(pattern.shape[0]):
        state = sk.transition(S, E, H, state, pattern[j])
        if state == -1:
            return j
    return pattern.shape[0]


@njit(cache=True, nogil=True)
def prefix_frozen(offsets, etok, eto, tokens, plink, pattern):
    state = 0
    o, et, ed, tx, pl = borrowed(offsets), borrowed(etok), borrowed(eto), borrowed(tokens), borrowed(plink)
    for j in range(pattern.shape[0]):
        state = fk.transition(o, et, ed, tx, pl, state, pattern[j])
        if state < 0:
            return j
    return pattern.shape[0]
