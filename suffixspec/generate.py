"""`SpeculativeGenerator`: the decoding loop over any transformers causal LM.

Each round, for every unfinished request of the batch: the proposer drafts a tree from the committed
tokens, the trees are pruned to the round's budget, one forward pass verifies all of them
(`verify.KVState.forward`), acceptance (`verify.accept`) commits the accepted drafts plus one bonus
token, and the committed tokens flow back to the proposer. A finished request leaves the batch (its
cache rows are dropped). `generate` runs on the continuous-batching `suffixspec.serve.Server`
(`SpeculativeGenerator.serve`), where requests may also join the batch between rounds.

The budget is either fixed (`budget=N` draft nodes per request, 0 = plain decoding) or "auto": a
`CostModel` measured on the running hardware gives the cost of a pass as a function of the tokens it
feeds, the tree scores (calibrated online against observed acceptance) give the expected committed
tokens, and the round uses the tree size that maximises expected committed tokens per second, which
is zero (plain decoding) when speculation would not pay.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import resource
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from .errors import BadInputError, BadInputTypeError
from .tree import DraftTree

__all__ = ["SpeculativeGenerator", "GenerationResult", "GenerationStats", "RequestStats", "CostModel", "prune_tree"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BUDGET = 64


# ------------------------------------------------------------------------------------------ results


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    rounds: int = 0
    committed_per_round: list[int] = field(default_factory=list)
    drafted: int = 0  # draft nodes verified
    accepted: int = 0  # draft nodes accepted
    accepted_by_position: list[int] = field(default_factory=list)  # [depth - 1] -> accepted count
    ttft_s: float = 0.0  # from submission (queueing included)
    e2e_s: float = 0.0  # from submission (queueing included)
    queue_s: float = 0.0  # from submission to admission into the running batch
    finish_reason: str = ""  # "eos", "stop" or "length"

    @property
    def tpot_s(self) -> float:
        return (self.e2e_s - self.ttft_s) / (self.new_tokens - 1) if self.new_tokens > 1 else 0.0

    @property
    def tokens_per_round(self) -> float:
        return self.new_tokens / self.rounds if self.rounds else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tpot_s"] = self.tpot_s
        d["tokens_per_round"] = self.tokens_per_round
        return d


@dataclass
class GenerationStats:
    requests: list[RequestStats]
    rounds: int = 0  # forward passes of the batch
    plain_rounds: int = 0  # rounds that verified no draft at all
    proposer_s: float = 0.0
    verifier_s: float = 0.0
    e2e_s: float = 0.0
    peak_memory_bytes: int = 0
    budgets: list[int] = field(default_factory=list)  # draft nodes per request chosen each round
    fallback: str | None = None  # why speculation was off for the whole run, if it was

    @property
    def new_tokens(self) -> int:
        return sum(r.new_tokens for r in self.requests)

    @property
    def drafted(self) -> int:
        return sum(r.drafted for r in self.requests)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.requests)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_round(self) -> float:
        """Mean tokens committed per request-round (the acceptance length, bonus included)."""
        request_rounds = sum(r.rounds for r in self.requests)
        return self.new_tokens / request_rounds if request_rounds else 0.0

    @property
    def accepted_by_position(self) -> list[int]:
        out: list[int] = []
        for r in self.requests:
            for i, c in enumerate(r.accepted_by_position):
                if i == len(out):
                    out.append(0)
                out[i] += c
        return out

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.e2e_s if self.e2e_s > 0 else 0.0

    @property
    def ttft_s(self) -> float:
        return float(np.median([r.ttft_s for r in self.requests])) if self.requests else 0.0

    @property
    def tpot_s(self) -> float:
        return float(np.median([r.tpot_s for r in self.requests])) if self.requests else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": len(self.requests),
            "new_tokens": self.new_tokens,
            "rounds": self.rounds,
            "plain_rounds": self.plain_rounds,
            "tokens_per_round": self.tokens_per_round,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "accepted_by_position": self.accepted_by_position,
            "proposer_s": self.proposer_s,
            "verifier_s": self.verifier_s,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "e2e_s": self.e2e_s,
            "tokens_per_s": self.tokens_per_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "mean_budget": float(np.mean(self.budgets)) if self.budgets else 0.0,
            "fallback": self.fallback,
            "per_request": [r.to_dict() for r in self.requests],
        }

    def summary(self) -> str:
        d = self.to_dict()
        lines = [
            f"requests {d['requests']}  new tokens {d['new_tokens']}  rounds {d['rounds']} (plain {d['plain_rounds']})",
            f"tokens/round {d['tokens_per_round']:.2f}  drafted {d['drafted']}  accepted {d['accepted']}"
            f"  acceptance {d['acceptance_rate']:.1%}",
            f"accepted by draft position {d['accepted_by_position'][:16]}",
            f"proposer {d['proposer_s'] * 1e3:.1f} ms  verifier {d['verifier_s'] * 1e3:.1f} ms"
            f"  TTFT {d['ttft_s'] * 1e3:.1f} ms  TPOT {d['tpot_s'] * 1e3:.1f} ms  e2e {d['e2e_s']:.3f} s",
            f"throughput {d['tokens_per_s']:.1f} tok/s  peak memory {d['peak_memory_bytes'] / 2**20:.0f} MiB"
            + (f"  fallback: {d['fallback']}" if d["fallback"] else ""),
        ]
        return "\n".join(lines)


@dataclass
class GenerationResult:
    sequences: list[list[int]]
    stats: GenerationStats
    texts: list[str] | None = None


# ------------------------------------------------------------------------------------------ cost model


class CostModel:
    """Seconds per forward pass as a function of the new tokens it feeds (all rows together, padding
    included), interpolated linearly between measured sizes and extrapolated proportionally beyond.

    The measured curve is corrected online per batch size (`observe`), so passes of one batch size
    (longer contexts, more rows) never distort the relative costs another batch size decides on.
    Within a batch size the correction is a speed factor common to every size, which every observed
    pass moves, times a shape factor per observed size, which moves `SHAPE_RATE` times slower and
    keeps a geometric mean of 1 over the observed sizes: the machine's speed shows at once in every
    size, including sizes seldom or never observed, and only a lasting difference in shape stays per size."""

    SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
    SHAPE_RATE = 0.2

    def __init__(self, sizes, seconds):
        order = np.argsort(sizes)
        self.sizes = np.asarray(sizes, np.float64)[order]
        self._measured = np.asarray(seconds, np.float64)[order]
        self._size_list = self.sizes.tolist()
        self._measured_list = self._measured.tolist()
        self._log_sizes = np.log(self.sizes).tolist()
        self._speed: dict[int, float] = {}  # batch size -> factor on every size's measured cost
        self._factors: dict[int, list[float]] = {}  # batch size -> shape factor per size (1 if unobserved)
        self._seen: dict[int, list[bool]] = {}  # batch size -> which sizes were observed
        self._curves: dict[int, np.ndarray] = {}
        self.seconds = self._curve(1)

    def _raw(self, batch: int) -> np.ndarray:
        """The corrected curve of `batch` rows before it is made monotone."""
        factors = self._factors.get(batch)
        return self._measured if factors is None else self._measured * (self._speed[batch] * np.asarray(factors))

    def _curve(self, batch: int) -> np.ndarray:
        curve = self._curves.get(batch)
        if curve is None:
            curve = self._curves[batch] = np.maximum.accumulate(self._raw(batch))  # never cheaper when bigger
        return curve

    def observe(self, tokens: int, seconds: float, weight: float = 0.1, batch: int = 1) -> None:
        """A pass of `batch` rows feeding `tokens` took `seconds`: the batch's speed moves by at most
        `weight` toward it, the nearest measured size's shape by `weight * SHAPE_RATE` toward what is
        left, so the curve follows the machine as it is now (load, threads). Sizes observed alike
        converge to what they cost, the others to their measured cost times the batch's speed."""
        batch = int(batch)
        if not (tokens > 0 and seconds > 0):
            return
        log_t = math.log(max(tokens, 1))
        i = min(range(len(self._log_sizes)), key=lambda k: abs(self._log_sizes[k] - log_t))
        factors = self._factors.setdefault(batch, [1.0] * len(self._size_list))
        seen = self._seen.setdefault(batch, [False] * len(self._size_list))
        speed = self._speed.setdefault(batch, 1.0)
        # against the curve before it is made monotone: a pass cheaper than a smaller one is matched by
        # its own shape factor instead of driving it (and through the mean, the speed) down without end
        sizes, measured = self._size_list, self._measured_list
        t = float(tokens)
        j = next((k for k, size in enumerate(sizes) if size >= t), len(sizes))  # plain floats: every round
        if j == len(sizes):
            expected = measured[-1] * speed * factors[-1] * t / sizes[-1]
        elif j == 0 or sizes[j] == t:
            expected = measured[j] * speed * factors[j]
        else:
            a, b = measured[j - 1] * speed * factors[j - 1], measured[j] * speed * factors[j]
            expected = a + (b - a) * (t - sizes[j - 1]) / (sizes[j] - sizes[j - 1])
        # one pass moves the curve by at most `weight`: a load spike is one sample, not a new machine
        step = (1.0 - weight) + weight * min(max(seconds / expected, 0.5), 2.0)
        speed *= step
        rate = weight * self.SHAPE_RATE
        factors[i] *= (1.0 - rate) + rate * min(max(seconds / (expected * step), 0.5), 2.0)
        seen[i] = True
        # the observed shape factors' geometric mean goes into the speed: an observation of one size
        # leaves the other observed sizes' costs as they are
        mean = math.exp(sum(math.log(f) for f, o in zip(factors, seen) if o) / sum(seen))
        self._speed[batch] = speed * mean
        for k, o in enumerate(seen):
            if o:
                factors[k] /= mean
        self._curves.pop(batch, None)
        if batch == 1:
            self.seconds = self._curve(1)

    def __call__(self, tokens, batch: int = 1) -> np.ndarray:
        curve = self._curve(int(batch))
        tokens = np.asarray(tokens, np.float64)
        inside = np.interp(tokens, self.sizes, curve)
        beyond = curve[-1] * tokens / self.sizes[-1]
        return np.where(tokens > self.sizes[-1], beyond, inside)

    def relative(self) -> dict[int, float]:
        return {int(s): float(c / self.seconds[0]) for s, c in zip(self.sizes, self.seconds)}

    def to_dict(self):
        return {"sizes": self.sizes.tolist(), "seconds": self.seconds.tolist()}

    @classmethod
    def measure(cls, model, sizes=SIZES, past: int = 256, repeats: int = 7) -> CostModel:
        """Time passes of `sizes` new tokens (a linear draft) after a `past`-token prefix (each pass
        keeps its first token, so the context grows by two tokens per size and repeat)."""
        import torch

        from .verify import KVState

        vocab = int(model.get_input_embeddings().weight.shape[0])
        rng = np.random.default_rng(0)
        state = KVState(model, 1)
        state.forward([rng.integers(0, vocab, past).tolist()], [DraftTree.empty()])
        state.commit([[]])
        cuda = state.device.type == "cuda"
        trees = {1: DraftTree.empty()}  # the one-token step every size is paired with
        for size in sizes:
            if size > 1:
                trees[size] = DraftTree(rng.integers(0, vocab, size - 1), np.arange(size - 1) - 1)

        def timed(size: int) -> float:
            if cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            state.forward([[int(rng.integers(0, vocab))]], [trees[size]])
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t
            state.commit([[]])
            return seconds

        # Each size is timed right after a one-token step and kept as the ratio of the pair, the
        # curve being the median one-token step times the median ratio per size. The machine's speed
        # drifts by 20-40% within seconds on a shared host (one-token steps of SmolLM2-135M moved
        # between 18 and 26 ms in 0.5 s windows), and a curve of absolute medians taken through such
        # a drift made 4-token passes look 1.01x a step where generation rounds saw 1.10x; adjacent
        # pairs see the same machine. Sizes are interleaved round by round, so a load spike hits one
        # sample of one size; the first round warms up.
        steps: list[float] = []
        ratios: dict[int, list[float]] = {size: [] for size in sizes}
        for rep in range(repeats + 1):
            for size in sizes:
                step = timed(1)
                pass_s = timed(size)
                if rep:
                    steps.append(step)
                    ratios[size].append(pass_s / step if size > 1 else 1.0)
        step = float(np.median(steps))
        seconds = [step * float(np.median(ratios[size])) for size in sizes]
        return cls(list(sizes), seconds)

    @classmethod
    def cached(cls, model) -> CostModel:
        """`measure` once per (model, dtype, device, threads); kept in the user cache directory."""
        import torch

        from .tokenizer import cache_dir

        params = sum(p.numel() for p in model.parameters())
        dev = next(model.parameters()).device
        ident = json.dumps([
            "cost-v6",  # bump when `measure` or the model layers change: older curves are then re-measured
            getattr(model.config, "_name_or_path", ""), type(model).__name__, params,
            sorted({type(m).__name__ for m in model.modules()}),  # prepacked or dense layers
            sorted({str(getattr(m, "layout", "")) for m in model.modules()}), torch.__version__,  # their layout
            str(next(model.parameters()).dtype), str(dev),
            torch.cuda.get_device_name(dev) if dev.type == "cuda" else os.cpu_count(), torch.get_num_threads(),
            getattr(model.config, "_attn_implementation", None),
        ])
        path = cache_dir() / "cost" / (hashlib.sha256(ident.encode()).hexdigest()[:16] + ".json")
        try:
            data = json.loads(path.read_text())
            return cls(data["sizes"], data["seconds"])
        except (OSError, ValueError, KeyError):
            pass
        model_cost = cls.measure(model)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({**model_cost.to_dict(), "identity": ident}))
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("could not cache the cost curve in %s: %s", path, exc)
        return model_cost


