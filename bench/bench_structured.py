"""Speculation under structured output: code edits answered inside a JSON object, with and without the
schema constraint, speculative and plain.

    python bench/bench_structured.py                        # 6 shipped edit prompts, 128 tokens, 2 repeats
    python bench/bench_structured.py --prompts 12 --max-new-tokens 160 --repeats 3 --record

The constrained speculative setting runs also without the prompt's JSON-escaped view
(`structured.escaped_view`), the drafting source made for answers that quote the prompt in a JSON
string. Each shipped copy-edit prompt (`corpora/copy_edit_prompts.jsonl`) asks the default model, through its
chat template, to return the edited function as `{"code": "..."}`. Four settings run one after the
other per prompt and repeat (interleaved): constrained by the JSON schema (`Structure.json_schema`,
llguidance) or not, at budget "auto" or 0 (plain decoding). Per setting: tokens committed per round
of the speculative runs, and decoding time per output token after the first (the prompt's reading,
the same in every setting, left out); the speed-up is plain time over speculative time at equal
constraint (medians of the per-prompt ratios; spread over repeats). Targets: tokens per
round constrained within 10% of unconstrained, and the constrained speed-up at least 80% of the
unconstrained one. Every constrained answer that stopped before its limit is checked to parse.
Prints a table, then one JSON line (`--record [PATH]`: also appended to bench/results/structured.jsonl).
Run timed benchmarks one at a time (`flock LOCKFILE python bench/bench_structured.py`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import common

SCHEMA = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"],
          "additionalProperties": False}
ASK = '\n\nAnswer with a JSON object {"code": "..."} whose "code" holds the full function.'


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    common.add_record_flag(p)
    args = p.parse_args(argv)

    import torch

    from suffixspec import SpeculativeGenerator
    from suffixspec.engine.options import DecodeOptions
    from suffixspec.engine.warmup import warm_kernels
    from suffixspec.http.chat import chat_template_for, find_chat_template
    from suffixspec.models import load_model
    from suffixspec.verify.structured import Structure

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model()
    template, _ = chat_template_for(find_chat_template("default"), tokenizer)
    rows = [json.loads(line) for line in (common.CORPORA / "copy_edit_prompts.jsonl").read_text().splitlines()]
    prompts = [tokenizer.encode(template.render([{"role": "user", "content": r["prompt"] + ASK}]))
               for r in rows[: args.prompts]]
    from suffixspec.draft.proposer import Proposer

    # no cache of past responses: every setting runs the same prompts, and greedy answers repeat
    gen = SpeculativeGenerator(model, tokenizer, proposer=Proposer(global_cache=False), prefix_cache_bytes=0)
    gen.policy.ensure_cost_model(model)
    warm_kernels()
    import suffixspec.engine.engine as engine_module

    view = engine_module.escaped_view
    # (constrained, budget, escaped view): the last constrained speculative setting drafts without
    # the prompt's JSON-escaped view (the ablation of that source)
    settings = [(False, "auto", True), (False, 0, True), (True, "auto", True), (True, 0, True), (True, "auto", False)]

    def run(prompt, constrained, budget, with_view=True):
        opts = DecodeOptions(max_new_tokens=args.max_new_tokens, budget=budget,
                             structure=Structure.json_schema(SCHEMA) if constrained else None)
        engine_module.escaped_view = view if with_view else (lambda tokenizer, prompt: None)
        server = gen.serve(options=opts)
        server.add(prompt)
        t = time.perf_counter()
        res = server.run()
        wall = time.perf_counter() - t
        rs = res.stats.requests[0]
        out = res.sequences[0]
        if constrained and rs.finish_reason != "length":
            text = tokenizer.decode(out[:-1] if out and out[-1] == tokenizer.eos_token_id else out)
            json.loads(text)  # a finished constrained answer always parses
        # decoding time per token after the first (the prompt's reading is the same for every setting
        # and would dominate answers of a few tokens)
        decode = (rs.e2e_s - rs.ttft_s) / max(1, len(out) - 1) if len(out) > 1 else wall
        return {"s_per_token": decode, "tokens_per_round": len(out) / max(1, rs.rounds),
                "tokens": len(out), "finish": rs.finish_reason, "wall_s": wall}

    run(prompts[0], True, "auto"), run(prompts[0], False, 0)  # warm-up
    results = {s: [] for s in settings}  # per setting: one dict per (repeat, prompt)
    for _ in range(args.repeats):
        for prompt in prompts:
            for s in settings:
                results[s].append(run(prompt, *s))
    return report(results, args)


def report(results, args) -> int:
    def med(s, key):
        return statistics.median(r[key] for r in results[s])

    def speedups(constrained, with_view=True):
        spec, plain = results[(constrained, "auto", with_view)], results[(constrained, 0, True)]
        return [p["s_per_token"] / q["s_per_token"] for p, q in zip(plain, spec)]

    print(f"{'constrained':>11} {'budget':>6} {'view':>5} {'tokens/round':>12} {'ms/token':>9} {'tokens':>7} "
          f"{'finished':>8}")
    for (c, b, v), rs in results.items():
        done = sum(r["finish"] != "length" for r in rs)
        print(f"{str(c):>11} {str(b):>6} {str(v):>5} {med((c, b, v), 'tokens_per_round'):>12.2f} "
              f"{med((c, b, v), 's_per_token') * 1e3:>9.2f} {med((c, b, v), 'tokens'):>7.0f} {done:>5}/{len(rs)}")
    tpr_ratio = med((True, "auto", True), "tokens_per_round") / med((False, "auto", True), "tokens_per_round")
    up_free, up_json, up_blind = speedups(False), speedups(True), speedups(True, False)
    ratio = statistics.median(up_json) / statistics.median(up_free)
    print(f"tokens per round constrained / unconstrained: {tpr_ratio:.3f} (target >= 0.90)")
    print(f"speed-up unconstrained {statistics.median(up_free):.2f}x [{min(up_free):.2f}-{max(up_free):.2f}], "
          f"constrained {statistics.median(up_json):.2f}x [{min(up_json):.2f}-{max(up_json):.2f}] "
          f"(without the escaped view {statistics.median(up_blind):.2f}x); ratio {ratio:.3f} (target >= 0.80)")
    common.emit({"prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                 "tokens_per_round": {f"{c}/{b}/{'view' if v else 'no view'}": med((c, b, v), "tokens_per_round")
                                      for c, b, v in results},
                 "speedup_constrained_without_view": statistics.median(up_blind),
                 "tokens_per_round_ratio": tpr_ratio, "speedup_unconstrained": statistics.median(up_free),
                 "speedup_constrained": statistics.median(up_json), "speedup_ratio": ratio}, args, "structured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
