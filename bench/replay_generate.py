"""Offline replay of speculative generation against transformers' prompt lookup (PLD), no model.

Greedy decoding is deterministic, so a recorded greedy answer tells what the target would choose at
every position of its own path. `TraceModel` stands in for the model: at position q it puts all its
logit mass on token q + 1 of the recorded prompt + answer (a draft node off the recorded path is
rejected before anything below it matters). The real `SpeculativeGenerator` (proposer, automatic
budget, calibration, verification bookkeeping) runs over it at concurrency 1, and every forward pass
is charged its cost in one-token steps from a pass-cost curve (default: this machine's cached curve
of the embedded default model). Prompt lookup is replayed with transformers' rule (the last 2, then
1 tokens matched at their first occurrence, up to `--pld-tokens` drafted) on the same costs. Prefill
is charged `--prefill-steps-per-token` per prompt token for every method (the default is a measured
prefill's time over a one-token step's on the default model, divided by the prompt's tokens).

Also reported (both after a plain prefill): a clairvoyant budget, which knows the path of the
proposer's 64-node tree that the target accepts and, each round, keeps the best-scored nodes up to
the prefix of that path with the most tokens per charged step (about the best a budget rule could do
with these trees, round by round), and a clairvoyant copier, which drafts the longest span of the
context that the answer continues with (the best any proposer copying spans of the request could do
round by round, 64 tokens a round at most).

    python bench/replay_generate.py                                    # both copy-edit sets
    python bench/replay_generate.py corpora/copy_edit_heldout.jsonl --max-new-tokens 96
    python bench/replay_generate.py --record                           # the JSON line kept too

Not a timing: ratios of charged steps. Per-round overhead is not charged and the curve does not adapt
as on the model (in situ, small passes cost more steps than the cached curve says), so workloads of
many short rounds come out optimistic next to what bench_generate measures on the model.
Prints a table, then one JSON line (`--record [PATH]`: also appended to
bench/results/replay_generate.jsonl with the date, host and git revision).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from suffixspec.bench.peers import prompt_lookup_propose
from suffixspec.bench.record import add_record_flag, emit

# Imported by file path in tests, so this script imports no sibling module of bench/.
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SETS = [ROOT / "corpora" / "copy_edit_prompts.jsonl", ROOT / "corpora" / "copy_edit_heldout.jsonl"]


class StepCost:
    """Steps charged for a pass feeding `tokens`: the relative curve up to its largest size; beyond,
    `per_token` steps a token (prefill-like passes), never less than the curve's last size."""

    def __init__(self, relative: dict, per_token: float):
        self.sizes = np.array(sorted(relative), np.float64)
        self.steps = np.array([relative[int(s)] for s in self.sizes], np.float64)
        self.per_token = float(per_token)

    def __call__(self, tokens: int) -> float:
        if tokens <= self.sizes[-1]:
            return float(np.interp(tokens, self.sizes, self.steps))
        return float(max(self.steps[-1], tokens * self.per_token))


def trace_model(vocab: int, eos: int):
    """A stand-in causal LM whose greedy choice at position q is `self.tokens[q + 1]`."""
    import torch
    from transformers import GenerationConfig, PretrainedConfig

    class TraceModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1))  # device and dtype for KVState
            self.config = PretrainedConfig(vocab_size=vocab)
            self.config._attn_implementation = "sdpa"
            self.generation_config = GenerationConfig(eos_token_id=eos)
            self.tokens = np.zeros(1, np.int64)
            self.charged = []  # tokens fed by each pass

        def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=True,
                    logits_to_keep=0):
            b, w = input_ids.shape
            self.charged.append(b * w)
            keep = w if not logits_to_keep else int(logits_to_keep)
            pos = position_ids[:, w - keep :].numpy() + 1
            nxt = self.tokens[np.minimum(pos, len(self.tokens) - 1)]
            logits = torch.full((b, keep, vocab), -1e4)
            logits.scatter_(2, torch.from_numpy(nxt)[..., None], 0.0)
            return type("Out", (), {"logits": logits})()

    return TraceModel()


def lookup_draft(context: list[int], n_out: int, max_ngram: int = 2, eos: int | None = None) -> list[int]:
    """transformers' prompt lookup (`suffixspec.bench.peers.prompt_lookup_propose`: the last `max_ngram`..1
    tokens at their first earlier occurrence, up to `n_out` tokens), cut before the first `eos` as
    transformers does."""
    follow = prompt_lookup_propose(np.asarray(context, np.int32), n_out, max_ngram).tolist()
    return follow[: follow.index(eos)] if eos is not None and eos in follow else follow