class RankCalibration:
    """Observed acceptance of draft nodes relative to their scores, by the node's rank in its tree.

    A tree's scores are the proposer's estimates of each node's acceptance. How far they are off
    depends on the workload *and* on the rank: replaying the shipped traces at budget 64, code edits
    accept their best node 0.93x as often as scored and ranks 33-64 1.47x, chat 0.69x and 0.24x.
    One scalar cannot size trees for both, so the ratio is kept per rank bucket (1, 2, 3-4, 5-6,
    7-8, 9-12, ... geometric), as exponentially decayed sums of scores and of accepted nodes, with
    `prior` units of score at ratio `prior_ratio` in every bucket. The prior ratio is below 1 on
    purpose: a wrong draft costs a batch its padded pass, and a workload whose drafts beat their
    scores (code edits) proves it within a few rounds, while one whose drafts fall short (chat at
    concurrency 4 lost 5-7% to drafts whose scores were believed) would pay until it had."""

    EDGES = np.array([1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024], np.int64)

    def __init__(self, decay: float = 0.995, prior: float = 2.0, prior_ratio: float = 0.7, low: float = 0.05,
                 high: float = 3.0):
        self.decay, self.prior, self.low, self.high = float(decay), float(prior), float(low), float(high)
        self.prior_ratio = float(prior_ratio)
        n = len(self.EDGES) + 1
        self.scored = np.zeros(n)  # decayed sum of drafted nodes' scores, per rank bucket
        self.accepted = np.zeros(n)  # decayed count of accepted nodes, per rank bucket
        self._factors: np.ndarray | None = None  # per bucket, until the next observation

    _RANK_BUCKETS = np.searchsorted(EDGES, np.arange(1, 2 * int(EDGES[-1]) + 1), side="left")

    def buckets(self, n: int) -> np.ndarray:
        """The bucket of ranks 1..n."""
        if n <= self._RANK_BUCKETS.shape[0]:
            return self._RANK_BUCKETS[:n]
        return np.searchsorted(self.EDGES, np.arange(1, n + 1), side="left")

    def factors(self, n: int) -> np.ndarray:
        """Multipliers for the scores of ranks 1..n."""
        if self._factors is None:
            self._factors = np.clip(self._ratio(), self.low, self.high)
        return self._factors[self.buckets(n)]

    def _ratio(self) -> np.ndarray:
        """Accepted nodes over their scores per bucket, prior included (before clipping)."""
        return (self.accepted + self.prior * self.prior_ratio) / (self.scored + self.prior)

    def apply(self, sorted_scores: np.ndarray, scale: float = 1.0) -> np.ndarray:
        """Calibrated acceptance estimates of a tree's scores sorted best first (times `scale`), each at most 1."""
        return np.minimum(sorted_scores * (self.factors(len(sorted_scores)) * scale), 1.0)

    def observe(self, trees, accepted_nodes) -> None:
        """One round: every verified tree with the indices of its accepted nodes."""
        self.scored *= self.decay
        self.accepted *= self.decay
        self._factors = None
        for tree, acc in zip(trees, accepted_nodes):
            if not len(tree):
                continue
            order = np.argsort(-tree.scores, kind="stable")  # rank r holds node order[r]
            bucket = self.buckets(len(tree))
            np.add.at(self.scored, bucket, tree.scores[order])
            if len(acc):
                rank = np.empty(len(tree), np.int64)
                rank[order] = np.arange(len(tree))
                np.add.at(self.accepted, bucket[rank[np.asarray(acc, np.int64)]], 1.0)

    def to_dict(self) -> dict:
        edges = [1, *(int(e) + 1 for e in self.EDGES)]
        return {f"rank>={lo}": round(float(r), 3) for lo, r, w in zip(edges, self._ratio(), self.scored) if w > 0}


