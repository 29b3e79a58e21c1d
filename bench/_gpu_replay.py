"""Recorded greedy traces replayed through the real generator, charged a measured cost curve: the
`replay` and `cpu_share` sections of `gpu_check.py`.

Contract
--------
- ``load_traces(corpora, per_workload=None)``: ``{"copy_edit": [...], "chat": [...]}``, each record a
  ``(prompt, answer)`` pair of token-id lists (the shipped SmolLM2 greedy traces: copy edits of
  ``copy_edit_prompts`` + ``copy_edit_heldout``, MT-bench chat of ``chat_traces_smollm2``), ids
  renumbered densely (the proposer only compares ids, so its drafts are unchanged), no tokenizer.
- ``GridCost(points, per_token_s)``: a `CostModel` that reads a pass's seconds off measured
  ``(batch, tokens) -> seconds`` points (linear in tokens along each measured batch, linear between
  batches, clamped to the measured batches; beyond a batch's largest size ``max(last, tokens *
  per_token_s)``); it does not adapt (`observe` is a no-op): the replay's passes take no real time.
- ``replay(records, cost, concurrency, pld_tokens=10)``: charged seconds of plain decoding, of
  prompt lookup and of suffixspec at that concurrency (continuous batching), their ratios, and the
  generator's tokens per round. Every method is charged the same prefill (each prompt alone); decode
  passes are charged ``cost(rows * width, rows)``. suffixspec runs in `SpeculativeGenerator`'s
  server (proposer, automatic budget, verification bookkeeping) over `TraceModel`, its output checked
  against the recorded answer; plain and prompt lookup (transformers' rule: the last 2, then 1
  tokens at their first earlier occurrence, up to `pld_tokens`, batched like our rounds, padded to the
  widest row) are simulated with the same slots.
- ``cpu_share(records, cost, batch, rounds)``: the host time of `rounds` rounds of a full batch of
  `batch` requests (proposer, budget policy, acceptance, cache bookkeeping: all but the stand-in
  model), per round, split into proposer / policy / the rest.
"""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path

import numpy as np

from suffixspec.engine.budget import CostModel

WORKLOADS = {"copy_edit": ("copy_edit_prompts.jsonl", "copy_edit_heldout.jsonl"),
             "chat": ("chat_traces_smollm2.jsonl",)}


def load_traces(corpora: Path, per_workload: int | None = None, max_new_tokens: int | None = None) -> dict:
    raw = {}
    for name, files in WORKLOADS.items():
        recs = []
        for f in files:
            for line in (Path(corpora) / f).read_text(encoding="utf-8").splitlines():
                if line.strip():
                    r = json.loads(line)
                    answer = r["output_ids"][:max_new_tokens] if max_new_tokens else r["output_ids"]
                    if answer:
                        recs.append((list(r["prompt_ids"]), list(answer)))
        raw[name] = recs[:per_workload] if per_workload else recs
    ids = sorted({t for recs in raw.values() for p, a in recs for t in p + a})
    dense = {t: i for i, t in enumerate(ids)}
    return {name: [([dense[t] for t in p], [dense[t] for t in a]) for p, a in recs] for name, recs in raw.items()}


