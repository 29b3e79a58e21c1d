"""Inside llama-cpp-python: plain decoding, its `LlamaPromptLookupDecoding` and suffixspec's `SuffixSpecDraftModel`.

    python bench/bench_llama_cpp.py [--prompts 5] [--max-new-tokens 128] [--repeats 3] [--threads 2]
                                    [--lean] [--code-model PATH [--no-default]] [--record]

Needs llama-cpp-python (built as .ci/llama_cpp.sh builds it). Code edits (corpora/copy_edit_prompts.jsonl)
through `create_chat_completion`, one request at a time, greedy, end to end after `reset()`; one
`Llama` per arm with the same settings (`logits_all=True`: what a draft model needs past `n_batch`);
one untimed warm-up request per arm, then repeats of every prompt with the arms in rotating order.
Ours gets a fresh draft model each repeat (its response cache holds that repeat's earlier prompts,
never an earlier answer to the same prompt). Per arm: tokens per second over the set (median of
the repeats, with their range), speed-up over plain per repeat (median, range), generated tokens
per evaluation (prefill included), the outputs that differ from plain's, and for ours the share of
the time spent inside its `__call__`. `--lean` adds plain decoding at llama-cpp-python's defaults
(`logits_all=False`: the prefill computes one row of logits; a draft model forces all rows).
The default model first, then `--code-model`. Prints a table,
then one JSON line (`--record [PATH]`: also appended to bench/results/llama_cpp.jsonl).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import common

ARMS = ("plain", "prompt_lookup", "suffixspec")
# plain decoding at llama-cpp-python's defaults (logits_all=False: the prefill computes the last
# row of logits only); a draft model forces every row, so the arms above all pay for it
LEAN = "plain_lean"


def load_prompts(n: int) -> list[str]:
    rows = [json.loads(line) for line in (common.CORPORA / "copy_edit_prompts.jsonl").read_text().splitlines() if line.strip()]
    return [r["prompt"] for r in rows[:n]]


def counted(llm) -> dict:
    """Count `llm.eval` calls (each evaluation of a request: the prefill, then one per step)."""
    box = {"evals": 0}
    inner = llm.eval

    def eval_counted(tokens):
        box["evals"] += 1
        return inner(tokens)

    llm.eval = eval_counted
    return box


def run_one(llm, box, prompt: str, args) -> dict:
    llm.reset()
    box["evals"] = 0
    model = llm.draft_model
    inside = model.stats["call_seconds"] if hasattr(model, "stats") else 0.0
    t0 = time.perf_counter()
    out = llm.create_chat_completion(messages=[{"role": "user", "content": prompt}], max_tokens=args.max_new_tokens,
                                     temperature=0.0, repeat_penalty=1.0)
    seconds = time.perf_counter() - t0
    inside = (model.stats["call_seconds"] - inside) if hasattr(model, "stats") else 0.0
    return {"text": out["choices"][0]["message"]["content"], "tokens": out["usage"]["completion_tokens"],
            "seconds": seconds, "evals": box["evals"], "inside": inside}


def bench_model(path: str, args) -> dict:
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from suffixspec.integrations.llama_cpp import SuffixSpecDraftModel

    settings = dict(n_ctx=args.n_ctx, n_batch=args.n_batch, n_threads=args.threads, logits_all=True, seed=0, verbose=False)
    ours = lambda: SuffixSpecDraftModel(max_draft=args.max_draft)  # noqa: E731
    drafts = {"plain": lambda: None, "prompt_lookup": lambda: LlamaPromptLookupDecoding(num_pred_tokens=args.pld_tokens),
              "suffixspec": ours}
    llms = {arm: llama_cpp.Llama(model_path=path, draft_model=drafts[arm](), **settings) for arm in ARMS}
    arms = ARMS + ((LEAN,) if args.lean else ())
    if args.lean:
        llms[LEAN] = llama_cpp.Llama(model_path=path, **{**settings, "logits_all": False})
    boxes = {arm: counted(llm) for arm, llm in llms.items()}
    prompts = load_prompts(args.prompts)
    for arm in llms:  # warm-up
        run_one(llms[arm], boxes[arm], prompts[-1], args)
    runs = {arm: [] for arm in arms}  # per repeat, the list of per-prompt results
    for rep in range(args.repeats):
        llms["suffixspec"].draft_model = ours()
        for arm in arms:
            runs[arm].append([])
        for i, prompt in enumerate(prompts):
            shift = (rep * len(prompts) + i) % len(arms)
            for arm in arms[shift:] + arms[:shift]:
                runs[arm][rep].append(run_one(llms[arm], boxes[arm], prompt, args))
    return summarise(path, runs, prompts)


def summarise(path: str, runs: dict, prompts: list[str]) -> dict:
    def rate(rep):
        return sum(r["tokens"] for r in rep) / sum(r["seconds"] for r in rep)

    arms = {}
    for arm in runs:
        rates = [rate(rep) for rep in runs[arm]]
        ups = [rate(a) / rate(p) for a, p in zip(runs[arm], runs["plain"])]
        per_eval = [sum(r["tokens"] for r in rep) / sum(r["evals"] for r in rep) for rep in runs[arm]]
        differ = sum(a["text"] != p["text"] for ra, rp in zip(runs[arm], runs["plain"]) for a, p in zip(ra, rp))
        arms[arm] = {"tok_s": round(statistics.median(rates), 2), "tok_s_range": [round(min(rates), 2), round(max(rates), 2)],
                     "speedup": round(statistics.median(ups), 3), "speedup_range": [round(min(ups), 3), round(max(ups), 3)],
                     "tokens_per_eval": round(statistics.median(per_eval), 2),
                     "outputs_differing": f"{differ}/{len(runs[arm]) * len(prompts)}"}
    share = [sum(r["inside"] for r in rep) / sum(r["seconds"] for r in rep) for rep in runs["suffixspec"]]
    arms["suffixspec"]["call_share"] = round(statistics.median(share), 4)
    return {"model": path.rsplit("/", 1)[-1], "arms": arms}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=5)
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
    common.add_record_flag(p)
    args = p.parse_args(argv)

    from suffixspec.tokenizer import default_gguf_path

    models = ([] if args.no_default else [str(default_gguf_path())]) + ([args.code_model] if args.code_model else [])
    if not models:
        p.error("--no-default needs --code-model")
    results = [bench_model(m, args) for m in models]
    print(f"{'model':34} {'arm':14} {'tok/s':>7} {'range':>15} {'x plain':>7} {'range':>13} {'tok/eval':>8} {'differ':>7} {'in call':>7}")
    for res in results:
        for arm, a in res["arms"].items():
            share = f"{100 * a['call_share']:.2f}%" if "call_share" in a else ""
            print(f"{res['model'][:34]:34} {arm:14} {a['tok_s']:7.2f} {str(a['tok_s_range']):>15} {a['speedup']:7.3f} "
                  f"{str(a['speedup_range']):>13} {a['tokens_per_eval']:8.2f} {a['outputs_differing']:>7} {share:>7}")
    result = {"benchmark": "llama_cpp", "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
              "repeats": args.repeats, "threads": args.threads, "n_ctx": args.n_ctx, "n_batch": args.n_batch,
              "max_draft": args.max_draft, "pld_tokens": args.pld_tokens, "models": results}
    common.emit(result, args, "llama_cpp")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
