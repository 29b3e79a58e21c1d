"""Offline replay of bench_generate's `continue-file` workload on a recorded model's greedy answers.

`--record-traces` (needs `--model`, untimed): the model's plain greedy completions of the first
`--prompts` continue-file prompts (bench_generate.py's: the last `--context-tokens` tokens of a CPython
3.12.1 module up to a function's header), `--max-new-tokens` each, kept as JSONL (`id`, `prompt_ids`,
`output_ids`) in bench/.cache. Without it, those traces replay with no model (bench/replay_generate.py's
`TraceModel` under the real `SpeculativeGenerator`, passes charged from a pass-cost curve), the proposer
drafting from the workload's corpus index (the same modules in CPython 3.11.7, bench/.cache):

- `plain`, `pld` (transformers' prompt lookup), `ours` with each `--budgets` entry ("auto" first),
  `ours` without the corpus, the clairvoyant budget over the proposer's 64-node trees (with the
  corpus), the clairvoyant copier on the request alone and with the corpus: their charged steps,
  ratios to plain and tokens per round (the budget's share of the gap: auto against fixed budgets and
  the clairvoyant one; the trees' share: the clairvoyant budget against the copiers);
- the gap by round (`round_gaps`): a fixed-budget proposal each round beside what each source's
  clairvoyant copy would have taken there (the request, the corpus), and where the corpus had the
  longer copy, whether its continuation follows the longest match, a shorter one, or neither, and
  whether it lies near the session's anchor in that document (the near-miss split).

    python bench/replay_continue_file.py --record-traces --model qwen.gguf --prompts 8    # once, minutes
    python bench/replay_continue_file.py --model qwen.gguf --curve '{"1":1.0,"2":1.03,...}'

`--model` gives the tokenizer (a GGUF's is read without loading weights). Not a timing: ratios of
charged steps, no per-round overhead (see replay_generate.py). Prints tables, then one JSON line
(`--record [PATH]`: also appended to bench/results/replay_continue_file.jsonl).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import bench_generate
import numpy as np
import replay_generate as rg

import common

CODE_CURVE = {1: 1.0, 2: 1.03, 4: 1.03, 8: 1.18, 16: 1.36, 32: 1.96, 64: 2.80, 128: 4.87}  # the code model, here
# the code model's measured prefill (bench_generate's time split) over its one-token step, per prompt token
CODE_PREFILL_STEPS_PER_TOKEN = 0.0129


def traces_path(tok, context_tokens: int) -> Path:
    return common.CACHE / f"continue_file_traces_{tok.fingerprint[:16]}_{context_tokens}.jsonl"


def record_traces(model_path: str, n: int, max_new: int, context_tokens: int, threads: int) -> Path:
    """The model's greedy answers to the first `n` prompts, written to `traces_path` (untimed)."""
    import torch

    from suffixspec.models import load_model

    if threads > 0:
        torch.set_num_threads(threads)
    model, tok = load_model(model_path)
    names = [name for name, _ in bench_generate._continue_recipe().function_prompts(bench_generate.CONTINUE_SET)][:n]
    prompts = bench_generate.continue_file_prompts(tok, n, context_tokens)
    path = traces_path(tok, context_tokens)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for name, ids in zip(names, prompts):
            answer = bench_generate.plain(model, ids, max_new)
            f.write(json.dumps({"id": name, "prompt_ids": ids, "output_ids": answer}) + "\n")
            f.flush()
            print(f"{name}: {len(ids)} prompt tokens, {len(answer)} answered", flush=True)
    return path


def _anchored_near(fa, anchor: int, context: np.ndarray, ahead: np.ndarray, length: int, near: int) -> bool:
    """Whether the copy of `ahead` (after the context's last `length` tokens) occurs in `fa` ending within
    `near` of where the anchor, moved on by the copy, puts it (its most recent occurrence only)."""
    if anchor < 0 or length < 1:
        return False
    state = fa.locate(np.concatenate([context[context.shape[0] - length :], ahead]))
    return state >= 0 and abs(fa.last_at(state) - (anchor + ahead.shape[0])) <= near


