"""Acceptance: the target's tokens for every row of a verified batch, walked along its draft tree.

`accept` walks each tree from its root: at each node the target's logits are processed exactly as
plain decoding would (user `LogitsProcessor`s with that node's full token context, then
temperature, top-k, top-p, min-p), a token is chosen (argmax, or inverse-CDF sampling with a uniform
drawn from (seed, request, output position)), and the walk follows the child drafting that token.
With a deterministic draft this is the lossless rule "sample the target and follow the matching
child", and the output equals plain decoding with the same draws whatever the trees were.

* `Sampler`: one request's processing and choice (`process`, `choose`), as transformers' `generate`;
* `uniform_draw(seed, request, position)`: the uniform that decides one output token;
* `RowResult`: a row's committed tokens, its accepted draft nodes, whether it stopped on EOS;
* `argmax_rows`, `greedy_choices`: the target's argmax per row / per position; greedy acceptance
  off the CPU copies every position's choice to the host once per round (the round's one
  device-to-host copy).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..draft.tree import DraftTree
from ..errors import InternalError
from .batch import RoundBatch
from .logprobs import of_rows

__all__ = ["RowResult", "STEPWISE_DEVICES", "Sampler", "accept", "argmax_rows", "greedy_choices", "uniform_draw"]

_MASK64 = (1 << 64) - 1


# ------------------------------------------------------------------------------------------ randomness


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def uniform_draw(seed: int, request: int, position: int) -> float:
    """The uniform in [0, 1) that decides output token `position` of request `request` under `seed`."""
    h = _splitmix64(int(seed) & _MASK64)
    h = _splitmix64(h ^ (int(request) & _MASK64))
    h = _splitmix64(h ^ (int(position) & _MASK64))
    return (h >> 11) * (1.0 / (1 << 53))


# ------------------------------------------------------------------------------------------ processing


def argmax_rows(scores: torch.Tensor) -> list[int]:
    """The index of each row's first maximum of `scores` [m, vocab] (a NaN counts as the maximum), as
    `torch.argmax` gives it. On the CPU numpy's vectorised argmax reads the rows: torch's is several
    times slower there, and it runs once per row of every decode round."""
    if scores.device.type == "cpu" and scores.dtype in (torch.float32, torch.float64):
        return scores.numpy().argmax(-1).tolist()
    return scores.argmax(dim=-1).tolist()



class Sampler:
    """Turns target logits into tokens exactly as plain decoding does.

    Order (as in transformers' `generate`): logits processors (the user's, then penalties, the least
    length, the grammar), then temperature, top-k, top-p, min-p (transformers' own warpers), then
    argmax (greedy) or sampling from the softmax. `logprobs` (None, or 0..20 top alternatives): the
    walk reports each chosen token's log probability under the raw logits (before any processing).
    """

    def __init__(self, do_sample=False, temperature=1.0, top_k=None, top_p=None, seed=None, logits_processor=None,
                 min_p=None, logprobs=None):
        from transformers import (
            LogitsProcessorList,
            MinPLogitsWarper,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        self.do_sample = bool(do_sample)
        self.processors = LogitsProcessorList(list(logits_processor or []))
        warpers = []
        if self.do_sample:
            if temperature is not None and float(temperature) != 1.0:
                warpers.append(TemperatureLogitsWarper(float(temperature)))
            if top_k is not None and int(top_k) > 0:
                warpers.append(TopKLogitsWarper(top_k=int(top_k)))
            if top_p is not None and float(top_p) < 1.0:
                warpers.append(TopPLogitsWarper(top_p=float(top_p)))
            if min_p is not None and float(min_p) > 0.0:
                warpers.append(MinPLogitsWarper(min_p=float(min_p)))
        self.logprobs = None if logprobs is None else int(logprobs)
        self.warpers = LogitsProcessorList(warpers)
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item()) if self.do_sample else 0
        self.seed = int(seed)

    def process(self, contexts: list[list[int]], scores: torch.Tensor) -> torch.Tensor:
        """scores: [m, vocab] float32 raw logits; contexts: each row's full token context (prompt +
        output so far) before the token being chosen. Returns processed scores [m, vocab]."""
        if len(self.processors):
            rows = []
            for i, ctx in enumerate(contexts):
                ids = torch.tensor([ctx], dtype=torch.long, device=scores.device)
                rows.append(self.processors(ids, scores[i : i + 1]))
            scores = torch.cat(rows, 0)
        if len(self.warpers):
            dummy = torch.zeros((scores.shape[0], 1), dtype=torch.long, device=scores.device)
            scores = self.warpers(dummy, scores)
        return scores

    def choose(self, scores: torch.Tensor, keys: list[tuple[int, int]]) -> list[int]:
        """One token per row of processed `scores` [m, vocab]; keys: (request, output position)."""
        if not self.do_sample:
            return argmax_rows(scores)
        target_probs = torch.softmax(scores.double(), dim=-1)  # [m, vocab]
        cdf = target_probs.cumsum(dim=-1)  # [m, vocab]
        u = torch.tensor([uniform_draw(self.seed, r, p) for r, p in keys], dtype=torch.float64, device=cdf.device)
        u = u * cdf[:, -1]
        tokens = torch.searchsorted(cdf, u[:, None], right=True)[:, 0]
        return tokens.clamp_(max=scores.shape[-1] - 1).tolist()


# ------------------------------------------------------------------------------------------ acceptance


@dataclass
class RowResult:
    tokens: list[int] = field(default_factory=list)  # committed this round (accepted drafts, then the bonus)
    accepted_nodes: list[int] = field(default_factory=list)  # draft nodes whose tokens were committed
    stopped_on_eos: bool = False
    logprobs: list | None = None  # a `logprobs.TokenLogprob` per token, when its sampler asks for them


def accept(logits: torch.Tensor, root_index: np.ndarray, batch: RoundBatch) -> list[RowResult]:
    """Walk every row's tree, as `KVState.forward` fed them, and choose each row's tokens.

    logits: [b, K, vocab] from the pass; root_index: int[b], the position of each row's root (its
    last pending token) in `logits`. From `batch` (one entry per row): `trees`, `samplers` (rows
    sharing a sampler object are processed together), `contexts` (committed tokens, for logits
    processors), `keys` and `generated` (a draw's key and output position), `limits` (most tokens
    to commit this round; 0: none) and `eos` (the walk stops at such a token, which is committed).
    `accepted_nodes` excludes the node of the last committed token, whose KV is never needed (it
    becomes the next pending token).
    """
    trees, row_samplers, row_eos = batch.trees, batch.samplers, batch.eos
    limits = batch.limits.tolist()
    contexts, request_keys, n_generated = batch.contexts, batch.keys.tolist(), batch.generated.tolist()
    b = len(trees)
    if any(s is None for s in row_samplers):
        raise InternalError("accept: expected a Sampler for every row of the batch, got None")
    first = row_samplers[0] if b else None
    if (b and not first.do_sample and not len(first.processors) and first.logprobs is None
            and all(s is first for s in row_samplers)
            and (logits.shape[1] == 1 or logits.device.type not in STEPWISE_DEVICES)):
        return _accept_greedy(greedy_choices(logits), root_index, trees, limits, row_eos)
    results = [RowResult() for _ in range(b)]
    children = [{(int(pa), int(t)): i for i, (pa, t) in enumerate(zip(tr.parents, tr.tokens))} for tr in trees]
    current = [-1] * b
    path_nodes: list[list[int]] = [[] for _ in range(b)]
    active = [r for r in range(b) if limits[r] > 0]
    while active:
        idx = torch.tensor([int(root_index[r]) + 1 + current[r] for r in active], device=logits.device)
        rows = torch.tensor(active, device=logits.device)
        scores = logits[rows, idx]  # [m, vocab]
        groups: dict[int, list[int]] = {}  # sampler -> positions in `active`
        for j, r in enumerate(active):
            groups.setdefault(id(row_samplers[r]), []).append(j)
        chosen = [0] * len(active)
        for js in groups.values():
            sampler = row_samplers[active[js[0]]]
            rows_g = [active[j] for j in js]
            group_scores = scores if len(js) == len(active) else scores[torch.tensor(js, device=scores.device)]
            raw = group_scores
            ctx = [contexts[r] + results[r].tokens for r in rows_g] if len(sampler.processors) else []
            group_scores = sampler.process(ctx, group_scores)
            keys = [(request_keys[r], n_generated[r] + len(results[r].tokens)) for r in rows_g]
            picked = sampler.choose(group_scores, keys)
            for j, tok in zip(js, picked):
                chosen[j] = tok
            if sampler.logprobs is not None:  # the hook every per-position report reads: the raw logits
                for r, entry in zip(rows_g, of_rows(raw, picked, sampler.logprobs)):
                    if results[r].logprobs is None:
                        results[r].logprobs = []
                    results[r].logprobs.append(entry)
        still = []
        for r, tok in zip(active, chosen):
            res = results[r]
            res.tokens.append(int(tok))
            if tok in row_eos[r]:
                res.stopped_on_eos = True
                continue
            if len(res.tokens) >= limits[r]:
                continue
            child = children[r].get((current[r], int(tok)))
            if child is None:
                continue
            path_nodes[r].append(child)
            current[r] = child
            still.append(r)
        active = still
    for r in range(b):
        results[r].accepted_nodes = path_nodes[r][: len(results[r].tokens) - 1]
    return results


# Devices where greedy acceptance takes the argmax along the walk, one tree level at a time: host
# syncs cost nothing there, and the positions off the accepted path are never read. Elsewhere every
# position's argmax is taken on the device and copied to the host once (`greedy_choices`).
STEPWISE_DEVICES = frozenset({"cpu"})


def greedy_choices(logits: torch.Tensor) -> list[list[int]]:
    """The argmax of every position of `logits` [b, K, vocab], as `argmax_rows`: on the device, then
    the round's one device-to-host copy ([b, K] int64)."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        return logits.numpy().argmax(-1).tolist()
    return logits.argmax(dim=-1).cpu().tolist()


def _accept_greedy(chosen: list[list[int]], root_index: np.ndarray, trees: list[DraftTree], limits: list[int],
                   row_eos) -> list[RowResult]:
    """`accept` of greedy rows without logits processors, from the target's choice at every
    position (`chosen` [b][K]): the same walk, on the host."""
    results = []
    for r, tree in enumerate(trees):
        limit, eos, at = limits[r], row_eos[r], int(root_index[r]) + 1
        if limit <= 0:
            results.append(RowResult())
            continue
        tok = chosen[r][at - 1]
        if not len(tree):  # no drafts: the root's choice
            results.append(RowResult([tok], [], tok in eos))
            continue
        children = dict(zip(zip(tree.parents.tolist(), tree.tokens.tolist()), range(len(tree))))
        res, node, path = RowResult(), -1, []
        while True:
            tok = chosen[r][at + node]
            res.tokens.append(tok)
            if tok in eos:
                res.stopped_on_eos = True
                break
            node = children.get((node, tok)) if len(res.tokens) < limit else None
            if node is None:
                break
            path.append(node)
        res.accepted_nodes = path[: len(res.tokens) - 1]
        results.append(res)
    return results
