"""The batch's KV state: one forward pass over every row's pending tokens and draft tree, and the
commit that keeps what acceptance (`accept.py`) chose.

Terms (used the same way everywhere in suffixspec):

* committed: tokens that are part of a request's output for good. pending: committed tokens whose
  keys/values are not yet in the KV cache (the whole prompt before the first pass, afterwards
  exactly one: the previous round's bonus); the last pending token is the root of the draft tree.
* draft: the nodes of a request's `DraftTree`; accepted: drafted nodes whose token equals the
  target's choice at their parent; bonus: the target's own token where the walk stops.

Contract:

* `KVState.forward` feeds, per row, ``[pad..] [pending..] [draft nodes..]`` (left padded to a common
  width), positions from the row's committed length and the node depths, and an additive float mask
  ``(batch, 1, new, cached + new)``: a pending token sees the valid cache slots and the earlier
  pending tokens, a node also its ancestors only, a pad only itself; sliding-window layers get one
  mask per layer type, the window applied on logical positions. `PassLayout` records where the
  inputs sat.
* `KVState.commit` keeps only the pending tokens and the accepted nodes, compacted to the front of the
  round's tail; rejected branches never reach a later pass and the prefix is never recomputed.
  Slots are tracked per row (`slot_pos`, -1 a hole); holes are masked and squeezed out past a
  quarter of the cache. While no row has a hole the cache is dense: no slot tensor, and a
  one-token step or a prefill uses the model's own causal mask.
* Devices: every tensor of a pass lives on the model's device; the host sends one int64 buffer per
  pass or commit, the mask is built on the device (`treemask.ancestor_closure`), and neither waits
  for the device (a `meta`-device model runs them). On CUDA a masked pass runs SDPA on the
  memory-efficient kernel (`treemask.TREE_SDPA_BACKENDS`).
* `check_tree_logits(model)`: a tree pass against sequential passes on a short input.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from ..draft.tree import DraftTree
from ..errors import InternalError
from .support import accepts_logits_to_keep, cache_argument, layer_types
from .treemask import ancestor_closure, tree_sdpa

__all__ = ["KVState", "PassLayout", "check_tree_logits"]



def _append(view: torch.Tensor, buf: torch.Tensor | None, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`view` [b, h, n, d] followed by `new` [b, h, k, d], as a prefix view of a buffer with spare room.

    Appends in place when `view` is still the prefix view of `buf` (cropping keeps it one, in-place
    rewrites too) and `buf` has room; otherwise (first call, rows or slots regathered) copies into a
    new buffer with room for a quarter more, at least 256 slots. Returns (new view, its buffer)."""
    n = view.shape[2] if view.dim() == 4 else 0
    k = new.shape[2]
    if (buf is not None and n and view.data_ptr() == buf.data_ptr() and view.stride() == buf.stride()
            and view.shape[:2] == buf.shape[:2] and view.shape[3] == buf.shape[3] and new.shape[:2] == buf.shape[:2]
            and n + k <= buf.shape[2]):
        buf[:, :, n : n + k] = new
        return buf[:, :, : n + k], buf
    b, h, _, d = new.shape
    buf = new.new_empty((b, h, n + k + max(256, (n + k) // 4), d))
    if n:
        buf[:, :, :n] = view
    buf[:, :, n : n + k] = new
    return buf[:, :, : n + k], buf


@functools.lru_cache(maxsize=None)
def _growing_layer_class():
    from transformers.cache_utils import DynamicLayer

    class _GrowingLayer(DynamicLayer):
        """A `DynamicLayer` whose `keys`/`values` [b, h, n, d] are prefix views of buffers with spare room.

        While `keys`/`values` are still the very views the last update returned (nothing cropped,
        regathered or replaced them since: any of those assigns new tensors), the next update writes
        into the buffers' room after checking only shapes kept as plain ints (`_grown`: b, kv heads,
        key and value widths, length, room); otherwise `_append` checks the views against the buffers."""

        _kbuf = _vbuf = _klast = _vlast = None
        _grown = (0, 0, 0, 0, 0, 0, 0, 0)  # key buffer b, h, d; value buffer b, h, d; length; room

        def update(self, key_states, value_states, *args, **kwargs):
            keys, values = self.keys, self.values
            if keys is not None and keys is self._klast and values is self._vlast:
                ks, vs = key_states.shape, value_states.shape
                kb, kh, kd, vb, vh, vd, n, room = self._grown
                k = ks[2]
                if (n + k <= room and ks[0] == kb and ks[1] == kh and ks[3] == kd and vs[0] == vb and vs[1] == vh
                        and vs[2] == k and vs[3] == vd):
                    self._kbuf[:, :, n : n + k] = key_states
                    self._vbuf[:, :, n : n + k] = value_states
                    self.keys = self._klast = self._kbuf[:, :, : n + k]
                    self.values = self._vlast = self._vbuf[:, :, : n + k]
                    self._grown = (kb, kh, kd, vb, vh, vd, n + k, room)
                    return self.keys, self.values
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            self.keys, self._kbuf = _append(self.keys, self._kbuf, key_states)
            self.values, self._vbuf = _append(self.values, self._vbuf, value_states)
            self._klast, self._vlast = self.keys, self.values
            kb, vb = self._kbuf.shape, self._vbuf.shape
            self._grown = (kb[0], kb[1], kb[3], vb[0], vb[1], vb[3], self.keys.shape[2], min(kb[2], vb[2]))
            return self.keys, self.values

        def crop_to(self, length: int) -> None:
            """Keep the first `length` slots (a shorter cache is left as it is), staying on the fast path."""
            if self.keys is None or self.keys is not self._klast or self.values is not self._vlast:
                if self.keys is not None and self.keys.numel() and self.keys.shape[2] > length:
                    self.keys, self.values = self.keys[:, :, :length], self.values[:, :, :length]
                return
            *shape, n, room = self._grown
            if n > length:
                self.keys = self._klast = self._kbuf[:, :, :length]
                self.values = self._vlast = self._vbuf[:, :, :length]
                self._grown = (*shape, length, room)

    return _GrowingLayer


@dataclass(frozen=True)
class PassLayout:
    """Where each row's inputs sit in the last pass (`KVState.forward`), for `KVState.commit`."""

    width: int  # W: inputs per row, padding included
    offsets: np.ndarray  # int64[b]: pads before the row's first pending token
    pending: np.ndarray  # int64[b]: pending tokens per row
    nodes: np.ndarray  # int64[b]: draft nodes per row

    plain: bool  # no drafts and no pads: every new slot stays where the pass wrote it

    @classmethod
    def of(cls, width: int, offsets: np.ndarray, pending: np.ndarray, nodes: np.ndarray) -> PassLayout:
        return cls(width, offsets, pending, nodes, not nodes.any() and not offsets.any())


class KVState:
    """The batch's KV cache plus per-request slot bookkeeping (see the module docstring)."""

    def __init__(self, model, batch_size: int):
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache()  # no config: every layer keeps all its slots, we mask them
        if getattr(self.cache, "layer_class_to_replicate", None) is not None:
            self.cache.layer_class_to_replicate = _growing_layer_class()
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        # slot_pos [b, L] as a tensor, or None while it is dense: every row's slot i holds position i
        # (no holes), which one-token steps keep without touching it
        self._pos: torch.Tensor | None = None
        self._len = 0  # L
        # logical tokens in the cache, per row: always exactly the row's valid (>= 0) slots, so the
        # cache is dense exactly when every row has L of them
        self.n_cached = np.zeros(batch_size, np.int64)
        self._cache_arg = cache_argument(model)
        self._logits_to_keep = accepts_logits_to_keep(model)
        self._types, self._window = layer_types(model.config)
        self._sliding = "sliding_attention" in (self._types or ())
        self._last: PassLayout | None = None  # the last pass, until it is committed
        self._step_layout: PassLayout | None = None  # the one-token step's (read-only arrays)

    @property
    def batch_size(self) -> int:
        return int(self.n_cached.shape[0])

    @property
    def cache_len(self) -> int:
        return self._len

    @property
    def slot_pos(self) -> torch.Tensor:
        """int64[b, L]: the logical position each slot holds, -1 for a hole (of a dense cache: a new
        tensor, the cache stays dense)."""
        if self._pos is None:
            return torch.arange(self._len, device=self.device).expand(self.batch_size, self._len).contiguous()
        return self._pos

    @slot_pos.setter
    def slot_pos(self, value: torch.Tensor) -> None:
        self._pos, self._len = value, int(value.shape[1])

    def _maybe_dense(self) -> None:
        """Drop the slot tensor once no row has a hole (then slot i of every row holds position i:
        a row's slots keep their positions in order)."""
        if self._pos is not None and bool((self.n_cached == self._len).all()):
            self._pos = None

    # -------------------------------------------------------------------------------- forward pass

    @torch.inference_mode()
    def forward(self, pending: list[list[int]], trees: list[DraftTree]) -> tuple[torch.Tensor, np.ndarray]:
        """One pass over every row's pending tokens and draft tree.

        Returns `logits` [b, K, vocab] (float32) and `root_index` int[b]: row r's logits after its
        last pending token are `logits[r, root_index[r]]`, after its draft node i
        `logits[r, root_index[r] + 1 + i]`.
        """
        b = self.batch_size
        if len(pending) != b or len(trees) != b:
            raise InternalError(f"forward: expected {b} rows of pending tokens and trees, got {len(pending)} and {len(trees)}")
        if self._last is not None:
            raise InternalError("forward: the previous pass was not committed")
        if self._pos is None and not self._sliding and not any(len(t) for t in trees):
            width = len(pending[0]) if b else 0
            if self._len and width == 1 and all(len(x) == 1 for x in pending):
                return self._step([x[0] for x in pending])
            if width and all(len(x) == width for x in pending):
                return self._causal(pending, width)
        p = np.array([len(x) for x in pending], np.int64)
        n = np.array([len(t) for t in trees], np.int64)
        if np.any(p < 1):
            raise InternalError("forward: every row needs at least one pending token")
        W = int((p + n).max())
        K = int(n.max()) + 1
        L = self.cache_len
        tokens = np.zeros((b, W), np.int64)  # [b, W]
        positions = np.zeros((b, W), np.int64)  # [b, W]
        parents = np.full((b, W), -1, np.int64)  # [b, W] the input each input follows (-1: none)
        offsets = W - p - n
        longest = 1  # inputs on the longest chain of parents
        for r in range(b):
            off, pr, nr, base = int(offsets[r]), int(p[r]), int(n[r]), int(self.n_cached[r])
            tokens[r, off : off + pr] = pending[r]
            positions[r, :off] = base
            positions[r, off : off + pr] = base + np.arange(pr)
            parents[r, off + 1 : off + pr] = np.arange(off, off + pr - 1)  # pending tokens: a chain
            longest = max(longest, pr)
            if nr:
                tree = trees[r]
                tokens[r, off + pr :] = tree.tokens
                positions[r, off + pr :] = base + pr - 1 + tree.depths
                parents[r, off + pr :] = np.where(tree.parents < 0, off + pr - 1, off + pr + tree.parents)
                longest = max(longest, pr + int(tree.depths.max()))
        dev = self.device
        # the pass's one host-to-device copy; everything below is built on the device
        tokens_t, q_pos, parents_t, offsets_t = self._to_device(tokens, positions, parents, offsets)  # [b, W] x3, [b]
        diag = torch.arange(W, device=dev)  # [W]
        pad = diag[None, :] < offsets_t[:, None]  # [b, W]
        slot_pos, new_pos = self.slot_pos, q_pos.masked_fill(pad, -1)  # [b, L], [b, W]
        key_pos = torch.cat([slot_pos, new_pos], dim=1)  # [b, L+W]
        allowed = torch.cat(
            [(slot_pos >= 0)[:, None, :].expand(b, W, L), ancestor_closure(parents_t, longest)], dim=2
        )  # [b, W, L+W]: a pad (a root of its own) sees itself only
        allowed[:, :, :L] &= ~pad[:, :, None]
        masks = {"full_attention": self._additive(allowed, pad, diag, L)}
        if self._types is not None and "sliding_attention" in self._types:
            in_window = key_pos[:, None, :] > (q_pos[:, :, None] - int(self._window))  # [b, W, L+W]
            masks["sliding_attention"] = self._additive(allowed & in_window, pad, diag, L)
        if self._types is None:
            attention_mask = masks["full_attention"]
        elif set(self._types) == {"sliding_attention"}:
            attention_mask = masks["sliding_attention"]
        else:
            attention_mask = {t: masks[t] for t in set(self._types)}
        logits = self._run(tokens_t, attention_mask, q_pos, K)
        self.slot_pos = key_pos
        self._last = PassLayout.of(W, offsets, p, n)
        root_index = K - 1 - n
        return logits, root_index

    def _causal(self, pending: list[list[int]], width: int) -> tuple[torch.Tensor, np.ndarray]:
        """`forward` of `width` pending tokens per row and no drafts over a dense cache (a prefill, or
        one chunk of it): no row needs padding or a tree, so the model's own causal mask is exact and
        none is built (an explicit mask would be `width` x (L + width) per row, quadratic in a prompt's
        length); the cache stays dense."""
        b, dev, L = len(pending), self.device, self._len
        zeros = np.zeros(b, np.int64)
        layout = PassLayout(width, zeros, np.full(b, width, np.int64), zeros, True)
        positions = torch.arange(L, L + width, device=dev).expand(b, width).contiguous()  # [b, width]
        (tokens,) = self._to_device(np.array(pending, np.int64).reshape(b, width))  # [b, width]
        logits = self._run(tokens, None, positions, 1)
        self._len = L + width
        self._last = layout
        return logits, np.full(b, 0, np.int64)

    def _step(self, tokens: list[int]) -> tuple[torch.Tensor, np.ndarray]:
        """`forward` of one new token per row over a dense cache (no sliding-window layers): slot i
        of every row holds position i, so the model's own causal mask is exact; none is built, and
        the cache stays dense (each row's token lands at slot L, position L). After a model's
        forward little of this is in the CPU's caches, so the step does as few operations as it can."""
        b, dev, L = len(tokens), self.device, self._len
        layout = self._step_layout
        if layout is None or layout.offsets.shape[0] != b:
            zeros, ones = np.zeros(b, np.int64), np.ones(b, np.int64)
            zeros.flags.writeable = ones.flags.writeable = False
            layout = self._step_layout = PassLayout(1, zeros, ones, zeros, True)
        positions = torch.full((b, 1), L, dtype=torch.long, device=dev)
        (tokens_t,) = self._to_device(np.array(tokens, np.int64).reshape(b, 1))  # [b, 1]
        logits = self._run(tokens_t, None, positions, 1)
        self._len = L + 1
        self._last = layout
        return logits, layout.offsets

    def _run(self, input_ids, attention_mask, position_ids, keep: int) -> torch.Tensor:
        """The model over the cache; the logits [b, keep, vocab] (float32) of the last `keep` inputs."""
        kwargs = {self._cache_arg: self.cache, "use_cache": True}
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = keep
        if attention_mask is not None and self.device.type == "cuda":
            with tree_sdpa():  # flash attention takes no explicit mask: the memory-efficient kernel does
                out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        else:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        return out.logits[:, -keep:, :].float()

    def _to_device(self, *arrays: np.ndarray) -> list[torch.Tensor]:
        """int64 copies of `arrays` on the model's device, by one host-to-device copy of them all:
        on CUDA from pinned memory without waiting for the device (the caching host allocator keeps
        the pinned block until the copy has run), on the CPU the arrays themselves (no copy)."""
        if self.device.type == "cpu":
            return [torch.from_numpy(np.ascontiguousarray(a, np.int64)) for a in arrays]
        host = torch.from_numpy(np.concatenate([np.asarray(a, np.int64).ravel() for a in arrays]))
        if self.device.type == "cuda":
            host = host.pin_memory()
        flat = host.to(self.device, non_blocking=True)
        out, start = [], 0
        for a in arrays:
            out.append(flat[start : start + a.size].view(a.shape))
            start += a.size
        return out

    def _additive(self, allowed, pad, diag, L) -> torch.Tensor:
        allowed = allowed.clone()
        allowed[:, diag, L + diag] |= pad  # a pad attends to itself only (no empty softmax rows)
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        return mask[:, None]  # [b, 1, W, L+W]

    # -------------------------------------------------------------------------------- bookkeeping

    @torch.inference_mode()
    def commit(self, kept_nodes: list[list[int]]) -> None:
        """Keep, per row, the last pass's pending slots plus the slots of draft nodes `kept_nodes[r]`
        (in path order); drop every other slot of that pass."""
        if self._last is None:
            raise InternalError("commit: no pass to commit")
        layout = self._last
        W, offsets, p = layout.width, layout.offsets, layout.pending
        if layout.plain:  # (then every kept_nodes[r] is empty)
            self.n_cached += p
            self._last = None
            if self._pos is not None:  # (a step keeps the cache dense)
                self._maybe_dense()
            return
        L = self.cache_len - W
        b = self.batch_size
        keep = [np.concatenate([offsets[r] + np.arange(p[r]), offsets[r] + p[r] + np.asarray(kept_nodes[r], np.int64)])
                for r in range(b)]
        T = max(len(k) for k in keep)
        index = np.zeros((b, T), np.int64)  # [b, T] the slot each kept slot comes from
        kept = np.array([len(k) for k in keep], np.int64)  # [b]
        for r, k in enumerate(keep):
            index[r, : len(k)] = L + k
            index[r, len(k) :] = L + offsets[r]  # any slot of this row; marked as a hole below
        self.n_cached += kept
        index_t, kept_t = self._to_device(index, kept)  # [b, T], [b]
        tail_pos = torch.gather(self.slot_pos, 1, index_t)  # [b, T]
        tail_pos.masked_fill_(torch.arange(T, device=self.device)[None, :] >= kept_t[:, None], -1)
        if not np.array_equal(index, np.broadcast_to(L + np.arange(T), (b, T))):
            self._rewrite_tail(L, index_t)
        self._crop(L + T)
        self.slot_pos = torch.cat([self.slot_pos[:, :L], tail_pos], 1)
        self._last = None
        holes = self.cache_len - int(self.n_cached.max(initial=0))  # of the row with the fewest
        if holes > max(32, self.cache_len // 4):
            self.compact()
        else:
            self._maybe_dense()

    @torch.inference_mode()
    def compact(self) -> None:
        """Squeeze holes out: each row's valid slots move to the front, in order."""
        valid = self.slot_pos >= 0
        order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)  # valid slots first
        keep = int(self.n_cached.max(initial=0))  # each row's valid slots, counted on the host
        index = order[:, :keep]
        self._rewrite(index)
        self.slot_pos = torch.gather(self.slot_pos, 1, index)
        self._maybe_dense()

    @torch.inference_mode()
    def select_rows(self, rows) -> None:
        """Keep only batch rows `rows` (finished requests cost nothing more)."""
        rows = np.asarray(list(rows), np.int64)
        (rows_t,) = self._to_device(rows)  # [b']
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys = layer.keys.index_select(0, rows_t)
                layer.values = layer.values.index_select(0, rows_t)
        self.n_cached = self.n_cached[rows]
        if self._pos is not None:  # (the rows of a dense cache stay dense)
            self._pos = self._pos.index_select(0, rows_t)
            if self.batch_size and self.cache_len:
                self.compact()

    @torch.inference_mode()
    def row_kv(self, row: int, start: int, end: int) -> list:
        """Row `row`'s keys and values of logical positions start..end (all cached): per layer (keys
        [h, end - start, d], values [h, end - start, dv]); views of the cache while it is dense (copy
        them before the next pass), else copies."""
        if self._last is not None:
            raise InternalError("row_kv between forward and commit")
        if not 0 <= start <= end <= int(self.n_cached[row]):
            raise InternalError(f"row_kv: positions {start}..{end} of a row with {int(self.n_cached[row])} cached")
        slots = None
        if self._pos is not None:  # a row's valid slots hold positions 0, 1, .. in order
            slots = torch.nonzero(self._pos[row] >= 0).flatten()[start:end]
        out = []
        for layer in self.cache.layers:
            keys, values = layer.keys[row], layer.values[row]
            if slots is None:
                out.append((keys[:, start:end], values[:, start:end]))
            else:
                out.append((keys.index_select(1, slots), values.index_select(1, slots)))
        return out

    @torch.inference_mode()
    def seed(self, prefixes: list[list]) -> None:
        """Start an empty state's rows from cached keys and values: row r holds `prefixes[r]` (per
        layer (keys [h, n_r, d], values [h, n_r, dv]), logical positions 0..n_r - 1; an empty list:
        nothing). Shorter rows are padded with holes."""
        if self.cache_len or self._last is not None:
            raise InternalError("seed: the state is not empty")
        if len(prefixes) != self.batch_size:
            raise InternalError(f"seed: expected {self.batch_size} rows, got {len(prefixes)}")
        lengths = np.array([p[0][0].shape[1] if p else 0 for p in prefixes], np.int64)
        L = int(lengths.max(initial=0))
        if L == 0:
            return
        layers = max(len(p) for p in prefixes)
        some = next(p for p in prefixes if p)
        for layer in range(layers):
            k0, v0 = some[layer]
            keys = k0.new_zeros((self.batch_size, k0.shape[0], L, k0.shape[2]))
            values = v0.new_zeros((self.batch_size, v0.shape[0], L, v0.shape[2]))
            for r, p in enumerate(prefixes):
                if p:
                    keys[r, :, : lengths[r]] = p[layer][0]
                    values[r, :, : lengths[r]] = p[layer][1]
            self.cache.update(keys.to(self.device, self.dtype), values.to(self.device, self.dtype), layer)
        self.n_cached = lengths.copy()
        self._len = L
        if not bool((lengths == L).all()):
            pos = torch.arange(L, device=self.device).expand(self.batch_size, L).clone()
            (lengths_t,) = self._to_device(lengths)
            pos.masked_fill_(pos >= lengths_t[:, None], -1)
            self._pos = pos

    @torch.inference_mode()
    def add_rows(self, other: KVState) -> None:
        """Append `other`'s rows (same model, no pass in flight) after this state's rows.

        The shorter cache is padded on the right with holes (slot position -1, zero keys/values),
        which every later mask excludes; `other` must not be used afterwards."""
        if self._last is not None or other._last is not None:
            raise InternalError("add_rows between forward and commit")
        if other.batch_size == 0:
            return
        if self.batch_size == 0:
            self.cache, self._pos, self._len, self.n_cached = other.cache, other._pos, other._len, other.n_cached.copy()
            return
        L = max(self.cache_len, other.cache_len)

        def padded(t: torch.Tensor, fill) -> torch.Tensor:  # [b, ..., length(dim 2 or 1)] -> length L
            dim = 2 if t.dim() == 4 else 1
            short = L - t.shape[dim]
            if short == 0:
                return t
            shape = list(t.shape)
            shape[dim] = short
            return torch.cat([t, torch.full(shape, fill, dtype=t.dtype, device=t.device)], dim=dim)

        if len(self.cache.layers) != len(other.cache.layers):
            raise InternalError("add_rows: the two caches have different layer counts")
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            mine.keys = torch.cat([padded(mine.keys, 0), padded(theirs.keys, 0)], 0)
            mine.values = torch.cat([padded(mine.values, 0), padded(theirs.values, 0)], 0)
        slot_pos = torch.cat([padded(self.slot_pos, -1), padded(other.slot_pos, -1)], 0)
        self.n_cached = np.concatenate([self.n_cached, other.n_cached])
        self.slot_pos = slot_pos
        self._maybe_dense()

    def _rewrite_tail(self, start: int, index: torch.Tensor) -> None:
        """Slots start.. of every layer become slots `index` [b, T] (all >= start), in place."""
        T = index.shape[1]
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name, None)
                if t is None or t.numel() == 0:
                    continue
                b, h, _, d = t.shape
                t[:, :, start : start + T] = torch.gather(t, 2, index[:, None, :, None].expand(b, h, T, d))

    def _crop(self, length: int) -> None:
        for layer in self.cache.layers:
            crop = getattr(layer, "crop_to", None)
            if crop is not None:
                crop(length)
            elif getattr(layer, "keys", None) is not None and layer.keys.numel() and layer.keys.shape[2] > length:
                layer.keys = layer.keys[:, :, :length]
                layer.values = layer.values[:, :, :length]

    def _rewrite(self, index: torch.Tensor) -> None:
        """Every layer's keys/values become their slots `index` [b, L'] (per row)."""
        for layer in self.cache.layers:
            keys = getattr(layer, "keys", None)
            if keys is None or keys.numel() == 0:
                continue
            b, h, _, d = keys.shape
            idx = index[:, None, :, None].expand(b, h, index.shape[1], d)
            layer.keys = torch.gather(keys, 2, idx)
            vd = layer.values.shape[-1]
            layer.values = torch.gather(layer.values, 2, index[:, None, :, None].expand(b, h, index.shape[1], vd))


# ------------------------------------------------------------------------------------------ self-check


@torch.inference_mode()
def check_tree_logits(model, atol: float | None = None) -> float:
    """Compare a tree pass with sequential passes on a short input; returns the max abs difference
    and raises InternalError when it exceeds `atol` (default by dtype)."""
    dtype = next(model.parameters()).dtype
    if atol is None:
        atol = 1e-6 if dtype == torch.float64 else (2e-3 if dtype == torch.float32 else 5e-2)
    vocab = int(model.get_input_embeddings().weight.shape[0])
    gen = np.random.default_rng(0)
    prompt = gen.integers(0, vocab, 7).tolist()
    branch_a, branch_b = gen.integers(0, vocab, 3).tolist(), gen.integers(0, vocab, 2).tolist()
    tree = DraftTree.from_paths([branch_a, branch_b])
    state = KVState(model, 1)
    logits, root = state.forward([prompt], [tree])
    worst = 0.0
    for path in tree.paths():
        toks = prompt + [int(t) for t in tree.tokens[path]]
        ref = model(input_ids=torch.tensor([toks], device=state.device)).logits[0, len(prompt) - 1 :].float()
        got = logits[0, [int(root[0])] + [int(root[0]) + 1 + int(i) for i in path]]
        worst = max(worst, float((ref - got).abs().max()))
    if worst > atol:
        raise InternalError(f"tree logits differ from sequential logits by {worst:.3g} (> {atol:.1g})")
    return worst
