"""End-to-end generation speed (the embedded default model, or `--model`): suffixspec vs plain greedy
decoding vs transformers' prompt lookup (PLD), same run, same model, same prompts, warmed up, medians.

    python bench/bench_generate.py                       # all workloads, defaults below
    python bench/bench_generate.py --workloads code-edit --prompts 4 --max-new-tokens 128
    python bench/bench_generate.py --identity 24         # greedy identity check only
    python bench/bench_generate.py --workloads copy-edit-heldout --prompts 41 --min-oracle 8   # the copy-edit target
    python bench/bench_generate.py --workloads copy-edit,chat --prompts 12 --max-new-tokens 128 \
        --budget auto,16,32 --pld-tokens 10,20 --diag      # several configurations side by side
    python bench/bench_generate.py --model qwen.gguf --workloads code-edit,continue-file,specbench \
        --specbench specbench.jsonl --prompts 4 --max-new-tokens 192 --repeats 2 --concurrency 1,4

Workloads: `code-edit` (corpora/code_edit_traces.jsonl: "update this code" prompts whose answers
copy heavily from the prompt), `copy-edit` (corpora/copy_edit_prompts.jsonl, made by
corpora/make_copy_edit_prompts.py: stdlib functions under edit instructions the default model answers
by rewriting the code; each kept prompt's greedy answer has a copy-oracle >= 8 tokens/round; the proposer
and the automatic budget were tuned on these 12), `copy-edit-heldout` (corpora/copy_edit_heldout.jsonl: 41
more made the same way with another seed, never tuned on), `continue-file` ("continue this file" over a
repository with a corpus of an older snapshot of it: the functions of corpora/make_corpus_completion_traces.py's
`dev` set, each prompt the last `--context-tokens` tokens of a CPython 3.12.1 module up to a function's header,
completed as raw text; suffixspec drafts from a corpus index of the same modules in CPython 3.11.7, built
here from the pyenv root into bench/.cache), `chat`, `summarization`, `qa`, `specbench` (one prompt per
Spec-Bench category in turn: the sample's mix) (Spec-Bench's
questions, a JSONL file given by `--specbench PATH` or $SUFFIXSPEC_SPECBENCH; without it these workloads
are skipped with a message naming both). Other prompts are wrapped as one ChatML user turn. The proposer runs without
its global response cache, so repeats never learn from earlier repeats; the automatic budget's
acceptance calibration starts afresh with each workload (as on a server dedicated to it). `--budget` and
`--pld-tokens` take comma-separated lists: every suffixspec budget and every PLD setting is timed on
the same prompts, interleaved repeat by repeat (so load drift on a shared machine hits them alike);
a budget written `auto+r` (or `N+r`) also drafts from recycled predictions, whose table learns across a
workload's prompts but restarts each repeat of a prompt from where it stood before the prompt's first.
Every suffixspec output is checked against plain greedy decoding. Where each suffixspec configuration's
time goes is split into prefill (the steps that read the prompt), draft (proposer and budget), verify
(forward passes, acceptance, cache commits) and the rest (`suffixspec.bench.timesplit`). `--concurrency
1,4`: at N > 1 only the suffixspec configurations run, all of a workload's prompts through one engine
decoding at most N together (continuous batching), timed as a whole, for auto against fixed budgets.
Each prompt's copy-oracle (the
clairvoyant copy proposer of `suffixspec simulate`, budget 64, prompt only) is computed from the
plain greedy output. Prints per-prompt lines, a table, the measured pass-cost curve, with `--diag`
per-configuration round statistics, then one JSON line (`--record`: also appended to
bench/results/generate.jsonl, or generate_identity.jsonl for `--identity`, with the date, host and git
revision).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import common

SPECBENCH_ENV = common.SPECBENCH_ENV
CODE_EDITS = common.CORPORA / "code_edit_traces.jsonl"
COPY_EDITS = common.CORPORA / "copy_edit_prompts.jsonl"
COPY_EDITS_HELDOUT = common.CORPORA / "copy_edit_heldout.jsonl"
OWN_WORKLOADS = ("code-edit", "copy-edit", "copy-edit-heldout", "continue-file")  # the others need Spec-Bench
CONTINUE_SET = "dev"  # corpora/make_corpus_completion_traces.py's set: corpus CPython 3.11.7, prompts 3.12.1
SPECBENCH_ORDER = ("summarization", "qa", "math_reasoning", "rag", "translation", "coding", "writing", "roleplay",
                   "reasoning", "math", "extraction", "stem", "humanities")
CHAT_CATEGORIES = ("roleplay", "reasoning", "coding", "extraction", "stem", "humanities", "writing", "math")


def load_prompts(workload: str, n: int, specbench: Path | None = None) -> list[str]:
    if workload == "code-edit":
        rows = common.read_jsonl(CODE_EDITS)
        rows.sort(key=lambda r: len(r["prompt"]))
        return [common.user_turn(r["prompt"]) for r in rows[:n]]
    if workload in ("copy-edit", "copy-edit-heldout"):
        path = COPY_EDITS if workload == "copy-edit" else COPY_EDITS_HELDOUT
        rows = common.read_jsonl(path)
        return [r["chatml"] for r in rows[:n]]
    if specbench is None:
        raise SystemExit(common.missing(f"workload {workload}: Spec-Bench questions", "--specbench", SPECBENCH_ENV))
    rows = common.read_jsonl(specbench)
    if workload == "specbench":  # the sample's mix: each category's shortest question not yet taken, in turn
        by_cat = {c: sorted((r for r in rows if r["category"] == c), key=lambda r: len(r["turns"][0]))
                  for c in SPECBENCH_ORDER}
        order = [by_cat[c][k] for k in range(max(map(len, by_cat.values()), default=0))
                 for c in SPECBENCH_ORDER if k < len(by_cat[c])]
        return [common.user_turn(r["turns"][0][:3000]) for r in order[:n]]
    cats = CHAT_CATEGORIES if workload == "chat" else (workload,)
    picked = [r for r in rows if r["category"] in cats]
    picked.sort(key=lambda r: len(r["turns"][0]))
    step = max(1, len(picked) // max(n, 1))
    return [common.user_turn(r["turns"][0][:3000]) for r in picked[::step][:n]]


def _continue_recipe():
    """corpora/make_corpus_completion_traces.py as a module (its function prompts and corpus files)."""
    import importlib.util

    name = "make_corpus_completion_traces"
    spec = importlib.util.spec_from_file_location(name, common.CORPORA / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def continue_file_prompts(tok, n: int, context_tokens: int) -> list[list[int]]:
    """The first `n` functions of the recipe's set (one module after another): the last
    `context_tokens` tokens of the newer module up to and including the function's header."""
    out = []
    for _, text in _continue_recipe().function_prompts(CONTINUE_SET):
        if len(out) >= n:
            break
        out.append(list(tok.encode(text))[-context_tokens:])
    return out


