"""What a plain one-token step of `KVState` costs outside the model's forward, at 1, 4 and 16 rows.

    python bench/bench_kv_step.py [--rows 1,4,16] [--steps 40] [--context 120] [--threads N] [--record [PATH]]
    PYTHONPATH=OTHER_CHECKOUT python bench/bench_kv_step.py       # the suffixspec of another revision

The default model; every row's prompt has the same length, so the cache has no holes and every
step takes the one-token path. Per step: `forward` minus the model call inside it (`KVState._run`),
greedy `accept`, and `commit`, each against the model call of the same step (medians over the
steps, with their range). Right after a forward little of this code's data is in the CPU's caches,
so these microseconds are far more than the same calls take in a tight loop. Prints a table, then
one JSON line (`--record`: also appended to bench/results/kv_step.jsonl with the date, host and the git
revision of the suffixspec timed). Run timed benchmarks one at a time (`flock LOCKFILE python ...`,
one lock file for all).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import common


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,4,16")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--context", type=int, default=120, help="prompt tokens per row")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    common.add_record_flag(p)
    args = p.parse_args(argv)

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from suffixspec.draft.tree import DraftTree
    from suffixspec.models import load_model
    from suffixspec.verify.accept import Sampler, accept
    from suffixspec.verify.batch import RoundBatch
    from suffixspec.verify.kv import KVState

    model, _ = load_model()
    vocab = int(model.config.vocab_size)
    rng = np.random.default_rng(0)
    sampler = Sampler()
    results = {}
    print(f"{'rows':>4} {'model ms':>9} {'forward us':>18} {'accept us':>18} {'commit us':>18} {'outside/model':>13}")
    for b in [int(x) for x in args.rows.split(",")]:
        state = KVState(model, b)
        prompts = rng.integers(0, vocab, (b, args.context)).tolist()
        empty = [DraftTree.empty()] * b
        state.forward(prompts, empty)
        state.commit([[]] * b)
        inner = []
        real_run = state._run

        def timed_run(*a, _real=real_run, **k):
            t = time.perf_counter()
            try:
                return _real(*a, **k)
            finally:
                inner.append(time.perf_counter() - t)

        state._run = timed_run
        rows = []
        for i in range(args.steps + 3):  # the first 3: warm-up
            pending = [[int(t)] for t in rng.integers(0, vocab, b)]
            batch = RoundBatch.build(empty, [8] * b, pending=pending, samplers=sampler, contexts=pending, generated=[i] * b)
            t0 = time.perf_counter()
            logits, root = state.forward(pending, empty)
            t1 = time.perf_counter()
            accept(logits, root, batch)
            t2 = time.perf_counter()
            state.commit([[]] * b)
            t3 = time.perf_counter()
            rows.append((t1 - t0 - inner[-1], t2 - t1, t3 - t2, inner[-1]))
        rows = rows[3:]
        med = [statistics.median(r[k] for r in rows) for k in range(4)]
        span = [(min(r[k] for r in rows), max(r[k] for r in rows)) for k in range(3)]
        outside = sum(med[:3])
        results[b] = {"model_ms": med[3] * 1e3, "forward_us": med[0] * 1e6, "accept_us": med[1] * 1e6,
                      "commit_us": med[2] * 1e6, "outside_pct": outside / med[3] * 100}
        cells = [f"{med[k] * 1e6:6.0f} [{span[k][0] * 1e6:.0f}-{span[k][1] * 1e6:.0f}]" for k in range(3)]
        print(f"{b:>4} {med[3] * 1e3:>9.2f} {cells[0]:>18} {cells[1]:>18} {cells[2]:>18} {outside / med[3] * 100:>12.2f}%")
    common.emit({"steps": args.steps, "context": args.context, "rows": results}, args, "kv_step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
