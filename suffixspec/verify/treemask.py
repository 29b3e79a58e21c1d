"""Device-side pieces of a tree pass (`suffixspec.verify.kv.KVState.forward`).

Contract:

* ``ancestor_closure(parents, longest)``: bool [b, W, W], input j is input i or an ancestor of it,
  from each input's parent index [b, W] (-1: none), built on the parents' device by pointer doubling
  (ceil(log2(longest)) rounds of two gathers; no host work, no device read).
* ``TREE_SDPA_BACKENDS`` / ``tree_sdpa()``: the scaled-dot-product-attention kernels a pass with an
  explicit float mask may use on CUDA (the memory-efficient one, math as the fallback), as a context
  manager. Flash attention takes no arbitrary additive mask.
"""

from __future__ import annotations

import torch

__all__ = ["ancestor_closure", "tree_sdpa", "TREE_SDPA_BACKENDS"]


def ancestor_closure(parents: torch.Tensor, longest: int) -> torch.Tensor:
    """bool [b, W, W]: [r, i, j] when input j of row r is input i or one of its ancestors, given each
    input's parent `parents` [b, W] (-1: none) and `longest`, the most inputs on one chain. Built on
    the device by pointer doubling: ceil(log2(longest)) rounds of two gathers, no host work."""
    b, W = parents.shape
    col = torch.arange(W, device=parents.device)  # [W]
    jump = torch.where(parents < 0, col[None, :], parents)  # [b, W]: the parent (a root: itself)
    closure = (col[:, None] == col[None, :]).expand(b, W, W).contiguous()  # [b, W, W]: within distance 0
    reach = 1
    while reach < longest:  # closure: ancestors within distance < reach; jump: the reach-th (or the root)
        closure |= torch.gather(closure, 1, jump[:, :, None].expand(b, W, W))
        jump = torch.gather(jump, 1, jump)
        reach *= 2
    return closure


# Backends of scaled-dot-product attention for a pass with an explicit float mask on CUDA: flash
# attention takes no arbitrary mask, the memory-efficient kernel does (math: the fallback for what it
# refuses, e.g. float64).
TREE_SDPA_BACKENDS = ("EFFICIENT_ATTENTION", "MATH")


def tree_sdpa():
    """The context in which a masked pass on CUDA runs (`TREE_SDPA_BACKENDS` only)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, name) for name in TREE_SDPA_BACKENDS])