def prune_tree(tree: DraftTree, size: int, max_depth: int) -> DraftTree:
    """The best `size` nodes of `tree` by score (a closed subtree) no deeper than `max_depth`."""
    n = len(tree)
    if n == 0 or size <= 0 or max_depth <= 0:
        return DraftTree.empty()
    if n <= size and int(tree.depths.max()) <= max_depth:
        return tree
    order = np.argsort(-tree.scores, kind="stable").tolist()  # best first, ties in index order
    par, depth = tree.parents.tolist(), tree.depths.tolist()
    keep = [False] * n
    count = 0
    for i in order:
        if count >= size:
            break
        if depth[i] <= max_depth and (par[i] < 0 or keep[par[i]]):
            keep[i] = True
            count += 1
    idx = np.flatnonzero(keep)
    remap = -np.ones(n, np.int64)
    remap[idx] = np.arange(len(idx))
    parents = np.where(tree.parents[idx] >= 0, remap[np.maximum(tree.parents[idx], 0)], -1).astype(np.int32)
    # a subset closed under parents, in the original order: still topological, siblings distinct and sorted
    return DraftTree._trusted(tree.tokens[idx], parents, tree.depths[idx], tree.scores[idx])


# ------------------------------------------------------------------------------------------ fallback proposer


class PromptLookupProposer:
    """A minimal stand-in proposer (used when `suffixspec.Proposer` is unavailable): the tokens
    that followed the most recent earlier occurrence of the longest matching suffix n-gram."""

    def __init__(self, corpus=None, max_ngram: int = 3, **_options):
        self.max_ngram = max_ngram

    def start(self, prompt_ids, request_id=None, filter=None):
        return _LookupSession(list(map(int, prompt_ids)), self.max_ngram)


