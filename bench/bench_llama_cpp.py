"""Inside llama-cpp-python: plain decoding, its `LlamaPromptLookupDecoding` and suffixspec's `SuffixSpecDraftModel`;
beside them llama.cpp's own server, plain and with its n-gram drafting modes.

    python bench/bench_llama_cpp.py [--workloads code-edit,spec-bench,corpus] [--prompts 5] [--repeats 3]
        [--max-new-tokens 128] [--threads 2] [--lean] [--code-model PATH [--no-default]]
        [--llama-server PATH [--server-modes plain,ngram-simple,...]] [--eval-cost] [--clairvoyant] [--fixed-lengths 4,10] [--record [PATH]]

Needs llama-cpp-python (built as .ci/llama_cpp.sh builds it). Workloads (bench/_llama_workloads.py):
code edits, a Spec-Bench sample, and a corpus case (stdlib functions completed from their first
lines, where `suffixspec+corpus` drafts from an index of the stdlib sample). Every arm gets the same
token ids, one request at a time, greedy, `max_new_tokens`, end to end after `reset()`
(`create_completion`: prefill, decoding and detokenization), in one `Llama` with the same settings
(`logits_all=True`: what a draft model needs past `n_batch`), its `draft_model` swapped per arm.
One untimed warm-up request per arm, then repeats of every prompt with the arms in rotating order.
Ours gets a fresh draft model per workload and repeat (its response cache holds that repeat's
earlier prompts, never an earlier answer to the same prompt). `--lean` adds plain decoding at
llama-cpp-python's defaults (`logits_all=False`: the prefill computes one row of logits).

Per arm: tokens per second over the set (median of the repeats, with their range), speed-up over
its engine's plain decoding per repeat (median, range), generated tokens per evaluation (prefill
included), the outputs that differ from plain's and, for each, the gap between plain's two best
logits where they first differ (a near-tie below `TIE`: a batched evaluation rounds differently),
and for ours the share of the time inside its `__call__`. `--llama-server PATH` (or
$SUFFIXSPEC_LLAMA_SERVER; bench/_llama_server.py) adds llama-server's arms, skipped with one printed
line without it. `--eval-cost` times `Llama.eval` of 1..max_draft+1 tokens after a code-edit prompt
(the cost a draft pays); `--clairvoyant` adds a draft model that drafts plain's own output (every
draft right: the ceiling of the hook at `max_draft`); `--fixed-lengths 4,10` adds ours drafting its whole
best path up to each length on code edits (no cost rule: what the length rule is measured against). Prints a table, then one JSON line (`--record [PATH]`: also appended to
bench/results/llama_cpp.jsonl).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import _llama_server
import _llama_workloads as wl
import numpy as np

import common

ARMS = ("plain", "prompt_lookup", "suffixspec")
CORPUS_ARM = "suffixspec+corpus"
LEAN = "plain_lean"
CLAIRVOYANT = "clairvoyant"
FLAT = [[1, 1.0], [64, 1.0 + 1e-9]]  # a step cost that any drafted token pays for
TIE = 0.1  # plain's two best logits this close at the first difference: a tie rounding may break either way


def instrument(llm) -> dict:
    """Count `llm.eval` calls and record the tokens `llm.sample` returns (one per generated token)."""
    box = {"evals": 0, "sampled": []}
    inner_eval, inner_sample = llm.eval, llm.sample

    def eval_counted(tokens):
        box["evals"] += 1
        return inner_eval(tokens)

    def sample_recorded(*a, **kw):
        token = inner_sample(*a, **kw)
        box["sampled"].append(int(token))
        return token

    llm.eval, llm.sample = eval_counted, sample_recorded
    return box


def run_one(llm, box, ids: list[int], args) -> dict:
    llm.reset()
    box["evals"], box["sampled"] = 0, []
    model = llm.draft_model
    inside = model.stats["call_seconds"] if hasattr(model, "stats") else 0.0
    t0 = time.perf_counter()
    out = llm.create_completion(prompt=list(ids), max_tokens=args.max_new_tokens, temperature=0.0, repeat_penalty=1.0)
    seconds = time.perf_counter() - t0
    inside = (model.stats["call_seconds"] - inside) if hasattr(model, "stats") else 0.0
    n = out["usage"]["completion_tokens"]
    return {"text": out["choices"][0]["text"], "tokens": n, "seconds": seconds, "evals": box["evals"],
            "inside": inside, "ids": box["sampled"][:n]}


class Clairvoyant:
    """Drafts plain decoding's own next tokens (at most `k`): every draft is right, so its speed is
    the most any draft model gets from llama-cpp-python's hook at that length (a benchmark ceiling)."""

    def __init__(self, k: int):
        self.k, self.answers = k, {}  # prompt ids (tuple) -> plain's output ids

    def __call__(self, input_ids, /, **kwargs):
        ids = input_ids.tolist()
        for prompt, answer in self.answers.items():
            n = len(prompt)
            if len(ids) > n and tuple(ids[:n]) == prompt and ids[n:] == answer[: len(ids) - n]:
                return np.asarray(answer[len(ids) - n : len(ids) - n + self.k], np.intc)
        return np.zeros(0, np.intc)


