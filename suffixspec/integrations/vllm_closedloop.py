"""A closed-loop harness for the vLLM adapter's draft sizing: the adapter's real `DraftCore` (sessions,
proposer trees, `path_values`, `plan_lengths` with its measured step cost) driven by a scripted
target and a simulated step clock, without vLLM.

The target is a rule (`Law`): the token after x at position p is a deterministic function of (x, p)
(one of x's successors, picked by a hash of (x, p) with fixed weights, or with probability `novel`
a hashed token), so every arm generates the same outputs and a step accepts the longest draft
prefix that equals the rule's continuation, plus the bonus token (greedy verification). Requests
(prompts drawn from the rule) run `rows` at a time in vLLM's order: a step verifies every row's
draft and prefills the rows that joined, then the adapter drafts for the next step. Each step
advances a simulated clock by `STEP_S * curve(tokens)` (tokens: one a running row plus its draft;
prefills are not charged, being the same at every cap), and the adapter reads that clock, so the
cost it learns is the curve's.

`CURVES`: `flat` (a 64-token step about 1.1x a one-token step, a GPU at small batch), `proportional`,
`steep`, `concave` and `noisy` (flat with lognormal noise per step). `WORKLOADS`: `copy` (long
copied runs) and `chat` (branching, many novel tokens). `run_arm` runs one workload at the adapter's
own sizing ("auto") or at a fixed cap (every row drafts its best path up to the cap, no cost cut:
what vLLM's `suffix` and `ngram` do) and returns committed tokens and simulated seconds (`ArmResult`);
`compare` runs auto beside every fixed cap on the same law, prompts and noise.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

import numpy as np

from .vllm_drafting import AcceptCalibration
from .vllm_options import VllmSetup

__all__ = ["SimCurve", "Law", "Workload", "ArmResult", "CURVES", "WORKLOADS", "FIXED_CAPS", "run_arm", "compare"]

STEP_S = 0.02  # simulated seconds of a one-token step
FIXED_CAPS = (0, 1, 2, 4, 8)
FREE = [[1, 1.0], [10**9, 1.0 + 1e-9]]  # a fixed cap's step cost: drafts are never cut


@dataclass(frozen=True)
class SimCurve:
    """A step feeding t tokens costs `base(t)` one-token steps, times lognormal noise of sigma `noise`."""

    name: str
    kind: str
    noise: float = 0.0

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
        raise ValueError(f"SimCurve: unknown kind {self.kind!r}; expected flat, proportional, steep or concave")

    def draw(self, tokens: int, rng: np.random.Generator) -> float:
        cost = float(self.base(tokens))
        return cost * math.exp(rng.normal(0.0, self.noise)) if self.noise else cost


CURVES = {c.name: c for c in (SimCurve("flat", "flat"), SimCurve("proportional", "proportional"),
                              SimCurve("steep", "steep"), SimCurve("concave", "concave"),
                              SimCurve("noisy", "flat", noise=0.15))}


@dataclass(frozen=True)
class Law:
    """The token after x at position p: with probability `novel` a hashed token, else one of `succ[x]`
    picked by `weights` (both draws hashed from (x, p, seed))."""

    succ: np.ndarray  # int64[vocab, branches]
    cum: np.ndarray  # cumulative branch weights, last 1
    novel: float
    seed: int

    @classmethod
    def make(cls, vocab: int, weights, novel: float, seed: int) -> Law:
        rng = np.random.default_rng(seed)
        succ = rng.integers(1, vocab, (vocab, len(weights)))
        w = np.asarray(weights, np.float64)
        return cls(succ, np.cumsum(w) / w.sum(), float(novel), int(seed))

    def _hash(self, x: int, p: int, salt: int) -> int:
        h = (x * 0x9E3779B97F4A7C15 + p * 0xBF58476D1CE4E5B9 + self.seed * 1000003 + salt) & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
        h = (h * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return h ^ (h >> 29)

    def next(self, x: int, p: int) -> int:
        """The token at position p (0-based) after token x at p - 1."""
        u = (self._hash(x, p, 1) >> 11) / float(1 << 53)
        if u < self.novel:
            return int(self._hash(x, p, 2) % (self.succ.shape[0] - 1)) + 1
        branch = min(int(np.searchsorted(self.cum, (u - self.novel) / (1.0 - self.novel), side="right")), self.succ.shape[1] - 1)
        return int(self.succ[x, branch])

    def extend(self, seq: list, n: int) -> list:
        for _ in range(n):
            seq.append(self.next(seq[-1], len(seq)))
        return seq


@dataclass(frozen=True)
class Workload:
    name: str
    weights: tuple[float, ...]
    novel: float
    prompt_tokens: int
    requests: int = 16
    max_new_tokens: int = 64
    vocab: int = 64


WORKLOADS = {w.name: w for w in (
    Workload("copy", (0.9, 0.1), 0.02, 240),
    Workload("chat", (0.55, 0.3, 0.15), 0.25, 160))}


@dataclass
class ArmResult:
    cap: object  # "auto" or a fixed cap
    tokens: int  # committed output tokens
    seconds: float  # simulated
    steps: int
    drafted: int
    accepted: int
    outputs: list = field(default_factory=list, repr=False)

    @property
    def throughput(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def _prompts(law: Law, wl: Workload, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed + 101)
    return [law.extend([int(rng.integers(1, wl.vocab))], wl.prompt_tokens + int(rng.integers(0, 64)) - 1)
            for _ in range(wl.requests)]


def _core(k: int, rows: int, vocab: int, options: dict):
    from .vllm_core import DraftCore

    return DraftCore(VllmSetup(k, 8192, vocab, rows, dict(options)))


def run_arm(workload, curve, cap, rows: int = 8, seed: int = 0, k: int = 8, options: dict | None = None,
            tune=None) -> ArmResult:
    """Generate `workload` (a `Workload` or a `WORKLOADS` name), `rows` requests at a time, on the
    simulated `curve` (a `SimCurve` or a `CURVES` name), with the adapter drafting at most `k` tokens a
    row sized by its own measured cost (`cap="auto"`) or its best path up to a fixed `cap`; `options`:
    more adapter options (for auto); `tune(core)`: changes the auto arm's `DraftCore` before it runs."""
    wl = WORKLOADS[workload] if isinstance(workload, str) else workload
    curve = CURVES[curve] if isinstance(curve, str) else curve
    law = Law.make(wl.vocab, wl.weights, wl.novel, seed)
    auto = cap == "auto"
    opts = dict(options or {}) if auto else {"step_cost": FREE}
    core = _core(k, rows, wl.vocab, opts)
    clock = [0.0]
    core.clock = lambda: clock[0]
    if not auto:  # a fixed cap drafts each row's best path by the proposer's own scores
        core.calibration = AcceptCalibration(strength=math.inf)
    elif tune is not None:
        tune(core)
    rng = np.random.default_rng(seed + 7)
    queue = collections.deque(enumerate(_prompts(law, wl, seed)))
    slots: list = [None] * rows  # [request id, tokens, prompt length]
    drafts: list = [[] for _ in range(rows)]
    sampled = np.zeros(rows, np.int64)
    outputs: dict = {}
    steps = drafted = accepted = 0
    while True:
        fed, joined = 0, False
        for i, slot in enumerate(slots):  # verify the drafts of the rows already running
            if slot is None:
                continue
            seq, draft = slot[1], drafts[i]
            fed += 1 + len(draft)
            drafted += len(draft)
            n = 0
            while n < len(draft) and draft[n] == law.next(seq[-1], len(seq)):
                seq.append(draft[n])
                n += 1
            accepted += n
            law.extend(seq, 1)
            sampled[i] = n + 1
            if len(seq) - slot[2] >= wl.max_new_tokens:
                outputs[slot[0]] = seq[slot[2]: slot[2] + wl.max_new_tokens]
                slots[i] = None
        for i in range(rows):  # rows that join: prefill, then their first token
            if slots[i] is None and queue:
                rid, prompt = queue.popleft()
                slots[i] = [rid, law.extend(list(prompt), 1), len(prompt)]
                sampled[i] = 1
                joined = True
        if fed or joined:
            clock[0] += STEP_S * curve.draw(fed, rng)
            steps += 1
        live = [i for i in range(rows) if slots[i] is not None]
        drafts = [[] for _ in range(rows)]
        if not live:
            break
        lengths = np.array([len(slots[i][1]) for i in live], np.int64)
        table = np.zeros((len(live), int(lengths.max())), np.int64)
        for r, i in enumerate(live):
            table[r, : lengths[r]] = slots[i][1]
        got = core.step(live, sampled[live], lengths, table, k=k if auto else max(int(cap), 1))
        for r, i in enumerate(live):
            drafts[i] = got[r] if auto or cap else []
    core.close()
    tokens = sum(len(o) for o in outputs.values())
    return ArmResult(cap, tokens, clock[0], steps, drafted, accepted, [outputs[i] for i in sorted(outputs)])


def compare(workload, curve, caps=FIXED_CAPS, rows: int = 8, seed: int = 0, **kwargs) -> dict:
    """{"auto": ArmResult, cap: ArmResult, ...} on one law, prompts and noise (paired); the outputs are
    checked equal across arms."""
    out = {"auto": run_arm(workload, curve, "auto", rows, seed, **kwargs)}
    for cap in caps:
        out[cap] = run_arm(workload, curve, cap, rows, seed, k=kwargs.get("k", 8))
        if out[cap].outputs != out["auto"].outputs:
            raise AssertionError(f"outputs differ between auto and cap {cap}: the target is not deterministic")
    return out
