"""Statistics of requests and runs, and the result `generate` returns.

Terms: a round is one forward pass of the batch; a request-round is one request's part of it.
`RequestStats` holds one request's counts and latencies (seconds from its submission, queueing
included); `GenerationStats` a run's requests plus where the run's time went: `proposer_s`
(drafting), `budget_s` (the automatic budget sizing rounds and learning from them) and
`verifier_s` (forward passes, acceptance, cache commits), which never overlap.
"""

from __future__ import annotations

import os
import resource
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = ["RequestStats", "GenerationStats", "GenerationResult", "PhaseTimer", "peak_memory"]


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
    cached_tokens: int = 0  # prompt tokens whose keys and values came from the prefix pool
    finish_reason: str = ""  # "eos", "stop", "length", "cancelled" or "error"
    error: str = ""  # why the request failed ("error"), else empty

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


class PhaseTimer:
    """Seconds spent in named phases, read off one clock: `lap(phase)` charges the time since the
    previous lap (or since the timer started) to `phase`; `charge(stats, fields)` adds each phase's
    seconds to the `GenerationStats` field it names (phases not named are left out)."""

    def __init__(self, clock):
        self._clock = clock
        self._last = clock()
        self.spent: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = self._clock()
        self.spent[phase] = self.spent.get(phase, 0.0) + (now - self._last)
        self._last = now

    def __getitem__(self, phase: str) -> float:
        return self.spent.get(phase, 0.0)

    def total(self) -> float:
        return sum(self.spent.values())

    def charge(self, stats: "GenerationStats", fields: dict[str, str]) -> None:
        for phase, name in fields.items():
            setattr(stats, name, getattr(stats, name) + self[phase])


BUDGETS_KEPT = 65536  # per-round draft sizes a long-running server keeps


@dataclass
class GenerationStats:
    requests: list[RequestStats]
    rounds: int = 0  # forward passes of the batch
    plain_rounds: int = 0  # rounds that verified no draft at all
    proposer_s: float = 0.0  # drafting: the proposer's calls
    budget_s: float = 0.0  # the automatic budget: sizing each round and learning from it
    verifier_s: float = 0.0  # the forward pass, acceptance and the cache commit
    e2e_s: float = 0.0
    setup_s: float = 0.0  # the generator's one-time work done for this run, before its clock started
    peak_memory_bytes: int = 0
    # draft nodes verified per request-round: the most recent BUDGETS_KEPT, and the totals of all
    budgets: deque[int] = field(default_factory=lambda: deque(maxlen=BUDGETS_KEPT))
    budget_nodes: int = 0
    budget_rows: int = 0
    fallback: str | None = None  # why speculation was off for the whole run, if it was
    # prompts read: tokens fed by prefill passes (first rounds and chunks), steps that admitted,
    # and the passes that read a chunk of a long prompt (not yet its first round)
    prefill_tokens: int = 0
    prefill_steps: int = 0
    prefill_chunks: int = 0
    # decode passes (every row feeding one pending token and its tree) by the tokens each fed, rows
    # times (1 + the widest tree: rows are padded to it); what a pass costs on a given curve
    decode_pass_tokens: Counter[int] = field(default_factory=Counter)

    def forget_rounds(self) -> None:
        """Zero the run's round counts, timers and draft sizes (a warm-up's); requests, `e2e_s`, peak
        memory and `fallback` stay as they are."""
        self.rounds = self.plain_rounds = 0
        self.proposer_s = self.budget_s = self.verifier_s = 0.0
        self.budgets.clear()
        self.budget_nodes = self.budget_rows = 0
        self.decode_pass_tokens.clear()

    def record_budgets(self, sizes: list[int]) -> None:
        self.budgets.extend(sizes)
        self.budget_nodes += sum(sizes)
        self.budget_rows += len(sizes)

    @property
    def mean_budget(self) -> float:
        return self.budget_nodes / self.budget_rows if self.budget_rows else 0.0

    @property
    def new_tokens(self) -> int:
        return sum(r.new_tokens for r in self.requests)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens reused from the prefix pool, over the requests."""
        return sum(r.cached_tokens for r in self.requests)

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
            "budget_s": self.budget_s,
            "verifier_s": self.verifier_s,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "e2e_s": self.e2e_s,
            "setup_s": self.setup_s,
            "tokens_per_s": self.tokens_per_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "mean_budget": self.mean_budget,
            "fallback": self.fallback,
            "prefill_tokens": self.prefill_tokens,
            "prefill_steps": self.prefill_steps,
            "prefill_chunks": self.prefill_chunks,
            "cached_tokens": self.cached_tokens,
            "per_request": [r.to_dict() for r in self.requests],
        }

    def summary(self) -> str:
        d = self.to_dict()
        lines = [
            f"requests {d['requests']}  new tokens {d['new_tokens']}  rounds {d['rounds']} (plain {d['plain_rounds']})",
            f"tokens/round {d['tokens_per_round']:.2f}  drafted {d['drafted']}  accepted {d['accepted']}"
            f"  acceptance {d['acceptance_rate']:.1%}",
            f"accepted by draft position {d['accepted_by_position'][:16]}",
            f"proposer {d['proposer_s'] * 1e3:.1f} ms  budget {d['budget_s'] * 1e3:.1f} ms  verifier {d['verifier_s'] * 1e3:.1f} ms"
            f"  TTFT {d['ttft_s'] * 1e3:.1f} ms  TPOT {d['tpot_s'] * 1e3:.1f} ms  e2e {d['e2e_s']:.3f} s",
            f"throughput {d['tokens_per_s']:.1f} tok/s  peak memory {d['peak_memory_bytes'] / 2**20:.0f} MiB"
            + (f"  fallback: {d['fallback']}" if d["fallback"] else ""),
        ]
        if d["cached_tokens"]:
            lines.append(f"prompt tokens reused from the prefix cache {d['cached_tokens']}")
        if d["setup_s"]:
            lines.append(f"one-time warm-up {d['setup_s']:.2f} s before the clock (kernels, tree check, cost curve)")
        return "\n".join(lines)


@dataclass
class GenerationResult:
    sequences: list[list[int]]
    stats: GenerationStats
    texts: list[str] | None = None


def peak_memory(device) -> int:
    """Peak memory of this process: CUDA allocations on a GPU, else the maximum resident set size."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss * (1 if os.uname().sysname == "Darwin" else 1024))
