"""Peers' n-gram drafting rules, re-implemented in numpy to replay them on the same traces as ours.

Contract
--------
- ``vllm_ngram_propose(context, budget, nmin=2, nmax=5) -> int32 array`` and
  ``prompt_lookup_propose(context, budget, max_ngram=3) -> int32 array``: pure-numpy
  re-implementations (written from reading the sources, not copied) of vLLM's v1
  ``NgramProposer`` and transformers' ``PromptLookupCandidateGenerator``. Empty array = no draft.

Both n-gram rules reduce to one: take the largest n in [nmin, nmax] such that the last n tokens
of ``context`` also occur ending strictly before the last position (overlap with the suffix
allowed); take the EARLIEST such occurrence; propose up to ``budget`` tokens that follow it.
- vLLM (``vllm/v1/spec_decode/ngram_proposer.py``, KMP over the reversed context, keeping the
  latest reversed position on ties = earliest original one): nmin=prompt_lookup_min,
  nmax=prompt_lookup_max; the ``max_model_len`` clamp of k is not modelled.
- transformers 5.24 (``generation/candidate_generator.py``): ngram sizes from
  ``min(max_matching_ngram_size, len-1)`` down to 1, ``unfold`` sliding windows, the first
  window (left to right) with at least one token after it; so nmin=1, nmax=max_ngram
  (HF's own default is 2). Its ``max_length`` clamp, logits-processor filtering and EOS
  truncation are not modelled.
Each call costs O(len(context)) (one vectorised comparison plus filtering of candidates).

The drivers of peers that run in another interpreter (arctic-inference) live in the repository's
``bench/_peers.py``, which re-exports these two.
"""

from __future__ import annotations

import numpy as np

__all__ = ["prompt_lookup_propose", "vllm_ngram_propose"]


def _earliest_longest_suffix_match(ctx: np.ndarray, nmin: int, nmax: int) -> int:
    """End index e (< len-1) of the earliest occurrence of the longest n-suffix, n in [nmin, nmax]; -1 if none."""
    L = len(ctx)
    if L < 2 or nmax < 1 or nmax < nmin:
        return -1
    ends = np.flatnonzero(ctx[:-1] == ctx[-1])  # ascending, candidate end positions
    lens = np.ones(len(ends), dtype=np.int64)
    alive = np.arange(len(ends))
    for j in range(1, nmax):
        pos = ends[alive] - j
        ok = pos >= 0
        ok[ok] = ctx[pos[ok]] == ctx[L - 1 - j]
        alive = alive[ok]
        if alive.size == 0:
            break
        lens[alive] += 1
    if lens.size == 0:
        return -1
    best = int(lens.max())
    if best < max(nmin, 1):
        return -1
    return int(ends[int(np.argmax(lens == best))])


def _propose(context, budget: int, nmin: int, nmax: int) -> np.ndarray:
    ctx = np.ascontiguousarray(context, dtype=np.int32)
    if budget <= 0:
        return np.zeros(0, dtype=np.int32)
    e = _earliest_longest_suffix_match(ctx, nmin, nmax)
    if e < 0:
        return np.zeros(0, dtype=np.int32)
    return ctx[e + 1:e + 1 + budget].copy()


def vllm_ngram_propose(context: np.ndarray, budget: int, nmin: int = 2, nmax: int = 5) -> np.ndarray:
    """vLLM v1 NgramProposer rule (prompt_lookup_min=nmin, prompt_lookup_max=nmax, k=budget)."""
    return _propose(context, budget, nmin, nmax)


def prompt_lookup_propose(context: np.ndarray, budget: int, max_ngram: int = 3) -> np.ndarray:
    """transformers PromptLookupCandidateGenerator rule (max_matching_ngram_size=max_ngram,
    num_output_tokens=budget)."""
    return _propose(context, budget, 1, max_ngram)