def round_gaps(records, corpus, budget: int = 64, max_new: int = 192, options=None) -> dict:
    """Per round of a fixed-`budget` replay (one proposer, records in order): the tokens the tree took
    against each source's clairvoyant copy at that point (the request so far: prompt + output; the
    corpus), and for the rounds where the corpus copy is the longer one, what kind of near-miss the
    tree made (module docstring). Sums over rounds; `lost_*`: tokens the copy had beyond the tree's."""
    from suffixspec.draft.automaton import SuffixAutomaton
    from suffixspec.draft.proposer import Proposer
    from suffixspec.draft.session import ANCHOR_MIN

    proposer = Proposer(corpus, **dict(options or {}, global_cache=False))
    shards = [shard.fa for shard in corpus.shards]
    g = dict.fromkeys(["rounds", "tokens", "tree", "copy_own", "copy_corpus", "copy_best", "lost_own", "lost_corpus",
                       "corpus_rounds", "corpus_longest", "corpus_shorter", "corpus_other", "corpus_near_anchor",
                       "corpus_anchored", "corpus_first_token_in_tree"], 0)
    for rec in records:
        prompt, answer = np.asarray(rec["prompt_ids"], np.int32), np.asarray(rec["output_ids"][:max_new], np.int32)
        session = proposer.start(prompt)
        own = SuffixAutomaton(prompt)
        text, pos = prompt, 0
        while pos < answer.shape[0]:
            ahead = answer[pos : pos + budget]
            tree = session.propose(budget)
            node = tree.longest_accepted(ahead) if len(tree) else -1
            a = int(tree.depths[node]) if node >= 0 else 0
            a_own = own.prefix_length(ahead)
            a_corp = max(fa.prefix_length(ahead) for fa in shards)
            g["rounds"] += 1
            g["tree"] += a
            g["copy_own"] += a_own
            g["copy_corpus"] += a_corp
            g["copy_best"] += max(a_own, a_corp)
            if a_corp > a_own and a_corp > a:
                g["lost_corpus"] += a_corp - a
                g["corpus_rounds"] += 1
                g["corpus_first_token_in_tree"] += bool(len(tree) and np.any((tree.parents == -1)
                                                                             & (tree.tokens == ahead[0])))
                kind = "corpus_other"
                for j, fa in enumerate(shards):
                    m = fa.match_length(text)
                    if rg_continued(fa, text, ahead[:a_corp], m) == a_corp:
                        kind = "corpus_longest"
                        break
                    if any(rg_continued(fa, text, ahead[:a_corp], k) == a_corp for k in range(1, m)):
                        kind = "corpus_shorter"
                anchor = int(session._cur[0, 2]) if len(shards) == 1 else -1
                g["corpus_anchored"] += anchor >= 0
                if len(shards) == 1 and _anchored_near(shards[0], anchor, text, ahead[:a_corp],
                                                       max(ANCHOR_MIN, shards[0].match_length(text)), 256):
                    g["corpus_near_anchor"] += 1
                g[kind] += 1
            elif a_own > a:
                g["lost_own"] += a_own - a
            commit = answer[pos : pos + a + 1]
            session.extend(commit)
            own.extend(commit)
            text = np.concatenate([text, commit])
            pos += commit.shape[0]
            g["tokens"] += commit.shape[0]
        session.close()
    r = max(g["rounds"], 1)
    g["per_round"] = {k: round(g[k] / r, 3) for k in ("tree", "copy_own", "copy_corpus", "copy_best", "lost_own",
                                                      "lost_corpus")}
    g["budget"] = budget
    return g


