"""Records of a benchmark: one per configuration, statistics over its repeats, speed-ups over plain.

Contract: `summarize(runs, settings)` groups `Run`s by (mode, concurrency) and returns one record
each (a dict: latency percentiles in ms, median throughput over repeats, tokens per round,
acceptance, per-position acceptance, time split (`time_split`: prefill, draft, verify and
the rest of the engine's steps, `timesplit`), peak memory). Every mode but `plain` is compared
with the `plain` run of the same repeat and concurrency (`prompt_lookup` with plain at concurrency 1):
`speedup` is the median throughput ratio (min/max/std/per-repeat alongside); under greedy decoding
an output that differs from plain's is a mismatch and counts as a failure; under sampling the
share of outputs identical to plain's (same draws) is reported. Records sort by concurrency, then mode.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .runs import MODES, BenchSettings, Run
from .timesplit import split_shares

__all__ = ["summarize"]


def _pct(values, q) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def _record(runs: list[Run]) -> dict[str, Any]:
    """One configuration's record over its repeats."""
    reqs = [q for run in runs for q in run.requests]
    ok = [q for q in reqs if q.get("finish_reason") != "error"]
    ms = lambda xs: [1e3 * x for x in xs]  # noqa: E731
    ttft = ms([q["ttft_s"] for q in ok])
    tpot = ms([q["tpot_s"] for q in ok if q["new_tokens"] > 1])
    e2e = ms([q["e2e_s"] for q in ok])
    queue = ms([q["queue_s"] for q in ok])
    thr = [sum(q["new_tokens"] for q in run.requests) / run.makespan_s if run.makespan_s > 0 else 0.0 for run in runs]
    rounds = sum(q["rounds"] for q in ok)
    new = sum(q["new_tokens"] for q in ok)
    drafted = sum(q["drafted"] for q in ok)
    accepted = sum(q["accepted"] for q in ok)
    by_pos: list[int] = []
    for q in ok:
        for i, c in enumerate(q["accepted_by_position"]):
            if i == len(by_pos):
                by_pos.append(0)
            by_pos[i] += c
    mode = runs[0].mode
    errors = [e for run in runs for e in run.errors]
    return {
        "mode": mode,
        "concurrency": runs[0].concurrency,
        "repeats": len(runs),
        "requests": len(reqs),
        "new_tokens": new,
        "ttft_ms": _pct(ttft, 50), "ttft_ms_p90": _pct(ttft, 90), "ttft_ms_p99": _pct(ttft, 99),
        "tpot_ms": _pct(tpot, 50), "tpot_ms_p90": _pct(tpot, 90), "tpot_ms_p99": _pct(tpot, 99),
        "e2e_ms_p50": _pct(e2e, 50), "e2e_ms_p90": _pct(e2e, 90), "e2e_ms_p99": _pct(e2e, 99),
        "queue_ms_p50": _pct(queue, 50),
        "throughput_tok_s": float(np.median(thr)) if thr else 0.0,
        "throughput_tok_s_runs": thr,
        # committed per request-round, bonus included; None where the backend reports no rounds (an endpoint)
        "mean_accepted_tokens": new / rounds if rounds else None,
        "acceptance_rate": (accepted / drafted if drafted else 0.0) if mode != "prompt_lookup" and rounds else None,
        "drafted_per_round": drafted / rounds if rounds else None,
        # fraction of request-rounds that accepted a draft token at depth d (d = 1, 2, ...)
        "accepted_by_position": [c / rounds for c in by_pos] if rounds else [],
        "proposer_s": float(sum(run.proposer_s for run in runs) / len(runs)),
        "verifier_s": float(sum(run.verifier_s for run in runs) / len(runs)),
        "peak_memory_mb": max(run.peak_memory_bytes for run in runs) / 2**20,
        "mean_budget": float(np.mean([run.mean_budget for run in runs])),
        "fallback": next((run.fallback for run in runs if run.fallback), None),
        # where the time of the runs went: prefill, draft, verify, rest (seconds, mean over repeats) and shares
        "time_split": split_shares([run.time_split for run in runs]),
        "tpot_ms_all": tpot,
        "errors": errors,
        "mismatches": 0,
        "failures": len(errors),
    }


def summarize(runs: list[Run], settings: BenchSettings) -> list[dict[str, Any]]:
    """Records, one per configuration: statistics over repeats; for greedy runs, outputs compared
    with the baseline mode (`settings.baseline`, plain decoding by default) of the same repeat and
    concurrency (a mismatch is a failure); for every other mode, the speed-up (throughput ratio,
    per repeat) over the baseline."""
    groups: dict[tuple[str, int], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.mode, run.concurrency), []).append(run)
    baseline = settings.baseline
    plain = {(run.repeat, run.concurrency): run for run in runs if run.mode == baseline}
    plain_c1 = {run.repeat: run for run in runs if run.mode == baseline and run.concurrency == 1}
    records = []
    for (mode, c), group in groups.items():
        rec = _record(group)
        if mode != baseline:
            ratios, mismatched, same_draws = [], [], []
            for run in group:
                base = plain.get((run.repeat, c)) or (plain_c1.get(run.repeat) if mode == "prompt_lookup" else None)
                if base is None:
                    continue
                t_base = sum(q["new_tokens"] for q in base.requests) / base.makespan_s if base.makespan_s else 0.0
                t_run = sum(q["new_tokens"] for q in run.requests) / run.makespan_s if run.makespan_s else 0.0
                if t_base > 0:
                    ratios.append(t_run / t_base)
                if settings.do_sample and mode != "prompt_lookup":
                    # same draws per (seed, request, position): lossless sampling reproduces plain outputs
                    same_draws.extend(a == b for a, b in zip(run.outputs, base.outputs))
                if not settings.do_sample:
                    for q, (a, b) in enumerate(zip(run.outputs, base.outputs)):
                        if a != b:
                            mismatched.append({"repeat": run.repeat, "request": run.requests[q]["id"],
                                               "first_difference": next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                                                                        min(len(a), len(b)))})
            rec["mismatches"] = len(mismatched)
            if same_draws:
                rec["sampled_identical_to_plain"] = f"{sum(same_draws)}/{len(same_draws)}"
            rec["mismatched_requests"] = mismatched[:20]
            rec["failures"] += len(mismatched)
            if ratios:
                rec["speedup"] = float(np.median(ratios))
                rec["speedup_min"] = float(min(ratios))
                rec["speedup_max"] = float(max(ratios))
                rec["speedup_std"] = float(np.std(ratios, ddof=1)) if len(ratios) > 1 else 0.0
                rec["speedup_runs"] = ratios
                rec["verdict"] = "pays" if rec["speedup"] >= 1.05 else ("neutral" if rec["speedup"] >= 0.95 else "slower")
        records.append(rec)
    order: dict[str, int] = {}
    for m in (*settings.modes, *MODES):
        order.setdefault(m, len(order))
    records.sort(key=lambda r: (r["concurrency"], order.get(r["mode"], len(order))))
    return records
