"""End-to-end generation speed with the embedded default model: suffixspec vs plain greedy decoding
vs transformers' prompt lookup (PLD), same run, same model, same prompts, warmed up, medians.

    python bench/bench_generate.py                       # all workloads, defaults below
    python bench/bench_generate.py --workloads code-edit --prompts 4 --max-new-tokens 128
    python bench/bench_generate.py --identity 24         # greedy identity check only
    python bench/bench_generate.py --workloads copy-edit-heldout --prompts 41 --min-oracle 8   # the copy-edit target
    python bench/bench_generate.py --workloads copy-edit,chat --prompts 12 --max-new-tokens 128 \
        --budget auto,16,32 --pld-tokens 10,20 --diag      # several configurations side by side

Workloads: `code-edit` (corpora/code_edit_traces.jsonl: "update this code" prompts whose answers
copy heavily from the prompt), `copy-edit` (corpora/copy_edit_prompts.jsonl, made by
corpora/make_copy_edit_prompts.py: stdlib functions under edit instructions the default model answers
by rewriting the code; each kept prompt's greedy answer has a copy-oracle >= 8 tokens/round; the proposer
and the automatic budget were tuned on these 12), `copy-edit-heldout` (corpora/copy_edit_heldout.jsonl: 41
more made the same way with another seed, never tuned on), `chat`, `summarization`, `qa` (Spec-Bench's
questions, a JSONL file given by `--specbench PATH` or $SUFFIXSPEC_SPECBENCH; without it these workloads
are skipped with a message naming both). Prompts are wrapped as one ChatML user turn. The proposer runs without
its global response cache, so repeats never learn from earlier repeats; the automatic budget's
acceptance calibration starts afresh with each workload (as on a server dedicated to it). `--budget` and
`--pld-tokens` take comma-separated lists: every suffixspec budget and every PLD setting is timed on
the same prompts, interleaved repeat by repeat (so load drift on a shared machine hits them alike).
Every suffixspec output is checked against plain greedy decoding. Each prompt's copy-oracle (the
clairvoyant copy proposer of `suffixspec simulate`, budget 64, prompt only) is computed from the
plain greedy output. Prints per-prompt lines, a table, the measured pass-cost curve, with `--diag`
per-configuration round statistics, then one JSON line (`--record`: also appended to
bench/results/generate.jsonl, or generate_identity.jsonl for `--identity`, with the date, host and git
revision).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import common

SPECBENCH_ENV = "SUFFIXSPEC_SPECBENCH"
CODE_EDITS = common.CORPORA / "code_edit_traces.jsonl"
COPY_EDITS = common.CORPORA / "copy_edit_prompts.jsonl"
COPY_EDITS_HELDOUT = common.CORPORA / "copy_edit_heldout.jsonl"
OWN_WORKLOADS = ("code-edit", "copy-edit", "copy-edit-heldout")  # the others are Spec-Bench categories
CHAT_CATEGORIES = ("roleplay", "reasoning", "coding", "extraction", "stem", "humanities", "writing", "math")


def chatml(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def load_prompts(workload: str, n: int, specbench: Path | None = None) -> list[str]:
    if workload == "code-edit":
        rows = [json.loads(line) for line in CODE_EDITS.read_text(encoding="utf-8").splitlines() if line.strip()]
        rows.sort(key=lambda r: len(r["prompt"]))
        return [chatml(r["prompt"]) for r in rows[:n]]
    if workload in ("copy-edit", "copy-edit-heldout"):
        path = COPY_EDITS if workload == "copy-edit" else COPY_EDITS_HELDOUT
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [r["chatml"] for r in rows[:n]]
    if specbench is None:
        raise SystemExit(common.missing(f"workload {workload}: Spec-Bench questions", "--specbench", SPECBENCH_ENV))
    rows = [json.loads(line) for line in Path(specbench).read_text(encoding="utf-8").splitlines() if line.strip()]
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
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (default 0: torch's own choice, every core; plain decoding gets the same)")
    ap.add_argument("--pld-tokens", default="10", help="prompt_lookup_num_tokens of the PLD baseline (comma-separated list)")
    ap.add_argument("--budget", default="auto", help="suffixspec budget: auto or N, or a comma-separated list")
    ap.add_argument("--diag", action="store_true", help="print per-configuration round statistics")
    ap.add_argument("--min-oracle", type=float, default=0.0, metavar="T",
                    help="time only prompts whose copy-oracle (over the plain answer at --max-new-tokens) is >= T; "
                         "the others are listed as skipped")
    ap.add_argument("--proposer", choices=("suffixspec", "lookup"), default="suffixspec",
                    help="suffixspec.Proposer (default) or the minimal prompt-lookup stand-in")
    ap.add_argument("--identity", type=int, default=0, metavar="N",
                    help="only check greedy identity with plain decoding on N prompts (mixed workloads)")
    ap.add_argument("--specbench", default=None, metavar="PATH",
                    help=f"Spec-Bench's question file (JSONL) for chat, summarization, qa (default: ${SPECBENCH_ENV}; "
                         "neither: those workloads are skipped)")
    common.add_record_flag(ap)
    args = ap.parse_args(argv)
    specbench = common.given(args.specbench, SPECBENCH_ENV)
    if specbench is None:
        print(common.missing("Spec-Bench questions", "--specbench", SPECBENCH_ENV)
              + "; skipping the workloads that need them", file=sys.stderr)
    available = [w for w in args.workloads.split(",") if specbench is not None or w in OWN_WORKLOADS]

    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    args.threads = torch.get_num_threads()
    from suffixspec.draft.proposer import Proposer
    from suffixspec.generate import CostModel, SpeculativeGenerator
    from suffixspec.models import load_model

    model, tok = load_model()
    first = args.budget.split(",")[0]
    budget = first if first == "auto" else int(first)
    from suffixspec.generate import PromptLookupProposer

    proposer = Proposer(global_cache=False) if args.proposer == "suffixspec" else PromptLookupProposer()
    gen = SpeculativeGenerator(model, tok, proposer=proposer, prefix_cache_bytes=0)
    gen.cost_model = CostModel.cached(model)
    curve = gen.cost_model.relative()

    if args.identity:
        per = max(1, args.identity // 5)
        mixed = [w for w in ("code-edit", "copy-edit", "chat", "summarization", "qa", "translation")
                 if specbench is not None or w in OWN_WORKLOADS]
        prompts = [p for w in mixed for p in load_prompts(w, per, specbench)]
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
        common.emit({"identity_prompts": len(prompts), "mismatches": mismatches, "batch_identical": batch_ok}, args,
                    "generate_identity")
        return 0 if not mismatches and batch_ok else 1

    budgets = [b if b == "auto" else int(b) for b in args.budget.split(",")]
    plds = [int(p) for p in str(args.pld_tokens).split(",")]
    gens = {}
    for b in budgets:  # one generator per budget: the auto calibration state stays per configuration
        g = SpeculativeGenerator(model, tok, proposer=Proposer(global_cache=False) if args.proposer == "suffixspec" else PromptLookupProposer(), prefix_cache_bytes=0)
        g.cost_model = gen.cost_model
        gens[f"ss-{b}"] = (g, b)
    methods = ["plain"] + [f"pld-{p}" for p in plds] + list(gens)

    # warm up every path once (on a chat prompt where there are some)
    warm = tok.encode(load_prompts("chat", 1, specbench)[0] if specbench is not None else
                      load_prompts((available or list(OWN_WORKLOADS))[0], 1)[0])
    plain(model, warm, 8)
    for p in plds:
        plain(model, warm, 8, prompt_lookup_num_tokens=p)
    for g, b in gens.values():
        g.generate([warm], max_new_tokens=8, budget=b)

    import numpy as np

    from suffixspec.draft.simulate import Trace, oracle_mean_accepted

    def copy_oracle(ids, answer) -> float:
        return oracle_mean_accepted([Trace(np.asarray(ids, np.int32), np.asarray(answer, np.int32))], budget=64,
                                    use_history=False)

    def run_method(m, ids):
        if m == "plain":
            return plain(model, ids, args.max_new_tokens), None
        if m.startswith("pld-"):
            return plain(model, ids, args.max_new_tokens, prompt_lookup_num_tokens=int(m[4:])), None
        g, b = gens[m]
        res = g.generate([ids], max_new_tokens=args.max_new_tokens, budget=b)
        return res.sequences[0], res.stats

    from suffixspec.generate import RankCalibration

    summary, diag = {}, {}
    for workload in available:
        for g, _ in gens.values():  # each workload as a server of its own: the auto budget's calibration starts afresh
            g.calibration = RankCalibration()
        tot = {m: 0.0 for m in methods}
        tokens = {m: 0 for m in methods}
        per_round = {m: [] for m in methods if m.startswith("ss-")}
        acc = {m: {"rounds": 0, "plain_rounds": 0, "drafted": 0, "accepted": 0, "proposer_s": 0.0, "verifier_s": 0.0,
                   "budgets": []} for m in per_round}
        identical = {m: True for m in per_round}
        mismatches = []
        oracles = []
        for pi, text in enumerate(load_prompts(workload, args.prompts, specbench)):
            ids = tok.encode(text)
            oracle = None  # of the plain greedy answer: computed once, before timing when it selects prompts
            if args.min_oracle > 0:
                oracle = copy_oracle(ids, plain(model, ids, args.max_new_tokens))
                if oracle < args.min_oracle:
                    print(f"  {workload:<10} #{pi:<2d} prompt {len(ids):4d} tok  oracle {oracle:5.2f}  skipped (< {args.min_oracle:g})")
                    continue
            times = {m: [] for m in methods}
            outs, stats = {}, {}
            for _ in range(args.repeats):
                for m in methods:
                    t = time.perf_counter()
                    outs[m], st = run_method(m, ids)
                    times[m].append(time.perf_counter() - t)
                    if st is not None:
                        stats[m] = st
            ref = outs["plain"]
            if oracle is None:
                oracle = copy_oracle(ids, ref)
            oracles.append(oracle)
            line = f"  {workload:<10} #{pi:<2d} prompt {len(ids):4d} tok  oracle {oracle:5.2f}  plain {len(ref) / statistics.median(times['plain']):5.1f}"
            for m in methods:
                t = statistics.median(times[m])
                tot[m] += t
                tokens[m] += len(outs[m])
                if m != "plain":
                    line += f"  {m} {len(outs[m]) / t:5.1f}"
                if m in stats:
                    st = stats[m]
                    same = outs[m] == ref
                    identical[m] &= same
                    if not same:
                        first = next((k for k, (a, b) in enumerate(zip(outs[m], ref)) if a != b), min(len(outs[m]), len(ref)))
                        mismatches.append({"workload": workload, "prompt": pi, "config": m, "first_difference": first})
                    per_round[m].append(st.tokens_per_round)
                    a = acc[m]
                    a["rounds"] += st.rounds
                    a["plain_rounds"] += st.plain_rounds
                    a["drafted"] += st.drafted
                    a["accepted"] += st.accepted
                    a["proposer_s"] += st.proposer_s
                    a["verifier_s"] += st.verifier_s
                    a["budgets"].extend(st.budgets)
                    line += f" ({st.tokens_per_round:.1f}/r{'' if same else ' DIFF'})"
            print(line + "  tok/s", flush=True)
        if not oracles:
            print(f"  {workload}: no prompt reached the copy-oracle of --min-oracle {args.min_oracle:g}")
            continue
        tps = {m: tokens[m] / tot[m] for m in methods}
        best_pld = max((m for m in methods if m.startswith("pld-")), key=lambda m: tps[m])
        summary[workload] = {
            "prompts": len(oracles), "mean_oracle": statistics.mean(oracles), "plain_tps": tps["plain"],
            **{f"{m}_tps": tps[m] for m in methods if m != "plain"},
            **{f"{m}_vs_plain": tps[m] / tps["plain"] for m in methods if m != "plain"},
            **{f"{m}_vs_best_pld": tps[m] / tps[best_pld] for m in per_round},
            **{f"{m}_tokens_per_round": statistics.mean(per_round[m]) for m in per_round},
            "best_pld": best_pld, "identical": all(identical.values()), "mismatches": mismatches,
        }
        diag[workload] = {}
        for m, a in acc.items():
            r = max(a["rounds"], 1)
            bud = np.asarray(a["budgets"], np.int64)
            hist = {int(k): int(v) for k, v in zip(*np.unique(np.minimum(bud, 64) // 8 * 8, return_counts=True))}
            diag[workload][m] = {
                "rounds": a["rounds"], "plain_rounds": a["plain_rounds"], "drafted_per_round": a["drafted"] / r,
                "accepted_per_round": a["accepted"] / r, "acceptance_rate": a["accepted"] / max(a["drafted"], 1),
                "proposer_ms_per_round": 1e3 * a["proposer_s"] / r, "verifier_ms_per_round": 1e3 * a["verifier_s"] / r,
                "mean_tree": float(bud.mean()) if len(bud) else 0.0,
                "rel_pass_cost_at_mean_tree": float(gen.cost_model(bud.mean() + 1) / gen.cost_model(1)) if len(bud) else 1.0,
                "tree_size_hist_by8": hist,
            }

    print()
    head = f"{'workload':<18}{'oracle':>7}{'plain':>7}" + "".join(f"{m:>9}" for m in methods if m != "plain")
    print(head + "   tok/s (median of repeats, summed over prompts)")
    for w, s in summary.items():
        print(f"{w:<18}{s['mean_oracle']:7.2f}{s['plain_tps']:7.1f}" + "".join(f"{s[m + '_tps']:9.1f}" for m in methods if m != "plain"))
    print()
    print(f"{'workload':<18}{'config':<9}{'vs plain':>9}{'vs best PLD':>13}{'tok/round':>11}{'identical':>11}")
    for w, s in summary.items():
        for m in methods:
            if m == "plain":
                continue
            ss = m.startswith("ss-")
            print(f"{w:<18}{m:<9}{s[m + '_vs_plain']:8.2f}x" + (f"{s[m + '_vs_best_pld']:12.2f}x ({s['best_pld']})" if ss else " " * 13)
                  + (f"{s[m + '_tokens_per_round']:11.2f}" if ss else "") + (f"{str(not any(x['config'] == m for x in s['mismatches'])):>11}" if ss else ""))
    print("pass cost relative to one token: " + ", ".join(f"{k}:{v:.2f}" for k, v in curve.items()))
    if args.diag:
        print()
        print(f"{'workload':<18}{'config':<9}{'rounds':>7}{'plain r':>8}{'drafted/r':>10}{'accepted/r':>11}{'accept%':>8}"
              f"{'tree':>6}{'cost':>6}{'prop ms/r':>10}{'verify ms/r':>12}  tree sizes (by 8)")
        for w, d in diag.items():
            for m, x in d.items():
                print(f"{w:<18}{m:<9}{x['rounds']:7d}{x['plain_rounds']:8d}{x['drafted_per_round']:10.1f}{x['accepted_per_round']:11.2f}"
                      f"{100 * x['acceptance_rate']:7.1f}%{x['mean_tree']:6.1f}{x['rel_pass_cost_at_mean_tree']:6.2f}"
                      f"{x['proposer_ms_per_round']:10.2f}{x['verifier_ms_per_round']:12.2f}  {x['tree_size_hist_by8']}")
    common.emit({"threads": args.threads, "proposer": args.proposer, "max_new_tokens": args.max_new_tokens,
                 "repeats": args.repeats, "budgets": args.budget, "pld_tokens": plds, "min_oracle": args.min_oracle,
                 "cost_curve": curve, "workloads": summary, **({"diag": diag} if args.diag else {})}, args, "generate")
    ok = all(s["identical"] for s in summary.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
