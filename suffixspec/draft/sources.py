"""The sources a proposer's sessions read besides their own text.

- `corpus_sources(corpus)`: what `Proposer(corpus=...)` accepts (frozen or growable automata,
  corpus indexes, or a list of them), flattened into frozen automata and corpus indexes; anything
  else is a `BadInputError` naming what came.
- `RestrictedSource`: a corpus index queried within a document subset (a filter, or past deleted
  documents), drafting linear chains from the index instead of walking its automata.
- `Sources`: one immutable snapshot of the frozen automata in kernel order (the corpora's, then one
  cache version's generations), with each row's source class and the kernels' address tables; it
  holds every array those tables point to for as long as it lives.
"""

from __future__ import annotations

import numpy as np

from .._kernels import draft as dk
from .._kernels import frozen as fk
from .._kernels import learn as lk
from ..errors import BadInputError
from .automaton import FrozenAutomaton, SuffixAutomaton

__all__ = ["RestrictedSource", "Sources", "corpus_sources"]


def corpus_sources(corpus) -> list:
    """Flatten `corpus` into FrozenAutomaton and corpus-index entries."""
    if corpus is None:
        return []
    items = corpus if isinstance(corpus, (list, tuple)) else [corpus]
    out = []
    for item in items:
        if isinstance(item, SuffixAutomaton):
            out.append(item.freeze())
        elif isinstance(item, FrozenAutomaton):
            out.append(item)
        elif hasattr(item, "shards") and hasattr(item, "query") and hasattr(item, "subset"):
            out.append(item)
        else:
            raise BadInputError(f"corpus: expected a FrozenAutomaton, SuffixAutomaton or CorpusIndex, got {type(item).__name__}", param="corpus")
    return out


class RestrictedSource:
    """A corpus index queried within a document subset (or past deleted documents).

    Each round asks the index for the longest match of the last `window` context tokens within
    the subset, then drafts linear chains: for each of the best continuations, the text that
    followed its most recent selected occurrence. Slower than the automaton walk of an
    unrestricted source, and matches are capped at `window` tokens.
    """

    window = 256

    def __init__(self, index, subset):
        self.index = index
        self.subset = subset

    def candidates(self, context: np.ndarray, budget: int, params, min_match: int):
        m = self.index.query(context[-self.window :], self.subset)
        if m.length < min_match or len(m) == 0:
            return None
        total = float(m.counts.sum())
        recent = int(np.argmax(m.last_ends))
        rec = params[dk.P_RECENCY]
        prior = params[dk.P_MATCH_PRIOR]
        weights = m.counts.astype(np.float64) + np.where(np.arange(len(m)) == recent, rec * total, 0.0)
        order = np.argsort(-weights, kind="stable")[: int(params[dk.P_MAX_CHILDREN])]
        toks, pars, probs = [], [], []
        for i in order:
            p = weights[i] / (total * (1 + rec)) * m.length / (m.length + prior)
            if p < params[dk.P_MIN_PROB]:
                break
            chain = [int(m.tokens[i])] + self.index.following(int(m.last_ends[i]), budget - 1).tolist()
            length, parent = m.length + 1, -1
            for t in chain:
                if p < params[dk.P_MIN_PROB] or len(toks) >= budget * 2:
                    break
                toks.append(t)
                pars.append(parent)
                probs.append(p)
                parent = len(toks) - 1
                p *= length / (length + prior)
                length += 1
        return (np.array(toks, np.int32), np.array(pars, np.int32), np.array(probs, np.float64))


class Sources:
    """The frozen sources sessions read, in kernel order: the corpus automata (and every shard of
    every corpus index), then the past-response generations of one cache version. Immutable; a new
    one is built when the cache changes."""

    def __init__(self, static: list[FrozenAutomaton], version: int, cached: list[tuple[int, FrozenAutomaton]],
                 tops_of):
        self.version = version
        self.n_static = len(static)
        self.automata = list(static) + [a for _, a in cached]
        self.generations = [None] * len(static) + [g for g, _ in cached]
        # each row's source class (lk.CLS_*), as the kernels read it
        self.classes = np.array([lk.CLS_CORPUS] * len(static) + [lk.CLS_CACHE] * len(cached), np.int64)
        # the kernels read the sources through raw addresses: self.held keeps their arrays alive
        self.held = [fa.kernel_arrays() + (fa.edge_records(),) + fa.implicit_arrays() for fa in self.automata]
        self.table = fk.source_table(self.held)
        # each source's best children of its states with many (fk.top_children), or None
        self.held_tops = [tops_of(fa) for fa in self.automata]
        self.tops = fk.top_table(self.held_tops)