def continue_file_corpus(tok):
    """The corpus index of the older snapshot (one document per module file), built once per tokenizer
    into bench/.cache and opened."""
    import numpy as np

    from suffixspec.corpus import CorpusIndex, Document, build_index

    files = _continue_recipe().corpus_files(CONTINUE_SET)
    path = common.CACHE / f"continue_{CONTINUE_SET}_{tok.fingerprint[:16]}.idx"
    if not path.exists():
        docs = [Document(np.asarray(tok.encode(f.read_text(encoding="utf-8", errors="replace")), np.int32), id=f.name)
                for f in files]
        common.CACHE.mkdir(parents=True, exist_ok=True)
        build_index(docs, path, tokenizer=tok)
    return CorpusIndex.open(path)


def workload_ids(workload: str, n: int, specbench, tok, context_tokens: int) -> list[list[int]]:
    if workload == "continue-file":
        return continue_file_prompts(tok, n, context_tokens)
    return [list(tok.encode(t)) for t in load_prompts(workload, n, specbench)]


def plain(model, ids, max_new, **kw):
    import torch

    with torch.inference_mode():
        x = torch.tensor([ids])
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                             pad_token_id=model.generation_config.eos_token_id, **kw)
    return out[0, len(ids):].tolist()


def spec_run(g, prompts, max_new, budget, max_batch=None):
    """(outputs, stats, time split) of `g` over `prompts` through one engine, each step split
    (`suffixspec.bench.timesplit.StepSplit`): what `g.generate` does, step by step."""
    from suffixspec.bench.timesplit import StepSplit

    engine = g.serve(max_batch=max_batch, max_new_tokens=max_new, budget=budget)
    for q, ids in enumerate(prompts):
        engine.add(ids, key=q)
    split = StepSplit()
    try:
        while not engine.idle:
            mark = split.before(engine)
            step = engine.step()
            split.after(engine, step, mark)
    finally:
        engine.close()
    res = engine.result()
    return res.sequences, res.stats, split.result()