def draft_factories(args, corpus: Path | None, workload: str) -> dict:
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from suffixspec.integrations.llama_cpp import SuffixSpecDraftModel

    pld = LlamaPromptLookupDecoding(num_pred_tokens=args.pld_tokens)  # stateless
    out = {"plain": lambda: None, "prompt_lookup": lambda: pld,
           "suffixspec": lambda: SuffixSpecDraftModel(max_draft=args.max_draft)}
    if corpus is not None:
        out[CORPUS_ARM] = lambda: SuffixSpecDraftModel(max_draft=args.max_draft, corpus=str(corpus))
    if args.clairvoyant:
        oracle = Clairvoyant(args.max_draft)
        out[CLAIRVOYANT] = lambda: oracle
    for k in args.fixed_lengths if workload == "code-edit" else ():
        # the whole best path up to k tokens, whatever a drafted token costs
        out[f"suffixspec-fixed{k}"] = lambda k=k: SuffixSpecDraftModel(max_draft=k, step_cost=FLAT)
    return out


def bench_model(path: str, args, loads: list[wl.Workload], tmp: Path) -> list[dict]:
    """The llama-cpp-python arms on every workload of one model; one result per workload."""
    import llama_cpp

    settings = dict(n_ctx=args.n_ctx, n_batch=args.n_batch, n_threads=args.threads, seed=0, verbose=False)
    llm = llama_cpp.Llama(model_path=path, logits_all=True, **settings)
    lean = llama_cpp.Llama(model_path=path, logits_all=False, **settings) if args.lean else None
    boxes = {id(llm): instrument(llm), **({id(lean): instrument(lean)} if lean is not None else {})}
    results = []
    for load in loads:
        corpus = wl.build_corpus(llm, load.corpus_docs, tmp / f"{load.name}.idx") if load.corpus_docs else None
        factories = draft_factories(args, corpus, load.name)
        arms = tuple(factories) + ((LEAN,) if lean is not None else ())
        prompts = [wl.token_ids(llm, t) for t in load.texts]
        engine = {arm: (lean if arm == LEAN else llm) for arm in arms}
        models = {arm: factories[arm]() for arm in factories}
        if CLAIRVOYANT in models:  # plain's answers, untimed
            llm.draft_model = None
            models[CLAIRVOYANT].answers = {tuple(ids): run_one(llm, boxes[id(llm)], ids, args)["ids"] for ids in prompts}
        for arm in arms:  # warm-up (untimed)
            engine[arm].draft_model = models.get(arm)
            run_one(engine[arm], boxes[id(engine[arm])], prompts[-1], args)
        runs = {arm: [] for arm in arms}  # per repeat, the list of per-prompt results
        for rep in range(args.repeats):
            models = {arm: factories[arm]() for arm in factories}  # ours: fresh, no answer seen
            for arm in arms:
                runs[arm].append([])
            for i, ids in enumerate(prompts):
                shift = (rep * len(prompts) + i) % len(arms)
                for arm in arms[shift:] + arms[:shift]:
                    engine[arm].draft_model = models.get(arm)
                    runs[arm][rep].append(run_one(engine[arm], boxes[id(engine[arm])], ids, args))
        llm.draft_model = None
        summary = summarise(runs, len(prompts))
        divergence(llm, prompts, runs, summary)
        results.append({"model": Path(path).name, "engine": "llama-cpp-python", "workload": load.name,
                        "prompts": len(prompts), "arms": summary})
        print_table(results[-1:], flush=True)  # progress: the table is printed whole at the end
    return results


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), None)


def divergence(llm, prompts, runs, summary) -> None:
    """For each output that differs from plain's: plain's top-two logit gap where they first differ."""
    import numpy as np

    gaps: dict[tuple, float] = {}
    for arm, reps in runs.items():
        if arm == "plain":
            continue
        found = []
        for rep, results in enumerate(reps):
            for i, (got, want) in enumerate(zip(results, runs["plain"][rep])):
                j = first_difference(got["ids"], want["ids"])
                if j is None:
                    continue
                key = (i, tuple(want["ids"][:j]))
                if key not in gaps:
                    llm.reset()
                    llm.eval(list(prompts[i]) + want["ids"][:j])
                    row = np.asarray(llm.scores[llm.n_tokens - 1])
                    top = np.argsort(row)[::-1][:2]
                    gaps[key] = float(row[top[0]] - row[top[1]])
                found.append(round(gaps[key], 4))
        summary[arm]["first_difference_gaps"] = found
        summary[arm]["near_ties"] = f"{sum(g <= TIE for g in found)}/{len(found)}"


