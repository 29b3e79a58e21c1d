"""What the prefix (KV) cache costs prompts it cannot help: paired runs with and without it, in process.

    python bench/bench_prefix_overhead.py                      # code_edit, chat, qa; 1 and 4 requests at once
    python bench/bench_prefix_overhead.py --model MODEL.gguf --prompts 8 --repeats 3 --record

The rollout grid's workloads (8 prompts each, 48 new tokens, greedy, automatic budget) decoded by the
continuous-batching engine at each concurrency, by two generators over one model: one with the
default prefix pool, one with `prefix_cache_bytes=0`. The pool is cleared before every run, so each
run meets its prompts for the first time (what it finds is only what the workload's own prompts
share, such as a chat template's head). The arms alternate, their order flipping every repeat, after
one warm-up run of each before the first cell. Reported per cell: the wall time with the cache over the time without it
(median of the paired ratios and their range), the share of the cached arm's time spent in the
pool's own work (lookups, copies in and out of the pool, seeding rows: timed around those calls),
the tokens it found, and whether the outputs were identical. Prints a table, then one JSON line
(`--record [PATH]`: bench/results/prefix_overhead.jsonl). Run it alone
(`flock /tmp/suffixspec-bench.lock python bench/bench_prefix_overhead.py`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import common

WORKLOADS = ("code_edit", "chat", "qa")


class PoolTimer:
    """Seconds spent inside the prefix pool's calls and `KVState.seed` while installed."""

    def __init__(self):
        self.seconds = 0.0
        self._undo = []

    def _wrap(self, owner, name: str) -> None:
        raw = owner.__dict__[name]
        original = getattr(owner, name)
        static = isinstance(raw, staticmethod)
        timer = self

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                timer.seconds += time.perf_counter() - t

        setattr(owner, name, staticmethod(timed) if static else timed)
        self._undo.append((owner, name, raw))

    def __enter__(self):
        from suffixspec.verify.kv import KVState
        from suffixspec.verify.prefix import PrefixPool

        for owner, name in ((PrefixPool, "match"), (PrefixPool, "fetch"), (PrefixPool, "insert"), (KVState, "seed")):
            self._wrap(owner, name)
        return self

    def __exit__(self, *exc):
        for owner, name, raw in reversed(self._undo):
            setattr(owner, name, raw)
        self._undo.clear()


def run_once(gen, prompts, concurrency: int, max_new: int):
    from suffixspec.engine.engine import Engine

    if gen.prefix_pool is not None:
        gen.prefix_pool.clear()
    engine = Engine(gen, max_batch=concurrency, max_new_tokens=max_new, budget="auto")
    for p in prompts:
        engine.add(p)
    t = time.perf_counter()
    result = engine.run()
    seconds = time.perf_counter() - t
    cached = sum(r.cached_tokens for r in result.stats.requests)
    return seconds, [list(s) for s in result.sequences], cached


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model (default: the embedded default model)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--concurrency", default="1,4", help="comma list of requests decoded at once")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    common.add_record_flag(ap)
    args = ap.parse_args(argv)

    import torch

    from suffixspec import SpeculativeGenerator
    from suffixspec.bench.workloads import load_workload
    from suffixspec.models import load_model

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model)
    cached_gen = SpeculativeGenerator(model, tokenizer)
    plain_gen = SpeculativeGenerator(model, tokenizer, prefix_cache_bytes=0)
    cells = []
    for name in args.workloads.split(","):
        wl = load_workload(name, limit=args.prompts)
        prompts = [r.prompt_ids or list(tokenizer.encode(r.prompt)) for r in wl.requests]
        for conc in (int(c) for c in args.concurrency.split(",")):
            if not cells:  # one warm-up run of each arm (kernels, the cost curve, first passes)
                run_once(cached_gen, prompts, conc, args.max_new_tokens)
                run_once(plain_gen, prompts, conc, args.max_new_tokens)
            ratios, shares, found, same = [], [], 0, True
            for rep in range(args.repeats):
                arms = {}
                for arm in (("cache", "off") if rep % 2 == 0 else ("off", "cache")):
                    if arm == "cache":
                        with PoolTimer() as timer:
                            arms[arm] = run_once(cached_gen, prompts, conc, args.max_new_tokens)
                        shares.append(timer.seconds / arms[arm][0])
                    else:
                        arms[arm] = run_once(plain_gen, prompts, conc, args.max_new_tokens)
                ratios.append(arms["cache"][0] / arms["off"][0])
                found = arms["cache"][2]
                same = same and arms["cache"][1] == arms["off"][1]
            cell = {"workload": name, "concurrency": conc, "time_ratio": round(statistics.median(ratios), 4),
                    "time_ratio_min": round(min(ratios), 4), "time_ratio_max": round(max(ratios), 4),
                    "pool_share": round(statistics.median(shares), 5), "cached_tokens": found,
                    "prompt_tokens": sum(len(p) for p in prompts), "identical": same}
            cells.append(cell)
            print(f"{name:10s} c={conc:<3d} time with/without cache {cell['time_ratio']:.3f} "
                  f"[{cell['time_ratio_min']:.3f}, {cell['time_ratio_max']:.3f}]  pool work "
                  f"{100 * cell['pool_share']:.2f}% of the time  cached {found}/{cell['prompt_tokens']} tokens  "
                  f"identical {same}", flush=True)
    worst = max(c["time_ratio"] for c in cells)
    result = {"benchmark": "prefix_overhead", "model": args.model or "default", "prompts": args.prompts,
              "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "threads": args.threads,
              "worst_time_ratio": worst, "cells": cells}
    common.emit(result, args, "prefix_overhead")
    return 0 if all(c["identical"] for c in cells) else 1


if __name__ == "__main__":
    raise SystemExit(main())