class _LookupSession:
    def __init__(self, tokens, max_ngram):
        self.tokens, self.max_ngram = tokens, max_ngram

    def extend(self, tokens):
        self.tokens.extend(int(t) for t in tokens)

    def propose(self, budget):
        toks = self.tokens
        for n in range(min(self.max_ngram, len(toks) - 1), 0, -1):
            tail = toks[-n:]
            for start in range(len(toks) - n - 1, -1, -1):
                if toks[start : start + n] == tail:
                    draft = toks[start + n : start + n + budget]
                    if draft:
                        scores = 0.8 ** np.arange(1, len(draft) + 1)
                        return DraftTree(draft, np.arange(len(draft)) - 1, scores)
        return DraftTree.empty()

    def close(self):
        pass


# ------------------------------------------------------------------------------------------ the generator


class SpeculativeGenerator:
    """Speculative decoding with model-free draft trees over a transformers causal LM.

    `model`: any transformers causal LM (device and dtype are the model's). `tokenizer`: optional,
    lets `generate` take strings and return texts (a `suffixspec.Tokenizer` or an HF tokenizer).
    `proposer`: an object with `start(prompt_ids, request_id=None, filter=None)` returning sessions
    (`extend`, `propose(budget) -> DraftTree`, `close`); default `suffixspec.Proposer(**proposer_options)`.
    `min_gain`: with `budget="auto"`, a round speculates only when its predicted committed tokens
    per second beat plain decoding by this factor (a margin for the error of the prediction), plus
    `batch_margin` per row beyond the first (8 chat prompts served 4 at a time, 64 new tokens: 0.93x
    plain decoding at 0.01, 0.96-0.99x at 0.03-0.1; code edits the same way 1.03x at 0.01, 1.02-1.06x
    at 0.06, 0.99x at 0.15). `prefill_margin`: drafts ride along a prompt's first
    pass only when their predicted tokens exceed this many times the decode steps their extra pass
    time would buy (with 1, 60-node trees added 30-50% to the TTFT of 200-token chat prompts).
    """

    def __init__(self, model, tokenizer=None, proposer=None, *, max_budget: int = DEFAULT_MAX_BUDGET,
                 cost_model: CostModel | None = None, min_gain: float = 1.0, batch_margin: float = 0.06,
                 prefill_margin: float = 2.0,
                 **proposer_options):
        self.model = model
        self.tokenizer = tokenizer
        self._proposer = proposer
        self._proposer_options = proposer_options
        self.max_budget = int(max_budget)
        self.min_gain = float(min_gain)
        self.batch_margin = float(batch_margin)
        self.prefill_margin = float(prefill_margin)
        self.cost_model = cost_model
        self.calibration = RankCalibration()  # observed acceptance / scores, by rank in the tree
        self._unsupported: str | None = None
        self._checked = False

    @property
    def proposer(self):
        if self._proposer is None:
            try:
                from .proposer import Proposer
            except ImportError:
                log.warning("suffixspec.Proposer is unavailable; using a plain prompt-lookup proposer")
                Proposer = PromptLookupProposer
            self._proposer = Proposer(**self._proposer_options)
        return self._proposer

    # ---------------------------------------------------------------------------------- inputs

    def _encode(self, inputs) -> list[list[int]]:
        if isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], (int, np.integer))):
            inputs = [inputs]
        if not isinstance(inputs, (list, tuple)) or not inputs:
            raise BadInputTypeError(f"inputs: expected a non-empty list of token-id lists or strings, got {type(inputs).__name__}")
        out = []
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                if self.tokenizer is None:
                    raise BadInputError("inputs: strings need a tokenizer (SpeculativeGenerator(model, tokenizer=...))")
                ids = list(self.tokenizer.encode(item))
            else:
                from ._tokens import as_tokens

                ids = as_tokens(item, f"inputs[{i}]").tolist()
            if not ids:
                raise BadInputError(f"inputs[{i}]: a prompt needs at least one token")
            out.append([int(t) for t in ids])
        return out

    def _eos_set(self, eos_token_id) -> frozenset[int]:
        if eos_token_id is None:
            eos_token_id = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if eos_token_id is None:
            return frozenset()
        if isinstance(eos_token_id, (int, np.integer)):
            return frozenset([int(eos_token_id)])
        return frozenset(int(t) for t in eos_token_id)

    def _stop_matchers(self, stop) -> list[Callable[[list[int]], bool]]:
        if stop is None:
            return []
        if isinstance(stop, str) or (isinstance(stop, (list, tuple)) and stop and isinstance(stop[0], (int, np.integer))):
            stop = [stop]
        matchers = []
        for s in stop:
            if isinstance(s, str):
                if self.tokenizer is None:
                    raise BadInputError("stop: string stop sequences need a tokenizer")
                window = 2 * len(s) + 4
                matchers.append(lambda out, s=s, w=window: s in self.tokenizer.decode(out[-w:]))
            else:
                seq = [int(t) for t in s]
                if not seq:
                    raise BadInputError("stop: an empty stop sequence")
                matchers.append(lambda out, seq=seq: out[-len(seq):] == seq)
        return matchers

    # ---------------------------------------------------------------------------------- generate

    def _check_support(self) -> str | None:
        """None when tree verification works with this model (checked once), else the reason."""
        from .verify import check_tree_logits, tree_attention_support

        if not self._checked:
            self._unsupported = tree_attention_support(self.model)
            if self._unsupported is None:
                try:
                    check_tree_logits(self.model)
                except Exception as exc:  # any failure means we cannot trust tree passes
                    self._unsupported = f"tree verification self-check failed: {exc}"
            self._checked = True
        return self._unsupported

    def serve(self, **options):
        """A continuous-batching `suffixspec.serve.Server` over this generator: `add` requests at any
        time, `step` rounds; takes `generate`'s keyword arguments plus `max_batch`."""
        from .serve import Server

        return Server(self, **options)

    def generate(self, inputs, max_new_tokens: int = 128, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 eos_token_id=None, stop=None, stream: Callable[[int, list[int]], Any] | None = None,
                 logits_processor=None, budget="auto", filter=None, request_ids=None,
                 max_batch: int | None = None) -> GenerationResult:
        """Generate for every prompt of `inputs`; see the module docstring.

        `stream(request_index, tokens)` receives each round's committed tokens. `filter`: one corpus
        filter for every request, or a list with one per request (passed to the proposer).
        Sampling draws are keyed by (seed, request index in `inputs`, output position).
        `max_batch`: decode at most this many requests together, refilling freed slots in input order
        (continuous batching; default: all at once).
        """
        from .verify import Sampler, warn_once

        prompts = self._encode(inputs)
        B = len(prompts)
        filters = list(filter) if isinstance(filter, (list, tuple)) else [filter] * B
        options = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
                       top_p=top_p, seed=seed, eos_token_id=eos_token_id, stop=stop, stream=stream,
                       logits_processor=logits_processor, budget=budget, max_batch=max_batch)
        if self._check_support() is not None:
            if int(max_new_tokens) < 0:
                raise BadInputError(f"max_new_tokens: expected >= 0, got {max_new_tokens}")
            warn_once(f"suffixspec: speculation disabled for this model ({self._unsupported}); using plain decoding")
            stats = GenerationStats(requests=[RequestStats(prompt_tokens=len(p)) for p in prompts])
            sampler = Sampler(do_sample, temperature, top_k, top_p, seed, logits_processor)
            return self._plain_generate(prompts, stats, int(max_new_tokens), sampler, self._eos_set(eos_token_id),
                                        self._stop_matchers(stop), stream, do_sample, temperature, top_k, top_p)
        server = self.serve(**options)
        if server.device.type == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(server.device)
        for q, prompt in enumerate(prompts):
            server.add(prompt, key=q, filter=filters[q], request_id=request_ids[q] if request_ids is not None else None)
        return server.run()

    # ---------------------------------------------------------------------------------- helpers

    def _propose(self, proposer, sessions, limits, budget) -> list[DraftTree]:
        """One tree per row (`sessions[i]` may be None: no drafts), pruned to the budget and the row's limit."""
        if proposer is None:
            return [DraftTree.empty() for _ in sessions]
        want = self.max_budget if budget == "auto" else int(budget)
        budgets = [max(0, min(want, lim - 1)) if s is not None else 0 for s, lim in zip(sessions, limits)]
        live = [i for i, b in enumerate(budgets) if b > 0]
        trees: dict[int, DraftTree] = {}
        if live:
            live_budgets = [budgets[i] for i in live]
            batch = getattr(proposer, "propose_batch", None)
            if batch is not None and len(live) > 1:  # one session: its own call is the cheaper path
                got = batch([sessions[i] for i in live], live_budgets)
            else:
                got = [sessions[i].propose(b) for i, b in zip(live, live_budgets)]
            for i, tree in zip(live, got):
                trees[i] = tree if tree is not None else DraftTree.empty()
        out = []
        for i, (b, lim) in enumerate(zip(budgets, limits)):
            tree = trees.get(i, DraftTree.empty())
            out.append(prune_tree(tree, b, lim - 1) if len(tree) else tree)
        return out

    def _auto_prune(self, trees: list[DraftTree], limits, width: int = 1, weights=None,
                    row_factors=None) -> list[DraftTree]:
        """Choose one draft size k for the round; each row keeps its best k nodes.

        The pass is left-padded to a common width (`width` pending tokens + k nodes per row), so one k
        for all rows costs the same as per-row sizes whose largest is k. A decode round (`width` 1)
        maximises expected committed tokens per second, each row's tokens counted with its `weights`
        entry (default 1). Scores are calibrated by rank (`RankCalibration`) and scaled by the row's
        `row_factors` entry (default 1: how the request's own drafts fared so far). A prefill round
        (`width` > 1, dominated by the prompts) takes k nodes only when their expected tokens beat
        `prefill_margin` times what their extra pass time buys in plain decode rounds: that time
        delays every row's first token (TTFT), so it counts more than time spent later."""
        b = len(trees)
        scale = np.ones(b) if row_factors is None else np.asarray(row_factors, np.float64)
        best_scores = [self.calibration.apply(np.sort(t.scores)[::-1], f) if len(t) else np.zeros(0)
                       for t, f in zip(trees, scale)]
        kmax = max((len(s) for s in best_scores), default=0)
        if kmax == 0:
            return trees
        w = np.ones(b) if weights is None else np.asarray(weights, np.float64)
        gains = np.zeros(kmax + 1)
        for wi, s in zip(w, best_scores):
            c = np.concatenate([[0.0], np.cumsum(s)])
            gains += wi * c[np.minimum(np.arange(kmax + 1), len(s))]
        cost = self.cost_model(b * (np.arange(kmax + 1) + width), batch=b)
        if width > 1:
            plain_rate = float(w.sum()) / float(self.cost_model(b, batch=b))
            value = gains - self.prefill_margin * plain_rate * (cost - cost[0])
            k = int(np.argmax(value))
            if value[k] <= 0:
                k = 0
        else:
            rate = (w.sum() + gains) / cost
            k = int(np.argmax(rate))
            # a wrong guess costs every row of the batch its share of the padded pass: the margin
            # grows with the rows
            if rate[k] < (self.min_gain + self.batch_margin * (b - 1)) * rate[0]:
                k = 0  # a predicted gain within the model's error is not worth the risk of a loss
        return [prune_tree(t, k, lim - 1) if len(t) > k else t for t, lim in zip(trees, limits)]

    def _plain_generate(self, prompts, stats, max_new, sampler, eos, stops, stream, do_sample, temperature, top_k, top_p):
        """Clean fallback for models tree verification cannot serve: transformers' own generate."""
        import torch

        stats.fallback = self._unsupported
        device = next(self.model.parameters()).device
        t_start = time.perf_counter()
        outputs = []
        for q, prompt in enumerate(prompts):
            kwargs = dict(max_new_tokens=max_new, do_sample=do_sample, logits_processor=sampler.processors,
                          pad_token_id=next(iter(eos)) if eos else 0)
            if eos:
                kwargs["eos_token_id"] = sorted(eos)
            if do_sample:
                torch.manual_seed(sampler.seed + q)
                kwargs.update(temperature=temperature, top_k=top_k or 0, top_p=top_p if top_p is not None else 1.0)
            with torch.inference_mode():
                ids = torch.tensor([prompt], device=device)
                t = time.perf_counter()
                seq = self.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)[0, len(prompt):].tolist()
                stats.verifier_s += time.perf_counter() - t
            out, reason = [], "length"
            for tok in seq:
                out.append(tok)
                if tok in eos:
                    reason = "eos"
                    break
                if any(m(out) for m in stops):
                    reason = "stop"
                    break
            if stream is not None and out:
                stream(q, list(out))
            rs = stats.requests[q]
            rs.new_tokens, rs.rounds, rs.committed_per_round = len(out), len(out), [1] * len(out)
            rs.e2e_s = time.perf_counter() - t_start
            rs.finish_reason = reason
            stats.rounds += len(out)
            stats.plain_rounds += len(out)
            outputs.append(out)
        stats.e2e_s = time.perf_counter() - t_start
        stats.peak_memory_bytes = _peak_memory(device)
        texts = [self.tokenizer.decode(o) for o in outputs] if self.tokenizer is not None else None
        return GenerationResult(outputs, stats, texts)


def _peak_memory(device) -> int:
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss * (1 if os.uname().sysname == "Darwin" else 1024))