class GridCost(CostModel):
    def __init__(self, points: list[dict], per_token_s: float):
        curves: dict[int, list[tuple[float, float]]] = {}
        for p in points:
            curves.setdefault(int(p["batch"]), []).append((float(p["tokens"]), float(p["seconds"])))
        self.grid = {b: (np.array([t for t, _ in sorted(c)]), np.array([s for _, s in sorted(c)]))
                     for b, c in sorted(curves.items())}
        self.per_token_s = float(per_token_s)
        sizes, seconds = self.grid[min(self.grid)]
        super().__init__(sizes.tolist(), seconds.tolist())

    def observe(self, *args, **kwargs) -> None:
        return

    def _along(self, batch: int, tokens: np.ndarray) -> np.ndarray:
        sizes, seconds = self.grid[batch]
        inside = np.interp(tokens, sizes, seconds)
        return np.where(tokens > sizes[-1], np.maximum(seconds[-1], tokens * self.per_token_s), inside)

    def __call__(self, tokens, batch: int = 1) -> np.ndarray:
        tokens = np.asarray(tokens, np.float64)
        batches = sorted(self.grid)
        b = min(max(int(batch), batches[0]), batches[-1])
        hi = next(x for x in batches if x >= b)
        lo = max(x for x in batches if x <= b)
        if hi == lo:
            return self._along(lo, tokens)
        f = (b - lo) / (hi - lo)
        return (1 - f) * self._along(lo, tokens) + f * self._along(hi, tokens)


def trace_model(sequences: list[np.ndarray], vocab: int, marker0: int):
    """A stand-in causal LM replaying `sequences` (request i's marker `marker0 + i`, prompt, answer):
    its greedy choice at position q of request i's row is ``sequences[i][q + 1]``. Rows are told apart
    by the marker a request's prompt starts with, kept per row in a one-layer KV cache of request
    indexes that `KVState` moves, compacts and crops with the rows."""
    import torch
    from transformers import GenerationConfig, PretrainedConfig

    longest = max(len(s) for s in sequences)
    table = np.zeros((len(sequences), longest), np.int64)  # [requests, positions]
    for i, s in enumerate(sequences):
        table[i, : len(s)] = s

    class TraceModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1))  # device and dtype for KVState
            self.config = PretrainedConfig(vocab_size=vocab)
            self.config._attn_implementation = "sdpa"
            self.generation_config = GenerationConfig(eos_token_id=-1)
            self.passes: list[tuple[int, int, bool]] = []  # rows, width, prefill (an empty cache)
            self.model_s = 0.0  # host time spent in this stand-in

        def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=True,
                    logits_to_keep=0):
            t0 = time.perf_counter()
            b, w = input_ids.shape
            layer = cache.layers[0] if len(cache.layers) else None
            keys = getattr(layer, "keys", None)
            prefill = keys is None or keys.numel() == 0
            rid = (input_ids[:, 0] - marker0) if prefill else keys[:, 0, 0, 0].long()  # [b]
            ids = rid.to(torch.float32)[:, None, None, None].expand(b, 1, w, 1).contiguous()
            cache.update(ids, ids, 0)
            keep = w if not logits_to_keep else int(logits_to_keep)
            pos = np.minimum(position_ids[:, w - keep :].numpy() + 1, longest - 1)  # [b, keep]
            nxt = table[rid.numpy()[:, None], pos]  # [b, keep]
            logits = torch.full((b, keep, vocab), -1e4)
            logits.scatter_(2, torch.from_numpy(nxt)[..., None], 0.0)
            self.passes.append((b, w, prefill))
            self.model_s += time.perf_counter() - t0
            return type("Out", (), {"logits": logits})()

    return TraceModel()


def _server(records, cost, concurrency: int, budget="auto"):
    """A server over a fresh generator and stand-in model holding `records`, every request added."""
    from suffixspec.draft.proposer import Proposer
    from suffixspec.generate import SpeculativeGenerator

    vocab = 1 + max(t for p, a in records for t in p + a)
    seqs = [np.array([vocab + i] + p + a + [0], np.int64) for i, (p, a) in enumerate(records)]
    model = trace_model(seqs, vocab + len(records), vocab)
    gen = SpeculativeGenerator(model, proposer=Proposer(global_cache=False), cost_model=cost, prefix_cache_bytes=0)
    gen.assume_support(None)  # the stand-in has no attention to check
    server = gen.serve(max_batch=concurrency, max_step_tokens=1 << 30, budget=budget)
    for i, (p, a) in enumerate(records):
        server.add([vocab + i] + p, max_new_tokens=len(a), key=i)
    return server, model