def rg_continued(fa, context: np.ndarray, ahead: np.ndarray, length: int) -> int:
    """How many tokens of `ahead` continue the context's last `length` tokens in `fa`."""
    if length < 1:
        return 0
    return fa.prefix_length(np.concatenate([context[context.shape[0] - length :], ahead])) - length


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the model (a GGUF): its tokenizer; with --record-traces, its answers")
    ap.add_argument("--record-traces", action="store_true", help="record the model's greedy answers (untimed), then stop")
    ap.add_argument("--traces", help="the traces (default: bench/.cache/continue_file_traces_<tokenizer>_<context>.jsonl)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--context-tokens", type=int, default=1280)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of --record-traces")
    ap.add_argument("--budgets", default="auto,8,16,32,64")
    ap.add_argument("--pld-tokens", type=int, default=10)
    ap.add_argument("--curve", help=f"JSON {{size: relative cost}} (default: the code model's, {CODE_CURVE})")
    ap.add_argument("--prefill-steps-per-token", type=float, default=CODE_PREFILL_STEPS_PER_TOKEN)
    ap.add_argument("--gap-budget", type=int, default=64, help="the fixed budget of the gap split by round")
    ap.add_argument("--options", type=rg.proposer_knobs, default={}, help='proposer knobs as JSON, e.g. \'{"recover": 0.3}\'')
    common.add_record_flag(ap)
    args = ap.parse_args(argv)
    if args.record_traces:
        print(record_traces(args.model, args.prompts, args.max_new_tokens, args.context_tokens, args.threads))
        return 0

    from suffixspec.tokenizer import load_tokenizer

    tok = load_tokenizer(args.model)
    path = Path(args.traces) if args.traces else traces_path(tok, args.context_tokens)
    if not path.exists():
        ap.error(f"no traces at {path}: record them first (--record-traces --model ...)")
    records = common.read_jsonl(path)[: args.prompts]
    corpus = bench_generate.continue_file_corpus(tok)
    curve = {int(k): float(v) for k, v in (json.loads(args.curve) if args.curve else CODE_CURVE).items()}
    cost = rg.StepCost(curve, args.prefill_steps_per_token)
    budgets = [b if b == "auto" else int(b) for b in args.budgets.split(",")]
    eos = tok.eos_token_id
    options = args.options
    res = rg.replay(records, cost, args.max_new_tokens, args.pld_tokens, options, eos=eos, corpus=corpus, budgets=budgets,
                    vocab=tok.vocab_size)
    bare = rg.replay(records, cost, args.max_new_tokens, args.pld_tokens, options, eos=eos, budgets=["auto"],
                     vocab=tok.vocab_size)
    st = res["steps"]
    st["ours-auto-nocorpus"] = bare["steps"]["ours"]
    tokens = sum(len(r["output_ids"][: args.max_new_tokens]) for r in records)
    print(f"{len(records)} prompts, {tokens} answer tokens; steps charged (curve {curve})")
    print(f"{'arm':<22} {'steps':>8} {'vs plain':>9} {'tok/round':>10}")
    tpr = {"ours": res["tokens_per_round"], "ours-auto-nocorpus": bare["tokens_per_round"]}
    tpr.update({k[: -len("_tokens_per_round")]: v for k, v in res.items() if k.endswith("_tokens_per_round")})
    for arm, steps in st.items():
        print(f"{arm:<22} {steps:>8.1f} {st['plain'] / steps:>8.2f}x {tpr.get(arm, float('nan')):>10.2f}")
    gaps = round_gaps(records, corpus, args.gap_budget, args.max_new_tokens, options)
    print(f"gap by round (budget {args.gap_budget}): " + json.dumps(gaps))
    common.emit({"traces": str(path), "prompts": len(records), "options": options, "tokens": tokens, "curve": curve,
                 "prefill_steps_per_token": args.prefill_steps_per_token, "budgets": args.budgets,
                 "steps": st, "vs_plain": {k: st["plain"] / v for k, v in st.items()}, "tokens_per_round": tpr,
                 "gaps": gaps}, args, "replay_continue_file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
