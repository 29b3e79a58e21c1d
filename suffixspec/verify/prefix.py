"""`PrefixPool`: the keys and values of token sequences the engine has read, kept for later prompts.

A radix tree over token ids: each node holds a segment of tokens and, per layer, the keys and values
of that segment (tensors [kv heads, n, head dim] on the model's device); a path from the root spells
a token sequence whose cache is the concatenation of its nodes' segments. Contract:

* Only committed tokens enter (`insert` takes a row of a `KVState` after its commit, up to the
  tokens the caller names): never a draft position, never a token past the row's context.
* `match(tokens, limit)` finds the longest cached prefix of `tokens` (at most `limit` tokens, exact
  token equality, any length) and pins its nodes until `PrefixMatch.release`; `fetch` copies its
  keys and values out, so a row never shares storage with the pool and nothing a row does can
  change an entry.
* Bounded in bytes (`max_bytes`): after an insert, least-recently-used unpinned leaves are evicted
  until the pool is within its bound; a sequence larger than the bound is kept only up to it.
  Splitting a node copies both halves, so the bytes counted are the bytes held.
* One pool per engine or generator; not thread-safe (the engine's thread owns it).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import numpy as np

__all__ = ["PrefixPool", "PrefixMatch", "PrefixCounters"]

LayerKV = list  # per layer: (keys [h, n, d], values [h, n, dv])


def _nbytes(kv: LayerKV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


def _packed(kv: LayerKV) -> LayerKV:
    """A copy of `kv` whose tensors are views of one buffer when every layer's keys and values have
    one shape and dtype (one allocation per node: freeing it returns one block, not dozens), else
    copies layer by layer. The pool never holds views of storage it does not own."""
    if not kv:
        return []
    import torch

    first = kv[0][0]
    if all(k.shape == first.shape and v.shape == first.shape and k.dtype == first.dtype == v.dtype
           and k.device == first.device == v.device for k, v in kv):
        buf = torch.stack([t for pair in kv for t in pair]).view(len(kv), 2, *first.shape)  # (one copy op)
        return [(buf[layer, 0], buf[layer, 1]) for layer in range(len(kv))]
    return [(k.clone(), v.clone()) for k, v in kv]


def _slice(kv: LayerKV, start: int, end: int) -> LayerKV:
    """A packed copy of slots start..end of every layer."""
    return _packed([(k[:, start:end], v[:, start:end]) for k, v in kv])


class _Node:
    __slots__ = ("tokens", "kv", "children", "parent", "used", "pins", "nbytes")

    def __init__(self, tokens: np.ndarray, kv: LayerKV, parent: _Node | None, used: int):
        self.tokens = tokens  # int64[n]
        self.kv = kv
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.used = used  # the pool's clock at the last match or insert through this node
        self.pins = 0  # live matches through this node
        self.nbytes = _nbytes(kv)


@dataclass
class PrefixMatch:
    """A cached prefix of `length` tokens: (node, tokens used of it) along the path. Pinned until released."""

    length: int
    path: list = field(default_factory=list)
    released: bool = False

    def release(self) -> None:
        if not self.released:
            for node, _ in self.path:
                node.pins -= 1
            self.released = True


@dataclass
class PrefixCounters:
    """What the pool has done since it was made."""

    hit_tokens: int = 0  # prompt tokens whose keys and values came from the pool
    miss_tokens: int = 0  # prompt tokens the model read
    evictions: int = 0  # nodes evicted
    inserted_tokens: int = 0  # tokens whose keys and values were copied in


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two int arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class PrefixPool:
    """The radix tree of cached keys and values (see the module docstring); `max_bytes` > 0."""

    def __init__(self, max_bytes: int):
        if int(max_bytes) <= 0:
            raise ValueError(f"max_bytes: expected a positive number of bytes, got {max_bytes!r}")
        self.max_bytes = int(max_bytes)
        self.root = _Node(np.zeros(0, np.int64), [], None, 0)
        self.nbytes = 0
        self.counters = PrefixCounters()
        self._clock = itertools.count(1)

    # ---------------------------------------------------------------------------------- lookup

    def match(self, tokens, limit: int | None = None) -> PrefixMatch:
        """The longest cached prefix of `tokens[:limit]`, pinned (release it when done)."""
        ids = np.asarray(tokens, np.int64)
        if limit is not None:
            ids = ids[: max(0, int(limit))]
        found = PrefixMatch(0)
        node, i, now = self.root, 0, next(self._clock)
        while i < len(ids):
            child = node.children.get(int(ids[i]))
            if child is None:
                break
            n = _common(child.tokens, ids[i:])
            child.pins += 1
            child.used = now
            found.path.append((child, n))
            i += n
            if n < len(child.tokens):
                break
            node = child
        found.length = i
        return found

    @staticmethod
    def fetch(found: PrefixMatch) -> LayerKV:
        """The keys and values of a match: per layer, new tensors [h, length, d] (empty list: length 0)."""
        if found.released:
            raise RuntimeError("fetch: the match was released")
        if not found.path:
            return []
        import torch

        layers = len(found.path[0][0].kv)
        out = []
        for layer in range(layers):
            keys = [node.kv[layer][0][:, :n] for node, n in found.path]
            values = [node.kv[layer][1][:, :n] for node, n in found.path]
            out.append((torch.cat(keys, 1), torch.cat(values, 1)))
        return out

    # ---------------------------------------------------------------------------------- insert

    def insert(self, tokens, kv_of) -> int:
        """Keep the keys and values of `tokens`; `kv_of(start, end)` gives those of tokens start..end
        (per layer [h, end - start, d]; views are fine, the pool copies them) and is called only for
        the part the pool lacks. Returns the tokens newly copied in."""
        ids = np.asarray(tokens, np.int64)
        node, i, now = self.root, 0, next(self._clock)
        while i < len(ids):
            child = node.children.get(int(ids[i]))
            if child is None:
                break
            n = _common(child.tokens, ids[i:])
            child.used = now
            if n < len(child.tokens):
                child = self._split(child, n)
            i += n
            node = child
        if i >= len(ids):
            return 0
        kv = kv_of(i, len(ids))
        per_token = _nbytes(kv) // (len(ids) - i) if kv else 0
        if per_token <= 0:
            return 0
        end = min(len(ids), i + self.max_bytes // per_token)  # what a pool of this size can hold at all
        if end <= i:
            return 0
        if end < len(ids):
            kv = [(k[:, : end - i], v[:, : end - i]) for k, v in kv]
        leaf = _Node(ids[i:end].copy(), _packed(kv), node, now)
        node.children[int(ids[i])] = leaf
        self.nbytes += leaf.nbytes
        self.counters.inserted_tokens += end - i
        leaf.pins += 1  # the new leaf is the last thing evicted by its own insert
        try:
            self._evict()
        finally:
            leaf.pins -= 1
        return end - i

    def _split(self, node: _Node, n: int) -> _Node:
        """Cut `node` after its first `n` tokens (0 < n < len); returns the new upper node."""
        parent = node.parent
        upper = _Node(node.tokens[:n].copy(), _slice(node.kv, 0, n), parent, node.used)
        upper.pins = node.pins
        lower_kv = _slice(node.kv, n, len(node.tokens))
        self.nbytes += upper.nbytes + _nbytes(lower_kv) - node.nbytes
        node.tokens, node.kv, node.parent = node.tokens[n:].copy(), lower_kv, upper
        node.nbytes = _nbytes(lower_kv)
        upper.children[int(node.tokens[0])] = node
        parent.children[int(upper.tokens[0])] = upper
        return upper

    # ---------------------------------------------------------------------------------- eviction

    def _evict(self) -> None:
        """Least-recently-used unpinned leaves go until the pool is within its bound."""
        if self.nbytes <= self.max_bytes:
            return
        heap = [(leaf.used, id(leaf), leaf) for leaf in self._leaves() if leaf.pins == 0]
        heapq.heapify(heap)
        while self.nbytes > self.max_bytes and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[int(leaf.tokens[0])]
            self.nbytes -= leaf.nbytes
            self.counters.evictions += 1
            leaf.kv, leaf.parent = [], None
            if parent is not self.root and not parent.children and parent.pins == 0:
                heapq.heappush(heap, (parent.used, id(parent), parent))

    def _leaves(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                yield node

    def clear(self) -> None:
        """Drop every unpinned entry."""
        bound, self.max_bytes = self.max_bytes, 0
        try:
            self._evict()
        finally:
            self.max_bytes = bound

    @property
    def tokens(self) -> int:
        """Tokens held (every node's segment)."""
        total, stack = 0, list(self.root.children.values())
        while stack:
            node = stack.pop()
            total += len(node.tokens)
            stack.extend(node.children.values())
        return total
