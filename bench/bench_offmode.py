"""What a round costs when the automatic budget has switched speculation off, against plain mode.

    python bench/bench_offmode.py                       # chat prompts, rows 4 and 16, 48 tokens, 3 repeats
    python bench/bench_offmode.py --rows 4,16 --repeats 5 --max-new-tokens 64

The default model serves the chat workload (where the automatic budget turns itself off) at budget
"auto" and at budget 0 (plain mode), alternating, each run on a fresh generator that shares one
measured cost curve. Decode rounds only (the first step, the prompts' prefill, is left out). From
the engine's own timers, per round: the whole round, the verifier's part, and what the automatic
budget adds outside the model: `proposer_s` (drafting, feeding sessions, closing finished requests'
sessions, which adds their outputs to the cache of past responses) plus `budget_s` (sizing and
learning). Session closes are timed apart. The overhead is that addition over the plain round
(medians over repeats; the round ratio itself is shown but moves with the machine's noise far
more than the timers do). Prints a table, then one JSON line (`--record [PATH]`: also appended to
bench/results/offmode.jsonl with the date, host and git revision). Run timed benchmarks one at a time
(`flock LOCKFILE python bench/bench_offmode.py`, one lock file for all).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import common


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="4,16", help="concurrencies (rows decoded together)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--workload", default="chat")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    common.add_record_flag(p)
    args = p.parse_args(argv)
    rows_list = [int(x) for x in args.rows.split(",")]

    import torch

    import suffixspec.draft.proposer as proposer_module
    import suffixspec.draft.session as session_module
    from suffixspec import SpeculativeGenerator
    from suffixspec.bench.workloads import load_workload
    from suffixspec.engine.warmup import warm_kernels
    from suffixspec.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    closes = [0.0]

    def timed(method):
        def timed_method(*args):
            t = time.perf_counter()
            try:
                return method(*args)
            finally:
                closes[0] += time.perf_counter() - t

        return timed_method

    # the engine closes a round's finished sessions together; a checkout without that, one by one
    session_module.Session.close = timed(session_module.Session.close)
    if hasattr(proposer_module.Proposer, "close_sessions"):
        proposer_module.Proposer.close_sessions = timed(proposer_module.Proposer.close_sessions)
    model, tokenizer = load_model()
    shared = SpeculativeGenerator(model, tokenizer, prefix_cache_bytes=0)
    prompts = shared.encode([r.prompt for r in load_workload(args.workload).requests[: max(rows_list)]])

    def run(budget, rows):
        gen = SpeculativeGenerator(model, tokenizer, cost_model=shared.cost_model, prefix_cache_bytes=0)
        server = gen.serve(max_new_tokens=args.max_new_tokens, budget=budget, max_batch=rows)
        for prompt in prompts[:rows]:
            server.add(prompt)
        server.step()  # the prefill: not a decode round
        st = server.stats
        before = (st.e2e_s, st.verifier_s, st.proposer_s, st.budget_s, st.rounds, st.plain_rounds)
        closes[0] = 0.0
        while not server.idle:
            server.step()
        server.close()
        n = st.rounds - before[4]
        if shared.cost_model is None:
            shared.policy.cost_model = gen.cost_model
        return {"round_ms": (st.e2e_s - before[0]) / n * 1e3, "verifier_ms": (st.verifier_s - before[1]) / n * 1e3,
                "proposer_ms": (st.proposer_s - before[2]) / n * 1e3, "budget_ms": (st.budget_s - before[3]) / n * 1e3,
                "close_ms": closes[0] / n * 1e3, "plain_share": (st.plain_rounds - before[5]) / n}

    warm_kernels()  # every kernel, the paths two rows never reach included (a thawed cache level)
    run(0, 2), run("auto", 2)  # warm-up: the model's passes, the cost curve
    results = {}
    print(f"{'rows':>4} {'mode':>5} {'round ms':>16} {'verifier':>9} {'proposer':>9} {'closes':>7} {'budget':>7} "
          f"{'plain rounds':>12}")
    for rows in rows_list:
        runs = {0: [], "auto": []}
        for _ in range(args.repeats):
            for budget in (0, "auto"):
                runs[budget].append(run(budget, rows))
        med = {b: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for b, rs in runs.items()}
        for b in (0, "auto"):
            m, rs = med[b], runs[b]
            spread = f"[{min(r['round_ms'] for r in rs):.1f}-{max(r['round_ms'] for r in rs):.1f}]"
            print(f"{rows:>4} {str(b):>5} {m['round_ms']:>7.2f} {spread:>8} {m['verifier_ms']:>9.2f} "
                  f"{m['proposer_ms']:>9.3f} {m['close_ms']:>7.3f} {m['budget_ms']:>7.3f} {m['plain_share']:>12.2f}")
        added = [r["proposer_ms"] + r["budget_ms"] for r in runs["auto"]]
        added_no_close = [r["proposer_ms"] + r["budget_ms"] - r["close_ms"] for r in runs["auto"]]
        plain = med[0]["round_ms"]
        results[rows] = {"plain_round_ms": plain, "auto_round_ms": med["auto"]["round_ms"],
                         "added_ms": statistics.median(added), "added_pct": statistics.median(added) / plain * 100,
                         "added_without_closes_pct": statistics.median(added_no_close) / plain * 100,
                         "added_pct_range": [min(added) / plain * 100, max(added) / plain * 100],
                         "plain_share": med["auto"]["plain_share"]}
        r = results[rows]
        print(f"rows {rows}: off mode adds {r['added_ms']:.3f} ms a round = {r['added_pct']:.2f}% of a plain round "
              f"[{r['added_pct_range'][0]:.2f}-{r['added_pct_range'][1]:.2f}], {r['added_without_closes_pct']:.2f}% "
              f"without session closes; round ratio auto/plain {r['auto_round_ms'] / plain:.3f}")
    common.emit({"workload": args.workload, "max_new_tokens": args.max_new_tokens, "rows": results}, args, "offmode")
    return 0


if __name__ == "__main__":
    sys.exit(main())