def _ours(records, cost, concurrency: int) -> tuple[float, float]:
    """(charged decode seconds, tokens per round) of suffixspec's generator at `concurrency`."""
    server, model = _server(records, cost, concurrency)
    result = server.run()
    for i, (p, a) in enumerate(records):
        if result.sequences[i] != a:
            raise RuntimeError(f"the replay of record {i} diverged from its recorded answer")
    decode = sum(float(cost(b * w, b)) for b, w, prefill in model.passes if not prefill)
    return decode, sum(len(a) for _, a in records) / max(result.stats.rounds, 1)


def _simulated(records, cost, concurrency: int, draft_tokens: int) -> float:
    """Charged decode seconds of plain decoding (`draft_tokens` 0) or prompt lookup, continuous batching."""
    from suffixspec.bench.peers import prompt_lookup_propose

    queue, active, total = deque(records), [], 0.0
    while queue or active:
        while queue and len(active) < concurrency:
            p, a = queue.popleft()
            if len(a) > 1:  # the prefill chose the first token
                active.append([list(p) + a[:1], a, 1])
        if not active:
            continue
        drafts = []
        for ctx, a, pos in active:
            d = prompt_lookup_propose(np.asarray(ctx, np.int32), draft_tokens, 2).tolist() if draft_tokens else []
            drafts.append(d[: len(a) - pos - 1])
        width = 1 + max(len(d) for d in drafts)
        total += float(cost(len(active) * width, len(active)))
        for row, d in zip(active, drafts):
            ctx, a, pos = row
            n = 0
            while n < len(d) and d[n] == a[pos + n]:
                n += 1
            ctx += a[pos : pos + n + 1]
            row[2] = pos + n + 1
        active = [row for row in active if row[2] < len(row[1])]
    return total


def replay(records, cost, concurrency: int, pld_tokens: int = 10) -> dict:
    prefill = sum(float(cost(len(p) + 1, 1)) for p, _ in records)  # (+1: the marker)
    ours, per_round = _ours(records, cost, concurrency)
    plain = _simulated(records, cost, concurrency, 0)
    pld = _simulated(records, cost, concurrency, pld_tokens)
    return {"prompts": len(records), "prefill_s": round(prefill, 4), "plain_s": round(prefill + plain, 4),
            "pld_s": round(prefill + pld, 4), "ours_s": round(prefill + ours, 4),
            "ours_vs_plain": round((prefill + plain) / (prefill + ours), 3),
            "ours_vs_pld": round((prefill + pld) / (prefill + ours), 3),
            "decode_ours_vs_plain": round(plain / ours, 3), "decode_ours_vs_pld": round(pld / ours, 3),
            "tokens_per_round": round(per_round, 3)}


def cpu_share(records, cost, batch: int, rounds: int) -> dict:
    """See the module docstring; `records` are cycled up to `batch` requests."""
    reqs = [records[i % len(records)] for i in range(batch)]
    server, model = _server(reqs, cost, batch)
    while server.waiting or server.prefilling:  # admit everyone: prefills, then the first round
        server.step()
    server.step()
    stats = server.stats
    p0, b0, m0, rows = stats.proposer_s, stats.budget_s, model.model_s, 0
    t0 = time.perf_counter()
    done = 0
    while done < rounds and server.running:
        rows += server.running
        server.step()
        done += 1
    wall = time.perf_counter() - t0
    host = wall - (model.model_s - m0)
    proposer, policy = stats.proposer_s - p0, stats.budget_s - b0
    server.close()  # (its closes are charged to the proposer: read before)
    per = 1e3 / max(done, 1)
    return {"batch": batch, "rounds": done, "mean_rows": round(rows / max(done, 1), 1),
            "host_ms_per_round": round(host * per, 3), "proposer_ms": round(proposer * per, 3),
            "policy_ms": round(policy * per, 3), "rest_ms": round((host - proposer - policy) * per, 3)}
