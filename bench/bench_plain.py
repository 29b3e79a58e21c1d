"""Plain mode (the engine at budget 0, one row) against transformers' `generate`, greedy.

    python bench/bench_plain.py [--prompts 6] [--max-new-tokens 64] [--repeats 3] [--workload chat]

Both decode the same prompts one at a time, alternating, after one warm-up round each; the
figure is tokens per second over the whole set (median over repeats, with the range). Plain mode
must not be slower than the library it replaces at one row. Prints a table, then one JSON line.
Run timed benchmarks one at a time (`flock /tmp/suffixspec-bench.lock python bench/bench_plain.py`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workload", default="chat")
    args = p.parse_args(argv)

    import torch

    from suffixspec import SpeculativeGenerator
    from suffixspec.bench.workloads import load_workload
    from suffixspec.models import load_model

    model, tokenizer = load_model()
    gen = SpeculativeGenerator(model, tokenizer)
    prompts = gen.encode([r.prompt for r in load_workload(args.workload).requests[: args.prompts]])

    def ours() -> float:
        t, n = time.perf_counter(), 0
        for prompt in prompts:
            n += len(gen.generate([prompt], max_new_tokens=args.max_new_tokens, budget=0).sequences[0])
        return n / (time.perf_counter() - t)

    def theirs() -> float:
        t, n = time.perf_counter(), 0
        with torch.inference_mode():
            for prompt in prompts:
                ids = torch.tensor([prompt])
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                                     do_sample=False, pad_token_id=tokenizer.eos_token_id or 0)
                n += out.shape[1] - len(prompt)
        return n / (time.perf_counter() - t)

    ours(), theirs()
    a, b = [], []
    for _ in range(args.repeats):
        a.append(ours())
        b.append(theirs())
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{'decoder':<24} {'tok/s':>7} {'range':>14}")
    print(f"{'plain mode (budget 0)':<24} {ma:>7.1f} {f'[{min(a):.1f}-{max(a):.1f}]':>14}")
    print(f"{'transformers generate':<24} {mb:>7.1f} {f'[{min(b):.1f}-{max(b):.1f}]':>14}")
    print(f"ratio {ma / mb:.3f}")
    print(json.dumps({"workload": args.workload, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                      "plain_tok_s": ma, "generate_tok_s": mb, "ratio": ma / mb, "plain_runs": a, "generate_runs": b}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