def summarise(runs: dict, n_prompts: int) -> dict:
    def rate(rep):
        return sum(r["tokens"] for r in rep) / sum(r["seconds"] for r in rep)

    arms = {}
    for arm in runs:
        rates = [rate(rep) for rep in runs[arm]]
        ups = [rate(a) / rate(p) for a, p in zip(runs[arm], runs["plain"])]
        per_eval = [sum(r["tokens"] for r in rep) / sum(r["evals"] for r in rep) for rep in runs[arm]]
        differ = sum(a["ids"] != p["ids"] for ra, rp in zip(runs[arm], runs["plain"]) for a, p in zip(ra, rp))
        arms[arm] = {"tok_s": round(statistics.median(rates), 2), "tok_s_range": [round(min(rates), 2), round(max(rates), 2)],
                     "speedup": round(statistics.median(ups), 3), "speedup_range": [round(min(ups), 3), round(max(ups), 3)],
                     "tokens_per_eval": round(statistics.median(per_eval), 2),
                     "outputs_differing": f"{differ}/{len(runs[arm]) * n_prompts}"}
        if any("inside" in r for rep in runs[arm] for r in rep):
            share = [sum(r["inside"] for r in rep) / sum(r["seconds"] for r in rep) for rep in runs[arm]]
            if max(share) > 0:
                arms[arm]["call_share"] = round(statistics.median(share), 4)
        if any("accepted" in r for rep in runs[arm] for r in rep):
            drafted = sum(r["drafted"] for rep in runs[arm] for r in rep)
            arms[arm]["accepted_of_drafted"] = round(sum(r["accepted"] for rep in runs[arm] for r in rep) / max(drafted, 1), 3)
    return arms


def bench_server(binary: str, path: str, args, loads: list[wl.Workload], tmp: Path) -> list[dict]:
    """llama-server's modes on the same token ids; one result per workload."""
    import llama_cpp

    vocab = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    prompts = {load.name: [wl.token_ids(vocab, t) for t in load.texts] for load in loads}
    modes = tuple(args.server_modes.split(","))
    runs = {name: {m: [] for m in modes} for name in prompts}
    for rep in range(args.repeats):
        with _llama_server.Servers(binary, path, modes, args, tmp) as servers:
            for m in modes:  # warm-up (untimed)
                _llama_server.complete(servers.urls[m], prompts[loads[0].name][-1], args.max_new_tokens)
            for name, ids_list in prompts.items():
                for m in modes:
                    runs[name][m].append([])
                for i, ids in enumerate(ids_list):
                    shift = (rep * len(ids_list) + i) % len(modes)
                    for m in modes[shift:] + modes[:shift]:
                        runs[name][m][rep].append(_llama_server.complete(servers.urls[m], ids, args.max_new_tokens))
    out = [{"model": Path(path).name, "engine": "llama-server", "workload": name, "prompts": len(prompts[name]),
            "arms": summarise(runs[name], len(prompts[name]))} for name in prompts]
    print_table(out, flush=True)
    return out


