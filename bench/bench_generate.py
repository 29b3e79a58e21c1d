"""End-to-end generation speed with the embedded default model: suffixspec vs plain greedy decoding
vs transformers' prompt lookup (PLD), same run, same model, same prompts, warmed up, medians.

    python bench/bench_generate.py                       # all workloads, defaults below
    python bench/bench_generate.py --workloads code-edit --prompts 4 --max-new-tokens 128
    python bench/bench_generate.py --identity 24         # greedy identity check only

Workloads: `code-edit` (corpora/code_edit_traces.jsonl: "update this code" prompts whose answers
copy heavily from the prompt), `chat`, `summarization`, `qa` (../shared/data/specbench-dev.jsonl
or $SUFFIXSPEC_SPECBENCH). Prompts are wrapped as one ChatML user turn. The proposer runs without
its global response cache, so repeats never learn from earlier repeats. Prints a table, the
measured pass-cost curve, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPECBENCH = Path(os.environ.get("SUFFIXSPEC_SPECBENCH", ROOT.parent / "shared" / "data" / "specbench-dev.jsonl"))
CODE_EDITS = ROOT / "corpora" / "code_edit_traces.jsonl"
CHAT_CATEGORIES = ("roleplay", "reasoning", "coding", "extraction", "stem", "humanities", "writing", "math")


def chatml(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def load_prompts(workload: str, n: int) -> list[str]:
    if workload == "code-edit":
        rows = [json.loads(line) for line in CODE_EDITS.read_text(encoding="utf-8").splitlines() if line.strip()]
        rows.sort(key=lambda r: len(r["prompt"]))
        return [chatml(r["prompt"]) for r in rows[:n]]
    rows = [json.loads(line) for line in SPECBENCH.read_text(encoding="utf-8").splitlines() if line.strip()]
    cats = CHAT_CATEGORIES if workload == "chat" else (workload,)
    picked = [r for r in rows if r["category"] in cats]
    picked.sort(key=lambda r: len(r["turns"][0]))
    step = max(1, len(picked) // max(n, 1))
    return [chatml(r["turns"][0][:3000]) for r in picked[::step][:n]]


def plain(model, ids, max_new, **kw):
    import torch

    with torch.inference_mode():
        x = torch.tensor([ids])
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                             pad_token_id=model.generation_config.eos_token_id, **kw)
    return out[0, len(ids):].tolist()


def timed(fn, repeats):
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="code-edit,chat,summarization,qa")
    ap.add_argument("--prompts", type=int, default=3, help="prompts per workload")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pld-tokens", type=int, default=10, help="prompt_lookup_num_tokens of the PLD baseline")
    ap.add_argument("--budget", default="auto")
    ap.add_argument("--proposer", choices=("suffixspec", "lookup"), default="suffixspec",
                    help="suffixspec.Proposer (default) or the minimal prompt-lookup stand-in")
    ap.add_argument("--identity", type=int, default=0, metavar="N",
                    help="only check greedy identity with plain decoding on N prompts (mixed workloads)")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from suffixspec.generate import CostModel, SpeculativeGenerator
    from suffixspec.models import load_model
    from suffixspec.proposer import Proposer

    model, tok = load_model()
    budget = args.budget if args.budget == "auto" else int(args.budget)
    from suffixspec.generate import PromptLookupProposer

    proposer = Proposer(global_cache=False) if args.proposer == "suffixspec" else PromptLookupProposer()
    gen = SpeculativeGenerator(model, tok, proposer=proposer)
    gen.cost_model = CostModel.cached(model)
    curve = gen.cost_model.relative()

    if args.identity:
        per = max(1, args.identity // 5)
        prompts = [p for w in ("code-edit", "chat", "summarization", "qa", "translation") for p in load_prompts(w, per)]
        mismatches = []
        for i, text in enumerate(prompts):
            ids = tok.encode(text)
            ref = plain(model, ids, args.max_new_tokens)
            got = gen.generate([ids], max_new_tokens=args.max_new_tokens, budget=budget).sequences[0]
            same = got == ref
            if not same:
                first = next((k for k, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
                mismatches.append({"prompt": i, "first_difference": first})
            print(f"prompt {i:3d}  tokens {len(ids):5d}  identical {'yes' if same else 'NO'}", flush=True)
        # batched, mixed lengths
        batch = [tok.encode(t) for t in prompts[: min(8, len(prompts))]]
        got = gen.generate(batch, max_new_tokens=args.max_new_tokens, budget=budget).sequences
        batch_ok = all(g == plain(model, ids, args.max_new_tokens) for g, ids in zip(got, batch))
        print(f"batch of {len(batch)} mixed lengths identical: {'yes' if batch_ok else 'NO'}")
        print(json.dumps({"identity_prompts": len(prompts), "mismatches": mismatches, "batch_identical": batch_ok}))
        return 0 if not mismatches and batch_ok else 1

    # warm up every path once
    warm = tok.encode(load_prompts("chat", 1)[0])
    plain(model, warm, 8)
    plain(model, warm, 8, prompt_lookup_num_tokens=args.pld_tokens)
    gen.generate([warm], max_new_tokens=8, budget=budget)

    rows, summary = [], {}
    for workload in args.workloads.split(","):
        tot = {"plain": 0.0, "pld": 0.0, "suffixspec": 0.0}
        tokens = {"plain": 0, "pld": 0, "suffixspec": 0}
        per_round, identical = [], True
        for text in load_prompts(workload, args.prompts):
            ids = tok.encode(text)
            t_plain, ref = timed(lambda: plain(model, ids, args.max_new_tokens), args.repeats)
            t_pld, pld = timed(lambda: plain(model, ids, args.max_new_tokens, prompt_lookup_num_tokens=args.pld_tokens), args.repeats)
            t_ss, res = timed(lambda: gen.generate([ids], max_new_tokens=args.max_new_tokens, budget=budget), args.repeats)
            identical &= res.sequences[0] == ref
            per_round.append(res.stats.tokens_per_round)
            for key, t, n in (("plain", t_plain, len(ref)), ("pld", t_pld, len(pld)), ("suffixspec", t_ss, len(res.sequences[0]))):
                tot[key] += t
                tokens[key] += n
            print(f"  {workload:<13} prompt {len(ids):5d} tok  plain {len(ref) / t_plain:6.1f}  pld {len(pld) / t_pld:6.1f}"
                  f"  suffixspec {len(res.sequences[0]) / t_ss:6.1f} tok/s  tokens/round {res.stats.tokens_per_round:.2f}"
                  f"  rounds {res.stats.rounds} (plain {res.stats.plain_rounds})", flush=True)
        tps = {k: tokens[k] / tot[k] for k in tot}
        summary[workload] = {
            "plain_tps": tps["plain"], "pld_tps": tps["pld"], "suffixspec_tps": tps["suffixspec"],
            "speedup_vs_plain": tps["suffixspec"] / tps["plain"], "speedup_vs_pld": tps["suffixspec"] / tps["pld"],
            "tokens_per_round": statistics.mean(per_round), "identical": identical,
        }
        rows.append((workload, summary[workload]))

    print()
    print(f"{'workload':<14}{'plain':>9}{'PLD':>9}{'suffixspec':>12}{'vs plain':>10}{'vs PLD':>9}{'tok/round':>11}{'identical':>11}")
    for workload, s in rows:
        print(f"{workload:<14}{s['plain_tps']:9.1f}{s['pld_tps']:9.1f}{s['suffixspec_tps']:12.1f}"
              f"{s['speedup_vs_plain']:9.2f}x{s['speedup_vs_pld']:8.2f}x{s['tokens_per_round']:11.2f}{str(s['identical']):>11}")
    print("pass cost relative to one token: " + ", ".join(f"{k}:{v:.2f}" for k, v in curve.items()))
    print(json.dumps({"threads": args.threads, "proposer": args.proposer, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                      "budget": args.budget, "cost_curve": curve, "workloads": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
