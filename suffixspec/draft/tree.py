"""`DraftTree`: candidate continuations sharing prefixes, as flat arrays, plus what a verifier
derives from them.

Terms: the tree hangs below the last committed token (its implicit root). Node i drafts token
`tokens[i]` after its parent `parents[i]` (-1: the implicit root). `depths[i]` is 1 for the
root's children. Nodes are in topological order (a parent's index is below its children's);
siblings carry distinct tokens and are sorted by descending score. `scores[i]` estimates the
probability that the whole path to node i is accepted, so `scores.sum()` is the expected number
of accepted draft tokens and a child never scores above its parent.
"""

from __future__ import annotations

import numpy as np

from .._kernels.sizing import prune_keep
from ..errors import BadInputError
from ..tokenids import as_tokens


class DraftTree:
    __slots__ = ("tokens", "parents", "depths", "scores")

    def __init__(self, tokens, parents, scores=None):
        tokens = as_tokens(tokens, "tokens")
        parents = np.asarray(parents, dtype=np.int64)
        n = tokens.shape[0]
        if parents.shape != (n,):
            raise BadInputError(f"parents: expected shape ({n},) like tokens, got {parents.shape}")
        scores = np.ones(n) if scores is None else np.asarray(scores, dtype=np.float64)
        if scores.shape != (n,):
            raise BadInputError(f"scores: expected shape ({n},) like tokens, got {scores.shape}")
        idx = np.arange(n)
        if n and (np.any(parents < -1) or np.any(parents >= idx)):
            bad = int(idx[(parents < -1) | (parents >= idx)][0])
            raise BadInputError(f"parents: expected -1 or an earlier node index, node {bad} has parent {int(parents[bad])}")
        depths = np.empty(n, np.int32)
        for i in range(n):
            depths[i] = 1 if parents[i] < 0 else depths[parents[i]] + 1
        seen = set()
        for i in range(n):
            key = (int(parents[i]), int(tokens[i]))
            if key in seen:
                raise BadInputError(f"tokens: siblings must be distinct, token {key[1]} repeats under parent {key[0]}")
            seen.add(key)
        self.tokens = tokens                      # int32[n]
        self.parents = parents.astype(np.int32)   # int32[n]
        self.depths = depths                      # int32[n]
        self.scores = scores                      # float64[n]

    @staticmethod
    def unchecked(tokens, parents, depths, scores) -> DraftTree:
        """Wrap arrays already known valid (built by the proposer kernels or taken from a valid tree):
        no checks, for hot paths. `tokens`/`parents`/`depths` int32[n], `scores` float64[n]."""
        tree = _new(DraftTree)
        tree.tokens = tokens
        tree.parents = parents
        tree.depths = depths
        tree.scores = scores
        return tree

    @classmethod
    def empty(cls) -> DraftTree:
        """The empty tree: one shared instance over read-only arrays (proposers return it often)."""
        return _EMPTY

    @classmethod
    def from_paths(cls, paths, scores=None) -> DraftTree:
        """Merge token sequences into a tree (shared prefixes become shared nodes).

        `scores`, one per path, default 1; a node scores the largest score of the paths through it.
        """
        tokens, parents, node_scores = [], [], []
        index: dict[tuple[int, int], int] = {}
        for k, path in enumerate(paths):
            s = 1.0 if scores is None else float(scores[k])
            parent = -1
            for tok in as_tokens(path, "path").tolist():
                key = (parent, tok)
                node = index.get(key)
                if node is None:
                    node = len(tokens)
                    index[key] = node
                    tokens.append(tok)
                    parents.append(parent)
                    node_scores.append(s)
                else:
                    node_scores[node] = max(node_scores[node], s)
                parent = node
        return cls(np.array(tokens, np.int64), np.array(parents, np.int64), np.array(node_scores))

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def expected_accepted(self) -> float:
        return float(self.scores.sum())

    @property
    def max_depth(self) -> int:
        return int(self.depths.max()) if len(self) else 0

    def children(self, node: int) -> np.ndarray:
        """Indices of the children of `node` (-1: the implicit root), in sibling (score) order."""
        return np.flatnonzero(self.parents == node)

    def leaves(self) -> np.ndarray:
        is_parent = np.zeros(len(self), bool)
        is_parent[self.parents[self.parents >= 0]] = True
        return np.flatnonzero(~is_parent)

    def path_to(self, node: int) -> np.ndarray:
        """Node indices from a root child down to `node`."""
        out = []
        while node >= 0:
            out.append(node)
            node = int(self.parents[node])
        return np.array(out[::-1], np.int64)

    def paths(self) -> list[np.ndarray]:
        """Root-to-leaf node-index paths."""
        return [self.path_to(int(leaf)) for leaf in self.leaves()]

    def ancestor_mask(self) -> np.ndarray:
        """bool[n, n]: mask[i, j] is True iff node j is node i or one of its ancestors."""
        n = len(self)
        mask = np.zeros((n, n), bool)
        for i in range(n):
            p = int(self.parents[i])
            if p >= 0:
                mask[i] = mask[p]
            mask[i, i] = True
        return mask

    def longest_accepted(self, target) -> int:
        """Node index ending the longest root path that equals a prefix of `target` (-1: none)."""
        target = as_tokens(target, "target").tolist()
        node, depth = -1, 0
        while depth < len(target):
            nxt = -1
            for c in self.children(node):
                if self.tokens[c] == target[depth]:
                    nxt = int(c)
                    break
            if nxt < 0:
                break
            node, depth = nxt, depth + 1
        return node

    def __repr__(self):
        return f"DraftTree(nodes={len(self)}, depth={self.max_depth}, expected_accepted={self.expected_accepted:.2f})"


_new = object.__new__


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


_EMPTY = DraftTree.unchecked(*(_read_only(np.empty(0, t)) for t in (np.int32, np.int32, np.int32, np.float64)))


def prune_tree(tree: DraftTree, size: int, max_depth: int) -> DraftTree:
    """The best `size` nodes of `tree` by score (a closed subtree) no deeper than `max_depth`."""
    n = len(tree)
    if n == 0 or size <= 0 or max_depth <= 0:
        return DraftTree.empty()
    if n <= size and int(tree.depths.max()) <= max_depth:
        return tree
    idx, parents = prune_keep(tree.scores, tree.parents, tree.depths, int(size), int(max_depth))
    # a subset closed under parents, in the original order: still topological, siblings distinct and sorted
    return DraftTree.unchecked(tree.tokens[idx], parents, tree.depths[idx], tree.scores[idx])


def subtree(tree: DraftTree, keep: np.ndarray) -> DraftTree:
    """The nodes of `tree` where `keep` (bool[n], closed under parents: a kept node's parent is kept)."""
    idx = np.flatnonzero(keep)
    remap = np.full(len(tree), -1, np.int64)
    remap[idx] = np.arange(len(idx))
    old = tree.parents[idx]
    parents = np.where(old < 0, -1, remap[np.maximum(old, 0)]).astype(np.int32)
    if np.any((old >= 0) & (parents < 0)):
        raise BadInputError("subtree: expected a node set closed under parents")
    return DraftTree.unchecked(tree.tokens[idx], parents, tree.depths[idx], tree.scores[idx])
