"""Logprobs under speculation against plain decoding's and the model's own, on the default model.

    python bench/bench_logprobs.py                    # 6 chat and code-edit prompts, 64 tokens, greedy and seeded
    python bench/bench_logprobs.py --prompts 12 --record

Each prompt is decoded with `logprobs` at budget "auto" (the logprobs of accepted tokens come from the
tree pass that verified them) and at budget 0 (plain decoding, one token per pass), greedy and seeded
sampling (temperature 0.8); the outputs must be equal, and the report gives the largest absolute
difference between the two runs' logprobs, and between the speculative ones and one forward pass of the
model over prompt and output (float64 log-softmax). The target is 1e-4 on the float32 default model.
Prints a table, then one JSON line (`--record [PATH]`: also appended to bench/results/logprobs.jsonl).
"""

from __future__ import annotations

import argparse
import sys

import common


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    common.add_record_flag(p)
    args = p.parse_args(argv)

    import torch

    from suffixspec import SpeculativeGenerator
    from suffixspec.bench.workloads import load_workload
    from suffixspec.draft.proposer import Proposer
    from suffixspec.engine.options import DecodeOptions
    from suffixspec.models import load_model

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model()
    gen = SpeculativeGenerator(model, tokenizer, proposer=Proposer(global_cache=False), prefix_cache_bytes=0)
    half = max(1, args.prompts // 2)
    texts = [r.prompt for r in load_workload("chat").requests[:half]]
    texts += [r.prompt for r in load_workload("code_edit").requests[: args.prompts - half]]
    prompts = gen.encode(texts)
    rows, worst_plain, worst_forward, accepted = [], 0.0, 0.0, 0
    for sampling in ({}, {"do_sample": True, "temperature": 0.8, "seed": 11}):
        for prompt in prompts:
            got = {}
            for budget in ("auto", 0):
                opts = DecodeOptions(max_new_tokens=args.max_new_tokens, budget=budget, logprobs=0, **sampling)
                server = gen.serve(options=opts)
                index = server.add(prompt)
                entries = []
                while not server.idle:
                    for ev in server.step().events:
                        entries.extend(ev.logprobs or [])
                got[budget] = (server.result().sequences[index], [e.logprob for e in entries])
                if budget == "auto":
                    accepted += server.result().stats.requests[index].accepted
            (spec_out, spec_lp), (plain_out, plain_lp) = got["auto"], got[0]
            if spec_out != plain_out:
                raise SystemExit("speculative output differs from plain decoding's")
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([prompt + spec_out])).logits[0].double()
            ref = torch.log_softmax(logits, -1)
            forward = [float(ref[len(prompt) - 1 + i, t]) for i, t in enumerate(spec_out)]
            d_plain = max(abs(a - b) for a, b in zip(spec_lp, plain_lp))
            d_forward = max(abs(a - b) for a, b in zip(spec_lp, forward))
            worst_plain, worst_forward = max(worst_plain, d_plain), max(worst_forward, d_forward)
            rows.append({"sampling": "seeded" if sampling else "greedy", "tokens": len(spec_out),
                         "vs_plain": d_plain, "vs_forward": d_forward})
    print(f"{'sampling':>8} {'tokens':>6} {'max |spec - plain|':>19} {'max |spec - forward|':>21}")
    for r in rows:
        print(f"{r['sampling']:>8} {r['tokens']:>6} {r['vs_plain']:>19.2e} {r['vs_forward']:>21.2e}")
    print(f"worst: {worst_plain:.2e} against plain decoding, {worst_forward:.2e} against one forward pass "
          f"(target 1e-4); {accepted} draft tokens accepted")
    common.emit({"prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "max_diff_vs_plain": worst_plain,
                 "max_diff_vs_forward": worst_forward, "accepted": accepted, "rows": rows}, args, "logprobs")
    return 0 if max(worst_plain, worst_forward) < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