@dataclasses.dataclass(frozen=True)
class BudgetConfig:
    """One suffixspec configuration of `--budget`: "auto" or N, "+r" for recycled predictions on."""

    name: str  # "ss-auto", "ss-16", "ss-auto+r"
    budget: str | int
    recycle: bool


def budget_config(spec: str) -> BudgetConfig:
    text = spec.strip()
    recycle = text.endswith("+r")
    base = text[:-2] if recycle else text
    if base != "auto" and not (base.isdigit() and int(base) >= 0):
        raise SystemExit(f"bench_generate: --budget: expected auto or a token count, optionally followed by +r "
                         f"(recycled predictions on), got {spec!r}")
    return BudgetConfig(f"ss-{text}", base if base == "auto" else int(base), recycle)


def _range(xs: list[float]) -> list[float]:
    return [min(xs), max(xs)] if xs else []


def _auto_vs_fixed(tps: dict, configs) -> dict:
    """auto's throughput over the best fixed budget's, where both ran."""
    fixed = [m for m in configs if m != "ss-auto" and not m.endswith("+r")]
    if "ss-auto" not in configs or not fixed:
        return {}
    best = max(fixed, key=lambda m: tps[m])
    return {"best_fixed": best, "auto_vs_best_fixed": tps["ss-auto"] / tps[best]}


