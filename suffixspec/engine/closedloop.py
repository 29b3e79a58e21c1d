"""A closed-loop harness for the automatic budget: the real engine and proposer, a scripted model and
a simulated clock driven by a given cost curve.

`ScriptLaw` is a causal LM given as a rule: the token after token x at position p is a deterministic
function of (x, p) (a successor of x from a small table, or with probability `novel` a hashed
token). `scripted_model` wraps a tiny transformers model (so `KVState`, tree masks and the cache run
for real) and replaces its logits with that rule's one-hot choice; a tree pass then gives every node
the logits a sequential pass would, as the tree check requires. Each forward pass advances a
`SimClock` by `SimCurve.draw(tokens fed)` one-token steps (noise drawn per pass from a seeded
generator; spikes are slow periods at seeded simulated times, `Stalls`, the same for every budget
of a seed), and the engine reads that clock, so its online cost learning sees the simulated
hardware, not this machine. Only the model's passes take time: the proposer and the policy are free.

`WORKLOADS`: `copy` (one successor per token, few novel tokens: long copied runs) and `chat`
(three successors, many novel tokens: short, branching matches). `CURVES`: `flat` (a 64-token pass
about 1.1x a one-token step), `proportional`, `steep`, `concave`, `noisy` (flat with noise) and
`spiky` (concave with noise and spikes). `run_arm` decodes one workload with one budget and
returns the committed tokens and the simulated seconds (`ArmResult`); `compare` runs the automatic
budget beside every fixed budget, all under one recycling setting: by default the product's
(`recycles`: recycled predictions on where the start curve is flat, `options.recycle_by_default`),
or on or off as told. Greedy outputs are identical across budgets (checked).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import InternalError

__all__ = ["SimCurve", "Stalls", "SimClock", "ScriptLaw", "Workload", "ArmResult", "SeedSummary", "CURVES", "WORKLOADS",
           "FIXED_BUDGETS", "scripted_model", "recycles", "run_arm", "compare", "compare_seeds"]

FIXED_BUDGETS = (0, 2, 4, 8, 16, 32, 64)
STEP_S = 0.02  # simulated seconds of a one-token step
POSITION_GAP = 67  # prompt lengths differ by this much (more than an output's tokens)


@dataclass(frozen=True)
class SimCurve:
    """A pass feeding t tokens (all rows, padding included) costs `base(t)` one-token steps of work,
    times lognormal noise of sigma `noise` (drawn per pass). Spikes are slow periods of the machine
    at given simulated times (`Stalls`): in every step of simulated time one starts with probability
    `spike_p`, lasting `spike_len` steps, during which work runs `spike_factor` times slower. Since
    they sit at the same simulated times for every budget of a seed, budgets compared at one seed
    meet the same spikes (a paired comparison), and a spike costs a pass in proportion to the part
    of it that falls inside, not to its size."""

    name: str
    kind: str  # flat, proportional, steep, concave
    noise: float = 0.0
    spike_p: float = 0.0
    spike_factor: float = 4.0
    spike_len: float = 4.0

    def base(self, tokens) -> np.ndarray:
        t = np.maximum(np.asarray(tokens, np.float64), 1.0)
        if self.kind == "flat":
            return 1.0 + 0.1 * (t - 1.0) / 63.0
        if self.kind == "proportional":
            return t
        if self.kind == "steep":
            return 1.0 + 0.35 * (t - 1.0)
        if self.kind == "concave":
            return 1.0 + 0.5 * np.sqrt(t - 1.0)
        raise InternalError(f"unknown curve kind {self.kind!r}")

    def draw(self, tokens: int, rng: np.random.Generator) -> float:
        """One pass's work in one-token steps (noise included, spikes not: `Stalls`)."""
        cost = float(self.base(tokens))
        if self.noise:
            cost *= math.exp(rng.normal(0.0, self.noise))
        return cost

    def relative(self, sizes=(1, 2, 4, 8, 16, 32, 64, 128)) -> dict[int, float]:
        """The curve as a pinned-curve object: tree size -> cost relative to one token."""
        return {int(s): float(self.base(s) / self.base(1)) for s in sizes}


