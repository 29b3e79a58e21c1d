"""Plain mode (the engine at budget 0, one row) against transformers' `generate`, greedy.

    python bench/bench_plain.py [--prompts 6] [--max-new-tokens 64] [--repeats 3] [--workload chat] [--threads N]

Both decode the same prompts one at a time, prompt by prompt in alternating order, after one
warm-up round each; per repeat, tokens per second over the whole set for each and their ratio;
the figure is the median of those ratios (with their range), the rates beside it. Plain mode
must not be slower than the library it replaces at one row. Prints a table, then one JSON line
(`--record [PATH]`: also appended to bench/results/plain.jsonl with the date, host and git revision).
Run timed benchmarks one at a time (`flock LOCKFILE python bench/bench_plain.py`, one lock file for all).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import common


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workload", default="chat")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    common.add_record_flag(p)
    args = p.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from suffixspec import SpeculativeGenerator
    from suffixspec.bench.workloads import load_workload
    from suffixspec.models import load_model

    model, tokenizer = load_model()
    gen = SpeculativeGenerator(model, tokenizer, prefix_cache_bytes=0)
    prompts = gen.encode([r.prompt for r in load_workload(args.workload).requests[: args.prompts]])

    def ours(prompt) -> tuple[int, float]:
        t = time.perf_counter()
        n = len(gen.generate([prompt], max_new_tokens=args.max_new_tokens, budget=0).sequences[0])
        return n, time.perf_counter() - t

    def theirs(prompt) -> tuple[int, float]:
        t = time.perf_counter()
        with torch.inference_mode():
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                                 do_sample=False, pad_token_id=tokenizer.eos_token_id or 0)
        return out.shape[1] - len(prompt), time.perf_counter() - t

    def rate(runs) -> float:
        return sum(n for n, _ in runs) / sum(s for _, s in runs)

    for prompt in prompts:  # warm-up
        ours(prompt), theirs(prompt)
    a, b, ratios = [], [], []
    for rep in range(args.repeats):
        mine, peer = [], []
        # prompt by prompt, in alternating order (ABBA): both decoders see the same stretch of the
        # host's speed, which drifts within seconds (memory bandwidth), so the per-repeat ratio is
        # the figure; the rates alone move with the host
        for i, prompt in enumerate(prompts):
            if (i + rep) % 2 == 0:
                mine.append(ours(prompt)), peer.append(theirs(prompt))
            else:
                peer.append(theirs(prompt)), mine.append(ours(prompt))
        a.append(rate(mine))
        b.append(rate(peer))
        ratios.append(a[-1] / b[-1])
    ma, mb, mr = statistics.median(a), statistics.median(b), statistics.median(ratios)
    print(f"{'decoder':<24} {'tok/s':>7} {'range':>14}")
    print(f"{'plain mode (budget 0)':<24} {ma:>7.1f} {f'[{min(a):.1f}-{max(a):.1f}]':>14}")
    print(f"{'transformers generate':<24} {mb:>7.1f} {f'[{min(b):.1f}-{max(b):.1f}]':>14}")
    print(f"ratio {mr:.3f} (median of the repeats' ratios) [{min(ratios):.3f}-{max(ratios):.3f}]")
    common.emit({"workload": args.workload, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                 "threads": torch.get_num_threads(), "plain_tok_s": ma, "generate_tok_s": mb, "ratio": mr,
                 "ratio_runs": ratios, "plain_runs": a, "generate_runs": b}, args, "plain")
    return 0


if __name__ == "__main__":
    sys.exit(main())