def run_batched(gens: dict, refs: list, c: int, args, mismatches: list, workload: str) -> dict:
    """Every suffixspec configuration over all of `refs`' prompts through one engine decoding at most
    `c` together, interleaved repeat by repeat; throughput (tokens over the median time), the ratio's
    range over repeats, identity with the plain answers, tokens per round."""
    from suffixspec.bench.timesplit import split_shares

    prompts = [ids for ids, _ in refs]
    times = {m: [] for m in gens}
    out = {}
    for _ in range(args.repeats):
        for m, (g, b) in gens.items():
            if g.recycle:  # every repeat from an empty table: the one-at-a-time runs saw these prompts
                g.recycle_table = type(g.recycle_table)(g.recycle_table.vocab_size, identity=g.recycle_table.identity)
            t = time.perf_counter()
            seqs, st, split = spec_run(g, prompts, args.max_new_tokens, b, max_batch=c)
            times[m].append(time.perf_counter() - t)
            same = all(s == ref for s, (_, ref) in zip(seqs, refs))
            if not same:
                mismatches.append({"workload": workload, "concurrency": c, "config": m})
            out[m] = {"tokens": sum(map(len, seqs)), "tokens_per_round": st.new_tokens / max(st.rounds, 1),
                      "mean_tree": st.mean_budget, "identical": same and out.get(m, {}).get("identical", True),
                      "time_split": split_shares([split])}
    for m in gens:
        out[m]["tps"] = out[m]["tokens"] / statistics.median(times[m])
        out[m]["times_s"] = times[m]
    tps = {m: out[m]["tps"] for m in gens}
    res = {"concurrency": c, "configs": out, **_auto_vs_fixed(tps, list(gens))}
    if "best_fixed" in res:
        best = res["best_fixed"]
        res["auto_vs_best_fixed_range"] = _range([tb / ta for ta, tb in zip(times["ss-auto"], times[best])])
    line = "  ".join(f"{m} {tps[m]:6.1f}" for m in gens)
    print(f"  {workload:<10} concurrency {c}: {line} tok/s"
          + (f"  auto/best fixed {res['auto_vs_best_fixed']:.3f} ({res['best_fixed']})" if "best_fixed" in res else ""),
          flush=True)
    return res


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
    ap.add_argument("--model", default=None, metavar="PATH",
                    help="a .gguf file or transformers model directory (default: the embedded SmolLM2-135M)")
    ap.add_argument("--context-tokens", type=int, default=1280,
                    help="continue-file: the prompt's last N tokens of the file (default 1280)")
    ap.add_argument("--concurrency", default="1",
                    help="comma-separated; at N > 1 the suffixspec configurations also run every prompt of a "
                         "workload through one engine decoding at most N together (default 1)")
    ap.add_argument("--prompts", type=int, default=3, help="prompts per workload")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (default 0: torch's own choice, every core; plain decoding gets the same)")
    ap.add_argument("--pld-tokens", default="10", help="prompt_lookup_num_tokens of the PLD baseline (comma-separated list)")
    ap.add_argument("--budget", default="auto", help="suffixspec budget: auto or N, or a comma-separated list; "
                    "a trailing +r (auto+r, 16+r) also drafts from the model's own past predictions (recycled)")
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
    concurrencies = [int(c) for c in str(args.concurrency).split(",")]
    if not concurrencies or min(concurrencies) < 1:
        raise SystemExit(f"--concurrency: expected positive integers, got {args.concurrency!r}")

    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    args.threads = torch.get_num_threads()
    from suffixspec.draft.proposer import Proposer
    from suffixspec.generate import CostModel, SpeculativeGenerator
    from suffixspec.models import load_model

    model, tok = load_model(args.model)
    budget = budget_config(args.budget.split(",")[0]).budget
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

    configs = [budget_config(b) for b in args.budget.split(",")]
    plds = [int(p) for p in str(args.pld_tokens).split(",")]
    # warm up every path once (on a chat prompt where there are some)
    warm = tok.encode(load_prompts("chat", 1, specbench)[0] if specbench is not None else
                      load_prompts("code-edit", 1)[0])
    gens = {}

    def make_gens(corpus=None):
        """One generator per budget (the auto calibration state stays per configuration), prepared and
        warmed up before any clock starts; `corpus`: the proposers' corpus index."""
        gens.clear()
        for c in configs:
            prop = (Proposer(corpus=corpus, global_cache=False) if args.proposer == "suffixspec"
                    else PromptLookupProposer())
            g = SpeculativeGenerator(model, tok, proposer=prop, prefix_cache_bytes=0, recycle=c.recycle)
            g.cost_model = gen.cost_model
            g.prepare()
            g.generate([warm], max_new_tokens=8, budget=c.budget)
            gens[c.name] = (g, c.budget)

    make_gens()
    methods = ["plain"] + [f"pld-{p}" for p in plds] + list(gens)
    plain(model, warm, 8)
    for p in plds:
        plain(model, warm, 8, prompt_lookup_num_tokens=p)

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
        outs, st, split = spec_run(g, [ids], args.max_new_tokens, b)
        splits[m].append(split)
        return outs[0], st

    from suffixspec.bench.timesplit import split_shares
    from suffixspec.draft.recycle import RecycleTable
    from suffixspec.generate import RankCalibration

    summary, diag = {}, {}
    for workload in available:
        corpus = continue_file_corpus(tok) if workload == "continue-file" and args.proposer == "suffixspec" else None
        if corpus is not None or any(g.proposer.corpora for g, _ in gens.values() if isinstance(g.proposer, Proposer)):
            make_gens(corpus)
        for g, _ in gens.values():  # each workload as a server of its own: the auto budget's calibration and
            g.calibration = RankCalibration()  # the recycled predictions start afresh
            if g.recycle:
                g.recycle_table = RecycleTable(g.recycle_table.vocab_size, identity=g.recycle_table.identity)
        splits = {m: [] for m in gens}
        refs = []
        tot = {m: 0.0 for m in methods}
        tot_rep = {m: [0.0] * args.repeats for m in methods}  # each repeat's time summed over prompts
        tokens = {m: 0 for m in methods}
        per_round = {m: [] for m in methods if m.startswith("ss-")}
        acc = {m: {"rounds": 0, "plain_rounds": 0, "drafted": 0, "accepted": 0, "proposer_s": 0.0, "verifier_s": 0.0,
                   "budgets": []} for m in per_round}
        identical = {m: True for m in per_round}
        mismatches = []
        oracles = []
        workload_prompts = workload_ids(workload, args.prompts, specbench, tok, args.context_tokens)
        for pi, ids in enumerate(workload_prompts):
            oracle = None  # of the plain greedy answer: computed once, before timing when it selects prompts
            if args.min_oracle > 0:
                oracle = copy_oracle(ids, plain(model, ids, args.max_new_tokens))
                if oracle < args.min_oracle:
                    print(f"  {workload:<10} #{pi:<2d} prompt {len(ids):4d} tok  oracle {oracle:5.2f}  skipped (< {args.min_oracle:g})")
                    continue
            times = {m: [] for m in methods}
            outs, stats = {}, {}
            # recycled predictions learn across prompts, as a server's would, but a prompt's repeats each
            # start from the table as it was before its first: no repeat drafts from an earlier one's answer
            before = {m: copy.deepcopy(g.recycle_table) for m, (g, _) in gens.items() if g.recycle}
            for r in range(args.repeats):
                for m in methods:
                    if r and m in before:
                        gens[m][0].recycle_table = copy.deepcopy(before[m])
                    t = time.perf_counter()
                    outs[m], st = run_method(m, ids)
                    times[m].append(time.perf_counter() - t)
                    if st is not None:
                        stats[m] = st
            ref = outs["plain"]
            refs.append((ids, ref))
            if oracle is None:
                oracle = copy_oracle(ids, ref)
            oracles.append(oracle)
            line = f"  {workload:<10} #{pi:<2d} prompt {len(ids):4d} tok  oracle {oracle:5.2f}  plain {len(ref) / statistics.median(times['plain']):5.1f}"
            for m in methods:
                t = statistics.median(times[m])
                tot[m] += t
                for r, tr in enumerate(times[m]):
                    tot_rep[m][r] += tr
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
            # the ratio in each repeat (times summed over prompts): the spread of the medians' ratios
            **{f"{m}_vs_plain_range": _range([tot_rep["plain"][r] / tot_rep[m][r] for r in range(args.repeats)])
               for m in methods if m != "plain"},
            **{f"{m}_vs_best_pld_range": _range([tot_rep[best_pld][r] / tot_rep[m][r] for r in range(args.repeats)])
               for m in per_round},
            **{f"{m}_time_split": split_shares(splits[m]) for m in per_round},
            **_auto_vs_fixed(tps, per_round),
        }
        for c in (c for c in concurrencies if c > 1):
            summary[workload][f"c{c}"] = run_batched(gens, refs, c, args, mismatches, workload)
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
    print(f"{'workload':<18}{'config':<9}{'vs plain':>9}{'[repeats]':>14}{'vs best PLD':>13}{'[repeats]':>14}"
          f"{'tok/round':>11}{'identical':>11}")
    for w, s in summary.items():
        for m in methods:
            if m == "plain":
                continue
            ss = m.startswith("ss-")
            lo, hi = s[m + "_vs_plain_range"]
            line = f"{w:<18}{m:<9}{s[m + '_vs_plain']:8.2f}x  [{lo:.2f}-{hi:.2f}]"
            if ss:
                plo, phi = s[m + "_vs_best_pld_range"]
                line += (f"{s[m + '_vs_best_pld']:8.2f}x ({s['best_pld']}) [{plo:.2f}-{phi:.2f}]"
                         f"{s[m + '_tokens_per_round']:11.2f}{str(not any(x['config'] == m for x in s['mismatches'])):>11}")
            print(line)
    print()
    print(f"{'workload':<18}{'config':<9}{'prefill':>9}{'draft':>8}{'verify':>8}{'rest':>8}{'busy s/req':>12}"
          "   where a speculative request's time goes (shares of the steps' time)")
    for w, s in summary.items():
        for m in (m for m in methods if m.startswith("ss-")):
            sp = s.get(m + "_time_split")
            if sp:
                sh = sp["share"]
                print(f"{w:<18}{m:<9}{100 * sh['prefill']:8.1f}%{100 * sh['draft']:7.1f}%{100 * sh['verify']:7.1f}%"
                      f"{100 * sh['rest']:7.1f}%{sp['busy_s']:12.2f}")
        if "auto_vs_best_fixed" in s:
            print(f"{w:<18}auto / best fixed ({s['best_fixed']}) at one request: {s['auto_vs_best_fixed']:.3f}")
        for c in concurrencies:
            b = s.get(f"c{c}")
            if b and "auto_vs_best_fixed" in b:
                lo, hi = b["auto_vs_best_fixed_range"]
                print(f"{w:<18}auto / best fixed ({b['best_fixed']}) at {c} requests: {b['auto_vs_best_fixed']:.3f} "
                      f"[{lo:.3f}-{hi:.3f}]")
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
    common.emit({"model": args.model or "default", "threads": args.threads, "proposer": args.proposer,
                 "concurrency": concurrencies, "context_tokens": args.context_tokens, "max_new_tokens": args.max_new_tokens,
                 "repeats": args.repeats, "budgets": args.budget, "pld_tokens": plds, "min_oracle": args.min_oracle,
                 "cost_curve": curve, "workloads": summary, **({"diag": diag} if args.diag else {})}, args, "generate")
    ok = all(s["identical"] and not s["mismatches"] for s in summary.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