class Stalls:
    """The slow periods of a `SimCurve` in simulated steps, drawn from `seed` as time goes on: each
    starts after an exponential gap of mean 1 / `spike_p` steps from the end of the one before."""

    def __init__(self, curve: SimCurve, seed: int):
        self.p, self.factor, self.length = curve.spike_p, curve.spike_factor, curve.spike_len
        self._rng = np.random.default_rng(seed)
        self._start = self._end = -math.inf
        if self.p:
            self._next()

    def _next(self) -> None:
        self._start = (self._end if math.isfinite(self._end) else 0.0) + self._rng.exponential(1.0 / self.p)
        self._end = self._start + self.length

    def finish(self, t: float, work: float) -> float:
        """When `work` steps of work begun at step `t` end."""
        if not self.p:
            return t + work
        while True:
            while self._end <= t:
                self._next()
            if t < self._start:
                if t + work <= self._start:
                    return t + work
                work -= self._start - t
                t = self._start
            room = (self._end - t) / self.factor  # work the slow period lets through
            if work <= room:
                return t + work * self.factor
            work -= room
            t = self._end


CURVES = {c.name: c for c in (
    SimCurve("flat", "flat"), SimCurve("proportional", "proportional"), SimCurve("steep", "steep"),
    SimCurve("concave", "concave"), SimCurve("noisy", "flat", noise=0.15),
    SimCurve("spiky", "concave", noise=0.1, spike_p=0.025))}


class SimClock:
    """Simulated seconds; the scripted model's passes advance it."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class ScriptLaw:
    """The next token after `x` at position `p`: with probability `novel` a hashed token, else one of
    `succ[x]` picked by `weights` (both draws hashed from (x, p, seed))."""

    succ: np.ndarray  # int64[vocab, m]
    weights: tuple[float, ...]
    novel: float
    seed: int

    @classmethod
    def make(cls, vocab: int, branches: int, weights, novel: float, seed: int) -> ScriptLaw:
        rng = np.random.default_rng(seed)
        cycle = rng.permutation(vocab)  # one cycle through the vocabulary: the first successor
        succ = np.empty((vocab, branches), np.int64)
        succ[cycle, 0] = np.roll(cycle, -1)
        for j in range(1, branches):
            succ[:, j] = rng.integers(1, vocab, vocab)
        return cls(succ, tuple(float(w) for w in weights), float(novel), int(seed))

    def _hash(self, x: np.ndarray, p: np.ndarray, salt: int) -> np.ndarray:
        h = (x.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + p.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
             + np.uint64((self.seed * 1000003 + salt) & 0xFFFFFFFF))
        h ^= h >> np.uint64(31)
        h *= np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(29)
        return h

    def next_tokens(self, x: np.ndarray, p: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.int64)
        p = np.asarray(p, np.int64)
        with np.errstate(over="ignore"):
            u = (self._hash(x, p, 1) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
            jump = (self._hash(x, p, 2) % np.uint64(self.succ.shape[0] - 1)).astype(np.int64) + 1
        cum = np.cumsum(self.weights) / sum(self.weights)
        branch = np.minimum(np.searchsorted(cum, (u - self.novel) / max(1e-12, 1.0 - self.novel), side="right"),
                            self.succ.shape[1] - 1)
        return np.where(u < self.novel, jump, self.succ[np.clip(x, 0, self.succ.shape[0] - 1), branch])


@dataclass(frozen=True)
class Workload:
    name: str
    branches: int
    weights: tuple[float, ...]
    novel: float
    prompt_tokens: int
    requests: int = 8
    max_new_tokens: int = 64


WORKLOADS = {w.name: w for w in (
    Workload("copy", 1, (1.0,), 0.04, 320),
    Workload("chat", 3, (0.55, 0.3, 0.15), 0.3, 160))}


def scripted_model(law: ScriptLaw, clock: SimClock, curve: SimCurve, seed: int = 0):
    """A tiny llama whose logits follow `law`; each pass advances `clock` by the curve's cost."""
    import torch
    import transformers as tf

    vocab = law.succ.shape[0]
    torch.manual_seed(seed)
    cfg = tf.LlamaConfig(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=4096, vocab_size=vocab, bos_token_id=0,
                         eos_token_id=None, pad_token_id=0)
    model = tf.LlamaForCausalLM(cfg).eval()
    model.config._attn_implementation = "sdpa"
    model.generation_config.eos_token_id = None
    rng = np.random.default_rng(seed + 7)
    stalls = Stalls(curve, seed + 13)

    def hook(module, args, kwargs, output):
        ids = kwargs.get("input_ids", args[0] if args else None)
        pos = kwargs.get("position_ids")
        if pos is None:
            pos = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
        keep = output.logits.shape[1]
        nxt = law.next_tokens(ids[:, -keep:].cpu().numpy(), pos[:, -keep:].cpu().numpy())
        logits = torch.full(output.logits.shape, -20.0, dtype=output.logits.dtype)
        logits.scatter_(2, torch.as_tensor(nxt)[..., None], 20.0)
        output.logits = logits
        clock.now = STEP_S * stalls.finish(clock.now / STEP_S, curve.draw(int(ids.numel()), rng))
        return output

    model.register_forward_hook(hook, with_kwargs=True)
    return model


