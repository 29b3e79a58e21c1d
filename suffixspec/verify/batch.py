"""`RoundBatch`: what one round of the engine hands the budget policy and the verifier.

The engine builds one per round, after drafting (`RoundBatch.build`, in the engine's round). The policy
reads it to choose the round's draft size (`BudgetPolicy.size_round`), which replaces `trees`;
the verifier's pass and acceptance (`kv.KVState.forward`, `accept.accept`) read it after that. Every
per-row field has one entry per row of the round's KV state, in the same order; nothing here is
optional or either-or: a field that does not apply to a row holds its neutral value (weight 1,
factor 1, a continuation chance of 1). Imports neither torch nor the model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from ..draft.tree import DraftTree
from ..errors import BadInputError

__all__ = ["RoundBatch"]


@dataclass
class RoundBatch:
    """One round's rows. `b` rows; `D` the depths a continuation chance is known for."""

    trees: list[DraftTree]  # [b] each row's draft tree (sizing replaces the automatic rows')
    pending: list[list[int]]  # [b] committed tokens not yet in the cache, the last one the tree's root
    limits: np.ndarray  # int64[b] most tokens a row may commit this round (0: none)
    auto: np.ndarray  # bool[b] the row's budget is automatic: the policy sizes its tree
    weights: np.ndarray  # float64[b] what a row's committed token is worth to the batch (`tail_weights`)
    factors: np.ndarray  # float64[b] how the row's own drafts fared so far (`RequestTrust.factor`)
    continuing: np.ndarray  # float64[b, D] [i, d]: chance row i's output runs past a node d deep
    samplers: list[Any]  # [b] the row's `accept.Sampler` (rows may share one object; None: not for verifying)
    eos: list[frozenset]  # [b] tokens that end the row's output (committed, then the walk stops)
    contexts: list[list[int]]  # [b] the row's committed tokens (prompt + output), for logits processors
    keys: np.ndarray  # int64[b] the row's sampling draw key
    generated: np.ndarray  # int64[b] output tokens the row has so far (a draw's position counts from it)

    def __post_init__(self) -> None:
        b = len(self.trees)
        for name in ("pending", "limits", "auto", "weights", "factors", "continuing", "samplers", "eos",
                     "contexts", "keys", "generated"):
            if len(getattr(self, name)) != b:
                raise BadInputError(f"RoundBatch.{name}: expected {b} rows (one per tree), got "
                                    f"{len(getattr(self, name))}")
        if self.continuing.ndim != 2 or self.continuing.shape[1] < 1:
            raise BadInputError(f"RoundBatch.continuing: expected float64[{b}, D >= 1], got shape "
                                f"{self.continuing.shape}")

    def __len__(self) -> int:
        return len(self.trees)

    @property
    def width(self) -> int:
        """Pending tokens of the widest row: the pass is left-padded to it (1 in a decode round)."""
        return max((len(p) for p in self.pending), default=1)

    def with_sizing(self, *, weights=None, factors=None, continuing=None) -> "RoundBatch":
        """This batch with the sizing fields set (None: neutral), as `build` reads them."""
        b = len(self)
        return replace(self, weights=_per_row(weights, b, "weights"), factors=_per_row(factors, b, "factors"),
                       continuing=_continuing(continuing, b))

    @classmethod
    def build(cls, trees: Sequence[DraftTree], limits, *, pending=None, auto=None, weights=None,
              factors=None, continuing=None, samplers=None, eos=frozenset(), contexts=None, keys=None,
              generated=None) -> "RoundBatch":
        """A batch from per-row sequences; what is left out takes its neutral value: one pending
        token per row, every row automatic, weights and factors 1, continuation chances 1, no
        sampler (a batch that is only sized), no EOS, empty contexts, keys 0..b-1, nothing generated yet. `samplers` and
        `eos` may be one value for every row; `continuing` rows may be None (unknown: 1) or shorter
        than the longest (depths past a row's end read its last entry)."""
        trees = list(trees)
        b = len(trees)
        if not isinstance(samplers, (list, tuple)):
            samplers = [samplers] * b
        return cls(
            trees=trees,
            pending=[[0]] * b if pending is None else list(pending),
            limits=np.asarray(limits, np.int64).reshape(-1),
            auto=np.ones(b, np.bool_) if auto is None else np.asarray(auto, np.bool_).reshape(-1),
            weights=_per_row(weights, b, "weights"),
            factors=_per_row(factors, b, "factors"),
            continuing=_continuing(continuing, b),
            samplers=list(samplers),
            eos=list(eos) if isinstance(eos, (list, tuple)) else [frozenset(eos)] * b,
            contexts=[[] for _ in range(b)] if contexts is None else list(contexts),
            keys=np.arange(b, dtype=np.int64) if keys is None else np.asarray(keys, np.int64).reshape(-1),
            generated=np.zeros(b, np.int64) if generated is None else np.asarray(generated, np.int64).reshape(-1),
        )


def _per_row(values, b: int, name: str) -> np.ndarray:
    """float64[b]: the values, or ones when None."""
    if values is None:
        return np.ones(b, np.float64)
    out = np.asarray(values, np.float64).reshape(-1)
    if len(out) != b:
        raise BadInputError(f"RoundBatch.{name}: expected {b} rows, got {len(out)}")
    return out


def _continuing(rows, b: int) -> np.ndarray:
    """float64[b, D] from None (every chance 1), an array, or one entry per row (None: unknown, so 1;
    a shorter row is extended with its last entry)."""
    if rows is None:
        return np.ones((b, 1), np.float64)
    if isinstance(rows, np.ndarray):
        return np.ascontiguousarray(rows, np.float64)
    width = max((len(c) for c in rows if c is not None), default=1)
    out = np.ones((len(rows), width), np.float64)
    for i, c in enumerate(rows):
        if c is not None:
            out[i, : len(c)] = c
            out[i, len(c):] = c[-1]
    return out
