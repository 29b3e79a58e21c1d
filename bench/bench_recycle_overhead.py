"""What keeping the recycled-prediction table costs a round: harvest (top-k over every position of
the pass, on the logits' device, then the table update), growing the merged trees and learning,
against the round itself, at 1, 4 and 16 rows.

    python bench/bench_recycle_overhead.py
    flock /tmp/suffixspec-bench.lock taskset -c 0 python bench/bench_recycle_overhead.py --record

For each row count, a real round's time comes from the default model decoding that many chat prompts
together at a fixed budget of 16 nodes (wall time over rounds, after a warm-up). The table's work
is then timed on logits and trees of the same shapes (the round's width: 1 + 16 positions a row):
`harvest_round`, `RecycleTable.grow` and `RecycleTable.learn` for every row. Medians of `--repeats`;
the spread is the min-max. Prints a table, then one JSON line (`--record [PATH]`: also appended to
bench/results/recycle_overhead.jsonl).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import common


def timed(fn, repeats: int) -> list[float]:
    fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def round_seconds(gen, prompts, rows: int, budget: int, max_new: int) -> float:
    server = gen.serve(max_new_tokens=max_new, budget=budget, max_batch=rows)
    for p in prompts[:rows]:
        server.add(p)
    server.step()  # admission (prefill) is not a decode round
    t = time.perf_counter()
    n = 0
    while not server.idle:
        server.step()
        n += 1
    wall = time.perf_counter() - t
    server.close()
    return wall / max(1, n)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,4,16")
    p.add_argument("--budget", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    common.add_record_flag(p)
    args = p.parse_args(argv)

    import torch

    from suffixspec import SpeculativeGenerator
    from suffixspec.bench.workloads import load_workload
    from suffixspec.draft.recycle import RecycleTable, harvest_round
    from suffixspec.draft.tree import DraftTree
    from suffixspec.models import load_model
    from suffixspec.verify.accept import RowResult
    from suffixspec.verify.batch import RoundBatch

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model()
    prompts = [tokenizer.encode(r.prompt) for r in load_workload("chat", 16).requests]
    gen = SpeculativeGenerator(model, tokenizer, prefix_cache_bytes=0)
    vocab = int(model.get_input_embeddings().weight.shape[0])
    rng = np.random.default_rng(0)
    table = RecycleTable(vocab)
    table.table[:, :] = rng.integers(0, vocab, (vocab, table.k))  # every row full: the most work
    rows_out = []
    print(f"{'rows':>4} {'round ms':>9} {'harvest ms':>10} {'grow ms':>8} {'learn ms':>8} {'share %':>8}")
    for rows in (int(r) for r in args.rows.split(",")):
        round_s = statistics.median(round_seconds(gen, prompts, rows, args.budget, args.max_new_tokens)
                                    for _ in range(3))
        width = 1 + args.budget
        logits = torch.randn(rows, width, vocab)
        trees = [DraftTree(rng.integers(0, vocab, args.budget), np.arange(args.budget) - 1,
                           0.9 ** np.arange(1, args.budget + 1)) for _ in range(rows)]
        contexts = [rng.integers(0, vocab, 300).tolist() for _ in range(rows)]
        batch = RoundBatch.build(trees, [64] * rows, pending=[[c[-1]] for c in contexts], contexts=contexts)
        results = [RowResult(tokens=[1, 2, 3], accepted_nodes=[0, 1]) for _ in range(rows)]
        root = np.zeros(rows, np.int64)
        harvest = timed(lambda: harvest_round(table, logits, root, batch, results), args.repeats)
        drafts = [table.grow(DraftTree.empty(), c[-2:], args.budget, 64) for c in contexts]
        grow = timed(lambda: [table.grow(t, c[-2:], args.budget, 64) for t, c in zip(trees, contexts)], args.repeats)
        learn = timed(lambda: [table.learn(d, d.tree, [1, 2, 3]) for d in drafts], args.repeats)
        h, g, ln = (statistics.median(x) for x in (harvest, grow, learn))
        share = (h + g + ln) / round_s
        print(f"{rows:>4} {round_s * 1e3:>9.1f} {h * 1e3:>10.3f} {g * 1e3:>8.3f} {ln * 1e3:>8.3f} {share * 100:>8.2f}")
        rows_out.append({"rows": rows, "round_ms": round(round_s * 1e3, 2), "harvest_ms": round(h * 1e3, 4),
                         "harvest_ms_range": [round(min(harvest) * 1e3, 4), round(max(harvest) * 1e3, 4)],
                         "grow_ms": round(g * 1e3, 4), "learn_ms": round(ln * 1e3, 4),
                         "share_of_round": round(share, 5)})
    common.emit({"benchmark": "recycle_overhead", "budget": args.budget, "threads": args.threads, "rows": rows_out},
                args, "recycle_overhead")
    return 0


if __name__ == "__main__":
    sys.exit(main())