def eval_cost(path: str, args, text: str) -> dict:
    """Median milliseconds of `Llama.eval` of n tokens after `text`'s prefill, n = 1..max_draft+1."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, logits_all=True, n_ctx=args.n_ctx, n_batch=args.n_batch,
                          n_threads=args.threads, seed=0, verbose=False)
    ids = wl.token_ids(llm, text)
    llm.eval(ids)
    base = llm.n_tokens
    sizes = list(range(1, args.max_draft + 2))
    times = {n: [] for n in sizes}
    rng = np.random.default_rng(0)
    for rep in range(9):
        for n in sizes if rep % 2 else sizes[::-1]:
            llm.n_tokens = base  # eval drops the cache past n_tokens first
            toks = rng.integers(100, 10000, n).tolist()
            t0 = time.perf_counter()
            llm.eval(toks)
            times[n].append(time.perf_counter() - t0)
    med = {n: statistics.median(v) * 1000 for n, v in times.items()}
    return {"context": base, "ms": {str(n): round(m, 2) for n, m in med.items()},
            "relative": {str(n): round(m / med[1], 3) for n, m in med.items()}}


def print_table(results: list[dict], flush: bool = False) -> None:
    print(f"{'model':26} {'engine':16} {'workload':10} {'arm':17} {'tok/s':>7} {'x plain':>7} {'range':>15} "
          f"{'tok/eval':>8} {'differ':>7} {'ties':>5} {'in call':>7}")
    for res in results:
        for arm, a in res["arms"].items():
            share = f"{100 * a['call_share']:.2f}%" if "call_share" in a else ""
            print(f"{res['model'][:26]:26} {res['engine']:16} {res['workload']:10} {arm:17} {a['tok_s']:7.2f} "
                  f"{a['speedup']:7.3f} {str(a['speedup_range']):>15} {a['tokens_per_eval']:8.2f} "
                  f"{a['outputs_differing']:>7} {a.get('near_ties', ''):>5} {share:>7}", flush=flush)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="code-edit", help=f"comma-separated, of {', '.join(wl.WORKLOADS)}")
    p.add_argument("--prompts", type=int, default=5, help="prompts per workload")
    p.add_argument("--specbench", default=None, metavar="PATH", help=f"Spec-Bench questions (JSONL; ${wl.SPECBENCH_ENV})")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-ctx", type=int, default=2048)
    p.add_argument("--n-batch", type=int, default=512)
    p.add_argument("--max-draft", type=int, default=10)
    p.add_argument("--pld-tokens", type=int, default=10, help="LlamaPromptLookupDecoding's num_pred_tokens")
    p.add_argument("--code-model", default=None, help="a second GGUF (bench/code_model.py --check prints its path)")
    p.add_argument("--lean", action="store_true", help="also plain decoding with logits_all=False (llama-cpp-python's default)")
    p.add_argument("--no-default", action="store_true", help="skip the default model (with --code-model)")
    p.add_argument("--no-python", action="store_true", help="skip the llama-cpp-python arms (server arms only)")
    p.add_argument("--llama-server", default=None, metavar="PATH",
                   help=f"llama.cpp's llama-server binary (${_llama_server.ENV}); without it its arms are skipped")
    p.add_argument("--server-modes", default=",".join(_llama_server.MODES), help="plain and --spec-type values")
    p.add_argument("--clairvoyant", action="store_true", help="also a draft model that drafts plain's own output (a ceiling)")
    p.add_argument("--fixed-lengths", default="", help="on code edits, also ours drafting its whole best path up to "
                   "each of these lengths (comma-separated), whatever the step costs")
    p.add_argument("--eval-cost", action="store_true", help="also time Llama.eval of 1..max_draft+1 tokens")
    common.add_record_flag(p)
    args = p.parse_args(argv)
    if args.no_default and not args.code_model:
        p.error("--no-default needs --code-model")
    try:
        args.fixed_lengths = [int(k) for k in args.fixed_lengths.split(",") if k.strip()]
    except ValueError:
        p.error(f"--fixed-lengths: expected comma-separated positive integers, got {args.fixed_lengths!r}")
    if any(k < 1 for k in args.fixed_lengths):
        p.error(f"--fixed-lengths: expected positive integers, got {args.fixed_lengths}")
    modes = args.server_modes.split(",")
    if modes[0] != "plain" or any(m not in _llama_server.MODES for m in modes):
        p.error(f"--server-modes: expected 'plain' first, then any of {', '.join(list(_llama_server.MODES)[1:])}; "
                f"got {args.server_modes!r}")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    from suffixspec.tokenizer import default_gguf_path

    models = ([] if args.no_default else [str(default_gguf_path())]) + ([args.code_model] if args.code_model else [])
    specbench = wl.specbench_path(args.specbench)
    loads = [wl.load(name, args.prompts, specbench) for name in args.workloads.split(",")]
    binary, why = _llama_server.find(args.llama_server)
    if binary is None:
        print(why, flush=True)
    results, costs = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-llama-") as tmp_name:
        tmp = Path(tmp_name)
        for path in models:
            if args.eval_cost:
                costs[Path(path).name] = eval_cost(path, args, wl.load("code-edit", 1, None).texts[0])
                print(f"eval cost {Path(path).name}: {costs[Path(path).name]}", flush=True)
            if not args.no_python:
                results += bench_model(path, args, loads, tmp)
            if binary is not None:
                results += bench_server(binary, path, args, loads, tmp)
    print_table(results)
    result = {"benchmark": "llama_cpp", "workloads": args.workloads, "prompts": args.prompts,
              "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "threads": args.threads,
              "n_ctx": args.n_ctx, "n_batch": args.n_batch, "max_draft": args.max_draft, "pld_tokens": args.pld_tokens,
              "models": results, **({"eval_cost": costs} if costs else {}),
              **({"server": Path(binary).name, "server_modes": args.server_modes} if binary else {"server_skipped": why})}
    common.emit(result, args, "llama_cpp")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