def lookup_steps(prompt, answer, cost: StepCost, n_out: int, eos: int | None = None) -> float:
    """Charged steps of transformers' prompt-lookup decoding, prefill included: like transformers it
    drafts on the prompt's own pass too. Unlike it, drafts stop at the answer's end (what the target
    would say past it is not recorded)."""
    context, pos, steps = list(prompt), 0, 0.0
    while pos < len(answer):
        draft = lookup_draft(context, n_out, eos=eos)[: len(answer) - pos - 1]
        a = 0
        while a < len(draft) and draft[a] == answer[pos + a]:
            a += 1
        steps += cost((len(prompt) if pos == 0 else 1) + len(draft))
        context += answer[pos : pos + a + 1]
        pos += a + 1
    return steps


def clairvoyant_steps(prompt, answer, cost: StepCost, budget: int = 64, options=None, corpus=None) -> float:
    """Per round, the prefix of the accepted path of the proposer's tree (`options`: its knobs;
    `corpus`: its corpus) with the most tokens per charged step; the prefill is not charged."""
    from suffixspec.draft.proposer import Proposer

    session = Proposer(corpus, **dict(options or {}, global_cache=False)).start(prompt)
    session.extend(answer[:1])
    pos, steps = 1, 0.0
    while pos < len(answer):
        if pos == len(answer) - 1:  # the last token: a plain step
            steps += cost(1)
            break
        tree = session.propose(min(budget, len(answer) - pos - 1))
        node, path = tree.longest_accepted(answer[pos:]) if len(tree) else -1, []
        while node >= 0:  # the accepted path, root first
            path.insert(0, node)
            node = int(tree.parents[node])
        rank = np.empty(len(tree), np.int64)
        rank[np.argsort(-tree.scores, kind="stable")] = np.arange(len(tree))
        best, take, nodes = 1.0 / cost(1), 0, 0  # tokens per step
        for j in range(1, len(path) + 1):
            k = int(rank[path[:j]].max()) + 1
            if (j + 1) / cost(1 + k) > best:
                best, take, nodes = (j + 1) / cost(1 + k), j, k
        steps += cost(1 + nodes)
        session.extend(answer[pos : pos + take + 1])
        pos += take + 1
    session.close()
    return steps


def replay(records, cost: StepCost, max_new_tokens: int = 96, pld_tokens: int = 10, proposer_options=None,
           eos: int | None = 2, corpus=None, budgets=("auto",), vocab: int = 1 << 16) -> dict:
    """Charged steps of plain decoding, prompt lookup, suffixspec (each of `budgets`: "auto" or a
    fixed size; the first is "ours", the others "ours-<budget>"), the clairvoyant budget and the
    clairvoyant copier over `records` (dicts with `prompt_ids` and `output_ids`; those with an empty
    answer are skipped), with their ratios. `eos`: the token prompt lookup never drafts past (the
    default model's end of turn). `corpus`: a corpus index the proposer drafts from too; the
    copier then runs twice, on the request alone ("copier") and with the corpus ("copier+corpus").
    `vocab`: the stand-in model's vocabulary (above every token id of the records)."""
    from suffixspec.draft.proposer import Proposer
    from suffixspec.generate import CostModel, SpeculativeGenerator

    class ChargedCost(CostModel):
        def observe(self, *a, **k):  # the replay's passes take no real time: keep the curve as given
            return

    options = dict(proposer_options or {}, global_cache=False)
    model = trace_model(vocab=vocab, eos=-1)
    sizes = cost.sizes.astype(int).tolist()
    names = ["ours"] + [f"ours-{b}" for b in budgets[1:]]
    gens = {name: SpeculativeGenerator(model, proposer=Proposer(corpus, **options),
                                       cost_model=ChargedCost(sizes, cost.steps.tolist()), prefix_cache_bytes=0)
            for name in names}
    for gen in gens.values():
        gen.assume_support(None)  # the stand-in has no attention to check
    tot = dict.fromkeys(["plain", "pld", *names, "clairvoyant", "copier"] + (["copier+corpus"] if corpus else []), 0.0)
    rounds = dict.fromkeys(names, 0)
    tokens = 0
    records = [r for r in records if len(r["output_ids"][:max_new_tokens])]
    for rec in records:
        prompt, answer = list(rec["prompt_ids"]), list(rec["output_ids"][:max_new_tokens])
        prefill = cost(len(prompt))
        model.tokens = np.array(prompt + answer + [0], np.int64)
        for name, budget in zip(names, budgets):
            model.charged = []
            res = gens[name].generate([prompt], max_new_tokens=len(answer), budget=budget)
            if res.sequences[0] != answer:
                raise RuntimeError(f"the replay diverged from the recorded answer of {rec.get('id')}")
            tot[name] += sum(cost(t) for t in model.charged)  # the first pass: the prompt (and drafts riding along)
            rounds[name] += res.stats.rounds
        tot["plain"] += prefill + (len(answer) - 1) * cost(1)
        tot["pld"] += lookup_steps(prompt, answer, cost, pld_tokens, eos)
        tot["clairvoyant"] += prefill + clairvoyant_steps(prompt, answer, cost, options=options, corpus=corpus)
        tot["copier"] += prefill + copier_steps(prompt, answer, cost)
        if corpus is not None:
            tot["copier+corpus"] += prefill + copier_steps(prompt, answer, cost, corpus=corpus)
        tokens += len(answer)
    out = {"prompts": len(records), "steps": {k: round(v, 1) for k, v in tot.items()},
           "ours_vs_pld": tot["pld"] / tot["ours"], "clairvoyant_vs_pld": tot["pld"] / tot["clairvoyant"],
           "copier_vs_pld": tot["pld"] / tot["copier"],
           "ours_vs_plain": tot["plain"] / tot["ours"], "tokens_per_round": tokens / max(rounds["ours"], 1)}
    for name in names[1:]:
        out[f"{name}_vs_plain"] = tot["plain"] / tot[name]
        out[f"{name}_tokens_per_round"] = tokens / max(rounds[name], 1)
    return out


