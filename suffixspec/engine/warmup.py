"""`warm_kernels`: every numba kernel a serving engine's rounds can reach, compiled or loaded before
the first request instead of inside a round; `prepare_generator`: all of a generator's one-time work
(kernels, the tree check, the cost curve), timed apart as a `Preparation`.

The kernels are `cache=True`: the first process of an installation compiles each one (the batched
proposal, the largest, compiles longest) and later processes load them from disk, much faster.
Either happens on a kernel's first call.
Without a warm-up, that first call lands inside a round: the first time two requests draft together
(`Proposer.propose_batch`), or the first time the response cache merges into a level large enough to
be thawed rather than rebuilt (after a few closed requests), every running request waits for it.

`warm_kernels` runs each of those paths once on throwaway objects: a scratch `Proposer` with the
caller's corpus and knobs (its sessions, batched proposal, learning and response cache: add, merge,
thaw), and a `BudgetPolicy` over a made-up cost curve (the round sizing). Nothing the caller holds
changes: the corpus is only read, and the scratch proposer's cache is its own. A process warms the
kernels of one (corpus, threads) setting once (`kernels_warm`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..draft.config import ProposerConfig
from ..draft.proposer import Proposer
from ..draft.response_cache import THAW_MIN_TOKENS, ResponseCache
from ..draft.tree import DraftTree, prune_tree
from ..verify.batch import RoundBatch
from .budget import BudgetPolicy, CostModel

__all__ = ["warm_kernels", "kernels_warm", "Preparation", "prepare_generator"]

_TEXT = np.array([5, 6, 7, 8, 5, 6, 7, 9, 5, 6], np.int64)
_WARMED: set[tuple] = set()  # (corpus identity, threads) settings whose kernels this process has warmed


def _setting(corpus, threads) -> tuple:
    corpora = corpus if isinstance(corpus, (list, tuple)) else ([] if corpus is None else [corpus])
    return tuple(id(c) for c in corpora), threads


def kernels_warm(corpus=None, threads=None) -> bool:
    """Whether this process already ran `warm_kernels` for `corpus` and `threads`."""
    return _setting(corpus, threads) in _WARMED


def warm_kernels(corpus=None, *, filter=None, config: ProposerConfig | None = None, **knobs) -> float:
    """Run every kernel path of a serving round once (module docstring); returns the seconds it took.

    `corpus`, `config` and `knobs`: those of the serving `Proposer` (the corpus kernels and the
    knobs' own paths are warmed too); `filter`: a corpus filter the requests will use, if any."""
    t0 = time.perf_counter()
    cfg = ProposerConfig.of(config, knobs)
    vocab = cfg.vocab_size
    text = _TEXT % max(1, min(vocab, 10)) if vocab else _TEXT
    scratch = Proposer(corpus, config=cfg.replace(cache_upkeep="inline"))  # on this thread: done when this returns
    sessions = [scratch.start(text, filter=filter) for _ in range(3)]
    for s in sessions:
        s.extend(text[:3])
    sessions[0].propose(8)  # one session's own path
    scratch.propose_batch(sessions[:2], [8, 8])  # several sessions in one call
    for s in sessions[:2]:
        s.extend(text[3:6])  # learning from the proposed trees
        s.close()  # the response cache: new levels, merged
    later = [scratch.start(text, filter=filter) for _ in range(2)]
    for s in later:
        s.extend(text[:4])  # learning over the cache's automata
    scratch.propose_batch([*later, sessions[2]], [8, 8, 8])  # the open session re-syncs to the cache
    for s in [*later, sessions[2]]:
        s.close()
    cache = ResponseCache()
    cache.add(np.resize(text, THAW_MIN_TOKENS + 8))
    cache.add(np.resize(text, THAW_MIN_TOKENS // 2))  # merged into the first level, which is thawed
    policy = BudgetPolicy(cost_model=CostModel([1, 2, 4, 8, 16], [1.0, 1.05, 1.1, 1.3, 1.7]))
    tree = DraftTree.from_paths([[1, 2, 3], [1, 4]])
    policy.size_round(RoundBatch.build([tree, tree], [8, 8]))
    prune_tree(tree, 2, 8)
    _WARMED.add(_setting(corpus, cfg.threads))
    return time.perf_counter() - t0


@dataclass
class Preparation:
    """A generator's one-time work done by one `prepare_generator` call, in seconds (0: done before, or
    not needed)."""

    kernels_s: float = 0.0  # numba kernels compiled (first process of an installation) or loaded
    check_s: float = 0.0  # tree verification checked against sequential passes (the model's first passes)
    cost_curve_s: float = 0.0  # the pass-cost curve measured, or read from the cache folder
    first_pass_s: float = 0.0  # one pass over a prompt: the process's first pass of that size

    @property
    def total_s(self) -> float:
        return self.kernels_s + self.check_s + self.cost_curve_s + self.first_pass_s

    def describe(self) -> str:
        return (f"one-time warm-up {self.total_s:.2f} s (kernels {self.kernels_s:.2f} s, tree check "
                f"{self.check_s:.2f} s, cost curve {self.cost_curve_s:.2f} s, first pass {self.first_pass_s:.2f} s), "
                "not in the timings")


def prepare_generator(gen, *, drafts: bool = True, cost_curve: bool = True, prompt=None,
                      clock: Callable[[], float] = time.perf_counter) -> Preparation:
    """`gen`'s one-time work, each part once: the proposer's kernels when it is a `Proposer` and
    `drafts` may be made, the tree-verification check, and the cost curve when `cost_curve` (the
    automatic budget) and trees can be verified; with `prompt` (token ids), one pass over it, as
    the process's first pass of that size would otherwise fall on the first timed request. Timed
    on `clock`."""
    done = Preparation()
    proposer = gen.proposer if drafts else None
    if isinstance(proposer, Proposer):
        corpus = proposer.corpora or None
        if not kernels_warm(corpus, proposer.threads):
            t = clock()
            warm_kernels(corpus, threads=proposer.threads)
            done.kernels_s = clock() - t
    t = clock()
    first = not gen.checked
    unsupported = gen.check_support()  # memoised: the check runs once per generator
    done.check_s = clock() - t if first else 0.0
    if cost_curve and unsupported is None and gen.cost_model is None:
        t = clock()
        gen.policy.ensure_cost_model(gen.model)
        done.cost_curve_s = clock() - t
    if prompt is not None and len(prompt):
        t = clock()
        _one_pass(gen.model, prompt)
        done.first_pass_s = clock() - t
    return done


def _one_pass(model, prompt) -> None:
    import torch

    device = next(model.parameters()).device
    with torch.inference_mode():
        model(torch.as_tensor([list(prompt)], device=device), use_cache=False)
