"""`n` samples of one prompt against as many separate requests: prefill work and time to the last token.

    python bench/bench_samples.py                     # n=4, temperature 0.8, 4 prompts, 48 tokens, 3 repeats
    python bench/bench_samples.py --n 8 --prompt-tokens 1500 --record

For each prompt (shipped code-edit prompts, through the default model's chat template), the same `n`
seeded samples are decoded two ways, alternating: as one family (`Engine.add(..., sibling=first)`, what
the HTTP server does for `n`: the prompt read once, its cache copied per sample) and as `n` separate
requests added together (each reads the prompt). Samples draw with keys 0..n-1 under one seed, so
both ways produce the same outputs (checked). Reports prompt tokens fed to the model and wall time
until the last sample's last token (medians; spread over repeats), and the ratios.
Prints a table, then one JSON line (`--record [PATH]`: also appended to bench/results/samples.jsonl).
Run timed benchmarks one at a time (`flock LOCKFILE python bench/bench_samples.py`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import common


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=None, help="cut each prompt to this many tokens")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    common.add_record_flag(p)
    args = p.parse_args(argv)

    import torch

    from suffixspec import SpeculativeGenerator
    from suffixspec.engine.options import DecodeOptions
    from suffixspec.engine.warmup import warm_kernels
    from suffixspec.http.chat import chat_template_for, find_chat_template
    from suffixspec.models import load_model

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model()
    template, _ = chat_template_for(find_chat_template("default"), tokenizer)
    rows = [json.loads(line) for line in (common.CORPORA / "code_edit_traces.jsonl").read_text().splitlines()]
    prompts = [tokenizer.encode(template.render([{"role": "user", "content": r["prompt"]}]))[: args.prompt_tokens]
               for r in rows[: args.prompts]]
    from suffixspec.draft.proposer import Proposer

    # no cache of past responses: every setting runs the same prompts, and greedy answers repeat
    gen = SpeculativeGenerator(model, tokenizer, proposer=Proposer(global_cache=False), prefix_cache_bytes=0)
    gen.policy.ensure_cost_model(model)
    warm_kernels()
    opts = DecodeOptions(max_new_tokens=args.max_new_tokens, do_sample=True, temperature=args.temperature, seed=7)

    def run(prompt, family: bool):
        server = gen.serve(options=opts)
        t = time.perf_counter()
        first = server.add(prompt, key=0)
        for k in range(1, args.n):
            server.add(prompt, key=k, sibling=first if family else None)
        res = server.run()
        return {"s": time.perf_counter() - t, "fed": server.stats.prefill_tokens, "outputs": res.sequences}

    run(prompts[0], True), run(prompts[0], False)  # warm-up
    got = {True: [], False: []}
    for _ in range(args.repeats):
        for prompt in prompts:
            for family in (True, False):
                got[family].append(run(prompt, family))
    same = all(a["outputs"] == b["outputs"] for a, b in zip(got[True], got[False]))
    time_ratios = [b["s"] / a["s"] for a, b in zip(got[True], got[False])]
    fed_ratios = [b["fed"] / a["fed"] for a, b in zip(got[True], got[False])]
    print(f"{'way':>9} {'prompt tokens fed':>17} {'s to last token':>16}")
    for family, name in ((True, "family"), (False, "separate")):
        rs = got[family]
        print(f"{name:>9} {statistics.median(r['fed'] for r in rs):>17.0f} {statistics.median(r['s'] for r in rs):>8.2f} "
              f"[{min(r['s'] for r in rs):.2f}-{max(r['s'] for r in rs):.2f}]")
    print(f"n={args.n}: separate / family prompt tokens {statistics.median(fed_ratios):.2f}x, time to the last token "
          f"{statistics.median(time_ratios):.2f}x [{min(time_ratios):.2f}-{max(time_ratios):.2f}]; "
          f"identical outputs: {same}")
    common.emit({"n": args.n, "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
                 "prompt_tokens": [len(p) for p in prompts], "fed_ratio": statistics.median(fed_ratios),
                 "time_ratio": statistics.median(time_ratios),
                 "time_ratio_range": [min(time_ratios), max(time_ratios)], "identical": same}, args, "samples")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
