"""Whole builds: the frozen automaton over a list of documents in one kernel call.

Contract: `build_frozen(tokens, starts)` returns exactly the arrays that
`SuffixAutomaton.add_document` over each document tokens[starts[i]:starts[i + 1]] (the last one
running to the end), then `freeze()`, `kernel_arrays()` and `edge_records()` give: the same
states in the same order, the same edges, counts and last end positions. It runs the same code
(`sam.extend` per document from the last state reset to the root, as `start_document` does,
then `sam.accumulate`, `sam_freeze.to_csr`, `sam_freeze.state_columns` and `frozen.edge_records`), only
without a Python round trip per document and with the arrays sized for all the tokens up front
(capacities never change the result). `extend_frozen` returns the same arrays given the frozen
automaton over the first documents: it thaws that one (`sam_freeze.thaw`, a pass over its arrays) and
adds only the later documents. Inputs are checked first by `check_documents` and `layout_ok`; the
caller (`FrozenAutomaton.from_documents`) raises on a bad one. `documents_automaton` stops
before accumulating and freezing, and also records each position's prefix state
(`sam.extend_recording`): the reference the corpus shards' row builder (bulk_sam.py) is tested
against.

Arrays: `tokens` int32[n] (token ids, every one >= 0), `starts` int64[d] (0 first, strictly
increasing, each below n; [0] when n is 0).
"""

import numpy as np
from numba import njit

from . import frozen as fk
from . import sam as sk
from . import sam_freeze as sfk

DOCS_OK, DOCS_NEGATIVE_TOKEN, DOCS_BAD_STARTS = 0, 1, 2


@njit(cache=True, nogil=True)
def check_documents(tokens, starts):
    """DOCS_OK, or what is wrong with (tokens, starts) (see the module docstring)."""
    n = tokens.shape[0]
    for i in range(n):
        if tokens[i] < 0:
            return DOCS_NEGATIVE_TOKEN
    d = starts.shape[0]
    if d == 0 or starts[0] != 0:
        return DOCS_BAD_STARTS
    if n == 0:
        return DOCS_OK if d == 1 else DOCS_BAD_STARTS
    for i in range(1, d):
        if starts[i] <= starts[i - 1]:
            return DOCS_BAD_STARTS
    if starts[d - 1] >= n:
        return DOCS_BAD_STARTS
    return DOCS_OK


@njit(cache=True, nogil=True)
def layout_ok(links, lens, counts, lasts, offsets, etok, eto, n_tokens):
    """Whether the frozen arrays are a layout `sam_freeze.thaw` can follow: every array its length, the
    root first (link -1, length 0), every other state's suffix link to a shorter state (so links
    end at the root) and no state longer than the n_tokens tokens, edge offsets increasing from 0
    to the edge count, targets among the states."""
    n = links.shape[0]
    m = etok.shape[0]
    if n == 0 or lens.shape[0] != n or counts.shape[0] != n or lasts.shape[0] != n:
        return False
    if offsets.shape[0] != n + 1 or eto.shape[0] != m or offsets[0] != 0 or offsets[n] != m:
        return False
    if links[0] != -1 or lens[0] != 0:
        return False
    for v in range(n):
        if offsets[v + 1] < offsets[v]:
            return False
        if v > 0 and not (0 <= links[v] < n and lens[links[v]] < lens[v] <= n_tokens):
            return False
    for k in range(m):
        if not 0 <= eto[k] < n:
            return False
    return True


@njit(cache=True, nogil=True)
def _add_documents(S, E, H, M, tokens, starts, first, P):
    """Add the documents first.. of (tokens, starts) to the bulk-mode automaton (S, E, H, M) over
    the ones before (P: each position's prefix state, see `sam.extend_recording`): (S, E, H, T, M),
    T the tokens. CNT and LAST still hold each state's own positions."""
    n = tokens.shape[0]
    T = np.empty(n, np.int32)  # exactly the tokens: extend never grows it
    T[:] = tokens
    L = np.empty((0, sk.L_COLS), np.int32)
    stack = np.empty(64, np.int32)
    d = starts.shape[0]
    for i in range(first, d):
        a = starts[i]
        b = starts[i + 1] if i + 1 < d else n
        M[sk.LAST_STATE] = 0  # start_document
        S, E, H, T, L, stack = sk.extend_recording(S, E, H, T, L, M, tokens[a:b], stack, P)
    return S, E, H, T, M