@dataclass
class ArmResult:
    budget: object
    tokens: int
    seconds: float
    rounds: int
    drafted_per_round: float
    outputs: list = field(default_factory=list, repr=False)
    recycle: bool = False  # whether its requests drafted from recycled predictions

    @property
    def throughput(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def _prompts(law: ScriptLaw, wl: Workload, seed: int) -> list[list[int]]:
    """Prompts that follow the law's successors (drawn from `seed`, not from the law's hashes, so two
    requests never coalesce into one text), of lengths `POSITION_GAP` apart: no two requests' outputs
    share a position, so their outputs differ."""
    rng = np.random.default_rng(seed)
    vocab = law.succ.shape[0]
    cum = np.cumsum(law.weights) / sum(law.weights)
    prompts = []
    for i in range(wl.requests):
        out = [int(rng.integers(1, vocab))]
        for _ in range(wl.prompt_tokens + POSITION_GAP * i - 1):
            if rng.random() < law.novel:
                out.append(int(rng.integers(1, vocab)))
            else:
                out.append(int(law.succ[out[-1], min(int(np.searchsorted(cum, rng.random(), side="right")),
                                                     law.succ.shape[1] - 1)]))
        prompts.append(out)
    order = rng.permutation(wl.requests)  # long and short prompts mixed in arrival order
    return [prompts[i] for i in order]


def recycles(curve, cost_curve=None) -> bool:
    """Whether the product drafts from recycled predictions on `curve` (a `SimCurve` or a `CURVES`
    name) started from `cost_curve` (None: the curve as a start-up measurement finds it): the
    generator's rule on its start curve (`options.recycle_by_default`)."""
    from .costmodel import CostModel
    from .options import recycle_by_default

    sim = curve if isinstance(curve, SimCurve) else CURVES[curve]
    return recycle_by_default(CostModel.from_relative(sim.relative() if cost_curve is None else cost_curve))


def run_arm(workload, curve, budget, rows: int = 4, seed: int = 0, cost_curve=None,
            learn_cost: bool = True, vocab: int = 256, recycle: bool | None = None) -> ArmResult:
    """Decode `workload` (a `Workload` or a `WORKLOADS` name) at `budget` ("auto" or a fixed size), at
    most `rows` requests together, on the simulated `curve` (a `SimCurve` or a `CURVES` name). The automatic budget starts from
    `cost_curve` (tree size -> relative cost) when given, else from the curve as a start-up
    measurement would find it at one row. `recycle`: draft from recycled predictions too (True),
    from the copy sources alone (False), or as the product decides on the start curve (None,
    `recycles`); every arm starts from an empty table."""
    from ..generate import SpeculativeGenerator
    from .budget import BudgetPolicy, CostModel
    from .engine import Engine

    wl = workload if isinstance(workload, Workload) else WORKLOADS[workload]
    sim = curve if isinstance(curve, SimCurve) else CURVES[curve]
    law = ScriptLaw.make(vocab, wl.branches, wl.weights, wl.novel, seed)
    clock = SimClock()
    model = scripted_model(law, clock, sim, seed)
    if cost_curve is None:
        cost_curve = sim.relative()
    cost = CostModel.from_relative(cost_curve, step_s=STEP_S)
    from ..draft.proposer import Proposer

    gen = SpeculativeGenerator(model, policy=BudgetPolicy(cost_model=cost, learn_cost=learn_cost),
                               proposer=Proposer(), recycle=recycle)
    if recycle is None and gen.recycle != recycles(sim, cost_curve):
        raise InternalError("closed loop: the generator's recycling default is not the rule's")
    gen.assume_support()
    engine = Engine(gen, max_batch=rows, clock=clock, max_new_tokens=wl.max_new_tokens, budget=budget)
    for prompt in _prompts(law, wl, seed + 1):
        engine.add(prompt)
    t0 = clock()
    result = engine.run()
    rounds = sum(r.rounds for r in result.stats.requests)
    drafted = sum(r.drafted for r in result.stats.requests)
    tokens = sum(len(s) for s in result.sequences)
    return ArmResult(budget, tokens, clock() - t0, result.stats.rounds, drafted / max(1, rounds),
                     [list(s) for s in result.sequences], gen.recycle)


def compare(workload, curve, budgets=FIXED_BUDGETS, rows: int = 4, seed: int = 0, **kwargs) -> dict:
    """The automatic budget beside every fixed budget, all under the same recycling setting (`run_arm`'s
    `recycle`): {"auto": ArmResult, budget: ArmResult, ..., "ratio": auto's throughput over the best
    fixed budget's}."""
    arms = {"auto": run_arm(workload, curve, "auto", rows, seed, **kwargs)}
    for b in budgets:
        arms[b] = run_arm(workload, curve, b, rows, seed, **kwargs)
    ref = arms["auto"].outputs
    if any(a.outputs != ref for a in arms.values()):
        raise InternalError("closed loop: outputs differ across budgets")
    if len({a.recycle for a in arms.values()}) > 1:
        raise InternalError("closed loop: arms differ in recycling")
    best = max(arms[b].throughput for b in budgets)
    return {**arms, "ratio": arms["auto"].throughput / best}


@dataclass(frozen=True)
class SeedSummary:
    """`compare` over several seeds, paired: every budget runs each seed's same law, prompts and cost
    draws. `best` is the fixed budget of the highest pooled throughput (all seeds' tokens over all
    their simulated seconds); `ratio` is auto's pooled throughput over it; `paired` holds auto's
    throughput over `best`'s at each seed, `per_seed_best` over that seed's own best fixed budget
    (biased low: the best of several noisy arms)."""

    seeds: tuple[int, ...]
    best: int
    ratio: float
    paired: tuple[float, ...]
    per_seed_best: tuple[float, ...]
    pooled: dict  # budget ("auto" or a fixed size) -> pooled throughput
    auto_nodes_per_round: float
    recycle: bool = False  # every arm's recycling setting

    @property
    def mean(self) -> float:
        return float(np.mean(self.paired))

    @property
    def worst(self) -> float:
        return float(np.min(self.paired))


def compare_seeds(workload, curve, budgets=FIXED_BUDGETS, rows: int = 4, seeds=(0, 1, 2), **kwargs) -> SeedSummary:
    """`compare` at each of `seeds`, summarised (`SeedSummary`)."""
    runs = [compare(workload, curve, budgets=budgets, rows=rows, seed=s, **kwargs) for s in seeds]
    arms = ("auto", *budgets)
    pooled = {a: sum(r[a].tokens for r in runs) / sum(r[a].seconds for r in runs) for a in arms}
    best = max(budgets, key=lambda b: pooled[b])
    nodes = float(np.mean([r["auto"].drafted_per_round for r in runs]))
    return SeedSummary(tuple(int(s) for s in seeds), int(best), pooled["auto"] / pooled[best],
                       tuple(r["auto"].throughput / r[best].throughput for r in runs),
                       tuple(r["ratio"] for r in runs), pooled, nodes, runs[0]["auto"].recycle)