def copier_steps(prompt, answer, cost: StepCost, budget: int = 64, corpus=None) -> float:
    """The clairvoyant copier: per round, the longest prefix of the rest of the answer found anywhere
    in the context (prompt and answer so far; with `corpus`, a corpus index, in its documents too),
    at most `budget`, drafted as a chain: no proposer that copies spans of the request (and the
    corpus) can do better per round."""
    from suffixspec.draft.automaton import SuffixAutomaton

    own = SuffixAutomaton(np.asarray(prompt + answer[:1], np.int32))
    shards = [shard.fa for shard in corpus.shards] if corpus is not None else []
    pos, steps = 1, 0.0
    while pos < len(answer):
        ahead = np.asarray(answer[pos : pos + min(budget, len(answer) - pos - 1)], np.int32)
        a = max([own.prefix_length(ahead)] + [fa.prefix_length(ahead) for fa in shards])
        steps += cost(1 + a)
        own.extend(np.asarray(answer[pos : pos + a + 1], np.int32))
        pos += a + 1
    return steps


def proposer_knobs(text: str) -> dict:
    """`--options`' argparse type: a JSON object of proposer knobs (their names and values are checked
    by `ProposerConfig` when the proposer is made)."""
    try:
        knobs = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object of proposer knobs, got {text!r} ({exc})") from None
    if not isinstance(knobs, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object of proposer knobs, got {type(knobs).__name__}")
    return knobs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sets", nargs="*", default=[str(p) for p in DEFAULT_SETS],
                    help="JSONL files with prompt_ids and output_ids (greedy answers of the model)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--pld-tokens", type=int, default=10)
    ap.add_argument("--prefill-steps-per-token", type=float, default=0.037)
    ap.add_argument("--curve", help="JSON {size: relative cost}; default: the embedded model's cached curve")
    ap.add_argument("--options", type=proposer_knobs, default={}, help='proposer knobs as JSON, e.g. \'{"recover": 0.3}\'')
    add_record_flag(ap)
    args = ap.parse_args(argv)

    if args.curve:
        relative = {int(k): float(v) for k, v in json.loads(args.curve).items()}
    else:
        from suffixspec.generate import CostModel
        from suffixspec.models import load_model

        relative = CostModel.cached(load_model()[0]).relative()
    cost = StepCost(relative, args.prefill_steps_per_token)
    summary = {}
    print(f"{'set':<28} {'prompts':>7} {'plain':>8} {'PLD':>8} {'ours':>8} {'clairv.':>8} {'copier':>8}"
          "   ours/PLD  clairv./PLD  copier/PLD  tok/round")
    for path in args.sets:
        records = []
        for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            if not isinstance(rec, dict) or not {"prompt_ids", "output_ids"} <= set(rec):
                got = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
                ap.error(f"{path}:{lineno}: expected a JSON object with prompt_ids and output_ids (token ids of "
                         f"the model's greedy answer), got {got}")
            records.append(rec)
        name = Path(path).name
        s = summary[name] = replay(records, cost, args.max_new_tokens, args.pld_tokens, args.options)
        st = s["steps"]
        print(f"{name:<28} {len(records):>7} {st['plain']:>8.0f} {st['pld']:>8.0f} {st['ours']:>8.0f} "
              f"{st['clairvoyant']:>8.0f} {st['copier']:>8.0f}   {s['ours_vs_pld']:>7.2f}x  {s['clairvoyant_vs_pld']:>10.2f}x"
              f"  {s['copier_vs_pld']:>9.2f}x  {s['tokens_per_round']:>8.2f}")
    emit({"max_new_tokens": args.max_new_tokens, "pld_tokens": args.pld_tokens, "curve": relative,
          "options": args.options,
          "prefill_steps_per_token": args.prefill_steps_per_token, "sets": summary}, args, "replay_generate",
         ROOT / "bench" / "results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