@njit(cache=True, nogil=True)
def _frozen(S, E, H, M, tokens, starts, first):
    """Add the documents first.. of (tokens, starts) to the bulk-mode automaton (S, E, H, M) over
    the ones before, then the arrays `build_frozen` returns."""
    n = tokens.shape[0]
    S, E, H, T, M = _add_documents(S, E, H, M, tokens, starts, first, np.empty(0, np.int32))
    sk.accumulate(S, M)
    offsets, etok, eto = sfk.to_csr(S, E, M)
    links, lens, counts, lasts = sfk.state_columns(S, M)
    # edge rows are int32 ids, so every offset fits int32
    offsets32 = offsets.astype(np.int32)
    records = fk.edge_records(etok, eto, counts, np.empty(0, np.int32), lasts, 0)
    return links, lens, counts, lasts, offsets, etok, eto, T[:n], starts.copy(), offsets32, records


@njit(cache=True, nogil=True)
def _empty(n):
    """(S, E, H, M): the bulk-mode automaton with the root only, with room for n tokens."""
    # a generalized automaton over n tokens has at most 2n states and about 3n edges
    return _root(np.empty((2 * n + 2, sk.STATE_COLS), np.int32), np.empty((3 * n + 16, sk.E_COLS), np.int32))


@njit(cache=True, nogil=True)
def _root(S, E):
    """(S, E, H, M): the bulk-mode automaton with the root only, in the given S and E."""
    S[0, sk.LINK] = -1
    S[0, sk.LEN] = 0
    S[0, sk.HEAD] = -1
    S[0, sk.CNT] = 0
    S[0, sk.LAST] = -1
    S[0, sk.DEG] = 0
    H = np.full(32, -1, np.int32)
    M = np.zeros(sk.META, np.int64)
    M[sk.N_STATES] = 1
    return S, E, H, M


@njit(cache=True, nogil=True)
def build_frozen(tokens, starts):
    """(links, lens, counts, lasts, offsets, etok, eto, tokens, doc_starts, offsets32, records):
    the fields of the `FrozenAutomaton` over the documents (`offsets` int64, as `freeze()` gives),
    then the int32 copy of `offsets` that its `kernel_arrays()` holds and its `edge_records()`.
    The inputs must pass `check_documents`."""
    S, E, H, M = _empty(tokens.shape[0])
    return _frozen(S, E, H, M, tokens, starts, 0)


def documents_automaton(tokens, starts, P):
    """(S, E, M): the automaton `build_frozen` freezes (MODE_BULK layout, see sam.py), for a caller
    that freezes it into arrays of its own (`sam_freeze.freeze_into`, `sam_freeze.implicit_ids`),
    with P int32[len(tokens)] filled with each position's prefix state (the state of its
    whole document prefix). CNT and LAST are not accumulated: they hold each state's own
    positions (the counts follow from P, `corpus_build.build_occurrences`). The inputs must pass
    `check_documents`. S and E are numpy's: numpy marks large allocations for transparent huge
    pages (numba's allocator does not), and the construction's random accesses over them then
    miss the TLB far less."""
    n = tokens.shape[0]
    S = np.empty((2 * n + 2, sk.STATE_COLS), np.int32)
    E = np.empty((3 * n + 16, sk.E_COLS), np.int32)
    return _documents_automaton(S, E, tokens, starts, P)


@njit(cache=True, nogil=True)
def _documents_automaton(S, E, tokens, starts, P):
    S, E, H, M = _root(S, E)
    S, E, H, T, M = _add_documents(S, E, H, M, tokens, starts, 0, P)
    return S, E, M


@njit(cache=True, nogil=True)
def extend_frozen(links, lens, counts, lasts, offsets, etok, eto, tokens, starts, first):
    """`build_frozen(tokens, starts)`, given the frozen arrays (`layout_ok`) of the automaton over
    the first `first` documents (1 <= first <= len(starts)): thawed (`sam_freeze.thaw`), not rebuilt,
    then the later documents added."""
    n = tokens.shape[0]
    done = starts[first] if first < starts.shape[0] else n
    more = n - done
    S, E, H, M = sfk.thaw(links, lens, counts, lasts, offsets, etok, eto, done, 2 * more + 2, 3 * more + 16)
    return _frozen(S, E, H, M, tokens, starts, first)
