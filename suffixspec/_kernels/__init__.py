"""Numba kernels: plain `@njit(cache=True)` functions over flat arrays, no classes.

Modules: `lct` (link-cut tree keeping suffix-link-tree path aggregates exact online),
`sam` (the growable suffix automaton: extension and queries), `frozen` (queries over the
compact read-only CSR layout, bounds-checked so damaged arrays cannot crash the process).
Their caches are keyed by all the kernel modules' sources together (`cachestamp`).
"""

from . import cachestamp

cachestamp.install()  # before any kernel module decorates its functions
