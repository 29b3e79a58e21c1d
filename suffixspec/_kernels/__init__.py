"""Numba kernels: plain `@njit(cache=True)` functions over flat arrays, no classes.

Modules: `lct` (link-cut tree keeping suffix-link-tree path aggregates exact online),
`sam` (the growable suffix automaton's arrays and their construction), `sam_query` (its match,
count and edge queries), `sam_freeze` (to and from the frozen layout), `frozen` (queries over the
compact read-only CSR layout, bounds-checked so damaged arrays cannot crash the process),
`follow` (advancing a match by one token, over either layout), `build` (a frozen layout over many
documents in one call, or a frozen layout extended by more documents), `corpus_build` and
`corpus_query` (a corpus shard's occurrence layout and its document-restricted queries), and the
drafting, sizing, learning and addressing kernels.
Their caches are keyed by all the kernel modules' sources together (`cachestamp`).
"""

from . import cachestamp

cachestamp.install()  # before any kernel module decorates its functions
