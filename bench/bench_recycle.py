"""Recycled predictions as a draft source: tokens per round with the default model in the loop.

    python bench/bench_recycle.py --specbench ../shared/data/specbench-dev.jsonl   # Spec-Bench sample, chat, qa, edits
    python bench/bench_recycle.py --per-category 4 --sets specbench --budgets 16
    python bench/bench_recycle.py --flat-cost --record            # budget auto under a GPU-like cost curve

Greedy, fixed budgets (16 and 64 nodes a round) and 128 new tokens, three sources per budget on
the same prompts and model: the copy sources alone (today's drafting), recycled predictions alone
(a proposer that drafts nothing, so every node comes from the table) and both. Each setting starts
from a fresh proposer (its own cache of past responses) and an empty table, and decodes its set in
batches of `--batch` rows (the table learns across them, as a server's would). Outputs are checked
equal across settings (greedy output does not depend on the drafts). Reported: committed tokens per
round (every request's new tokens over its rounds, pooled), and for reference the copy ceiling on
the same outputs: the tokens per round of a clairvoyant copier that drafts, each round, the longest
span of the request's context (prompt and output so far) that the output continues with, at most
the budget (`ceiling`).

With `--flat-cost` the budget is automatic (or `--budgets auto,16,64`: beside fixed ones) and the cost
curve a pinned GPU-like one (a pass of k tokens costs 1 + 0.002 (k - 1) one-token steps,
`learn_cost=False`). Two predicted speed-ups over plain decoding, prefill excluded (not timings:
counts of tokens and passes): `predicted_speedup_pass`, every decode pass charged what the curve says
for the tokens it feeds, all rows and padding together, as the engine counts it (`GenerationStats.decode_pass_tokens`),
against plain decoding of the same outputs in the same batches (`plain_steps`, as if a batch's rows
started together; the engine may admit them a pass or two apart, and since the outputs are the same
at every budget, arms compare exactly): the simulated time a GPU whose passes cost that curve would
take; and `predicted_speedup_flat`, tokens per request-round over the curve at the mean tree size of
one request, as if each request's tree were its own pass (the older figure: it charges a batch of b
rows a b-th of what its passes feed, so it favours wide trees the engine rightly prices higher).
Prints a table, then one JSON line (`--record [PATH]`: also appended to bench/results/recycle.jsonl; runs
without the Spec-Bench sample to recycle_shipped.jsonl, `--flat-cost` runs to recycle_flat.jsonl).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

import common

SPECBENCH_ENV = "SUFFIXSPEC_SPECBENCH"


# a GPU-like curve the engine keeps as given (`learn_cost=False`): a pass of k tokens costs
# 1 + 0.002 (k - 1) one-token steps whatever this CPU measures
def flat_steps(tokens: int) -> float:
    """What a pass feeding `tokens` costs under the pinned flat curve, in one-token steps."""
    return 1.0 + 0.002 * (tokens - 1)


FLAT_CURVE = {k: flat_steps(k) for k in (1, 2, 4, 8, 16, 32, 64, 128)}


def plain_steps(lengths) -> float:
    """The decode passes of plain decoding for one batch of outputs of `lengths` tokens started
    together, under `FLAT_CURVE`: the prefill chooses each first token; pass t (t = 2 ..) feeds one
    token for every output at least t long."""
    lengths = np.asarray(lengths, np.int64)
    if not len(lengths):
        return 0.0
    alive = (lengths[None, :] >= np.arange(2, int(lengths.max()) + 1)[:, None]).sum(1)
    return float(sum(flat_steps(int(a)) for a in alive))


class NullProposer:
    """A proposer whose sessions draft nothing: with recycling on, every node is recycled."""

    class _Session:
        def extend(self, tokens):
            pass

        def propose(self, budget):
            from suffixspec.draft.tree import DraftTree

            return DraftTree.empty()

        def close(self):
            pass

    def start(self, prompt_ids, request_id=None, filter=None):
        return self._Session()


def specbench_sample(per_category: int, path: Path, skip: int = 0) -> list[tuple[str, str]]:
    """The first `per_category` prompts of every category after its first `skip`."""
    seen: dict[str, int] = defaultdict(int)
    out = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        cat = rec["category"]
        seen[cat] += 1
        if skip < seen[cat] <= skip + per_category:
            out.append((cat, rec["turns"][0]))
    return out


def copy_ceiling(context: list[int], output: list[int], budget: int) -> int:
    """Rounds a clairvoyant copier needs for `output` after `context`: each round commits the longest
    prefix of the rest (at most `budget`) found anywhere in what is committed, plus one token."""
    text = list(context)
    rounds, i = 0, 0
    while i < len(output):
        rest = output[i: i + budget]
        best = 0
        arr = np.asarray(text, np.int64)
        if rest:
            starts = np.flatnonzero(arr == rest[0])
            for s in starts.tolist():
                n = 0
                while n < len(rest) and s + n < len(text) and text[s + n] == rest[n]:
                    n += 1
                best = max(best, n)
        step = min(best + 1, len(output) - i)
        text.extend(output[i: i + step])
        i += step
        rounds += 1
    return rounds


def run_setting(model, tokenizer, prompts, source: str, budget, batch: int, max_new: int, flat: bool,
                warm: list[list[int]]):
    from suffixspec import SpeculativeGenerator
    from suffixspec.draft.proposer import Proposer

    proposer = NullProposer() if source == "recycle" else Proposer()
    gen = SpeculativeGenerator(model, tokenizer, proposer=proposer, recycle=source != "copy",
                               cost_curve=FLAT_CURVE if flat else None, learn_cost=not flat,
                               prefix_cache_bytes=0)
    for a in range(0, len(warm), batch):  # a server that ran before: its past responses and its table
        server = gen.serve(max_new_tokens=max_new, budget=budget, max_batch=batch)
        for p in warm[a: a + batch]:
            server.add(p)
        server.run()
    outputs, rounds, drafted, accepted, plain = [], 0, 0, 0, 0.0
    passes: Counter[int] = Counter()  # decode passes by tokens fed, as the engine counts them
    for a in range(0, len(prompts), batch):
        server = gen.serve(max_new_tokens=max_new, budget=budget, max_batch=batch)
        for p in prompts[a: a + batch]:
            server.add(p)
        result = server.run()
        outputs.extend(result.sequences)
        passes.update(result.stats.decode_pass_tokens)
        plain += plain_steps([len(s) for s in result.sequences])
        for rs in result.stats.requests:
            rounds += rs.rounds
            drafted += rs.drafted
            accepted += rs.accepted
    new = sum(len(o) for o in outputs)
    return {"outputs": outputs, "tokens_per_round": new / max(1, rounds), "rounds": rounds, "new_tokens": new,
            "drafted": drafted, "accepted": accepted, "table": gen.recycle_table.to_dict() if source != "copy" else None,
            "passes": sum(passes.values()), "pass_steps": sum(flat_steps(k) * n for k, n in passes.items()),
            "plain_steps": plain}


def chat_prompts(texts, tokenizer, template) -> list[list[int]]:
    return [tokenizer.encode(template.render([{"role": "user", "content": t}])) for t in texts]


def load_sets(names, per_category, tokenizer, template, limit, specbench):
    from suffixspec.bench.workloads import load_workload

    sets = {}
    for name in names:
        if name == "specbench":
            sets[name] = chat_prompts([t for _, t in specbench_sample(per_category, specbench)], tokenizer, template)
        else:
            wl = load_workload({"edit": "code_edit"}.get(name, name), limit)
            sets[name] = [r.prompt_ids if r.prompt_ids is not None else tokenizer.encode(r.prompt)
                          for r in wl.requests]
    return sets


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--specbench", default=None, metavar="PATH",
                   help=f"Spec-Bench development prompts (JSONL with category and turns; default: ${SPECBENCH_ENV})")
    p.add_argument("--sets", default="specbench,chat,qa,edit", help="comma list of specbench, chat, qa, edit")
    p.add_argument("--per-category", type=int, default=10, help="Spec-Bench prompts per category")
    p.add_argument("--limit", type=int, default=16, help="prompts of each shipped workload")
    p.add_argument("--budgets", default=None, help="comma list of sizes or auto (default 16,64; with --flat-cost: auto)")
    p.add_argument("--sources", default="copy,recycle,both")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--warm", type=int, default=0,
                   help="Spec-Bench prompts per category (after the sample's) each setting serves first, uncounted")
    p.add_argument("--flat-cost", action="store_true", help="budget auto under a GPU-like flat cost curve")
    p.add_argument("--threads", type=int, default=1)
    common.add_record_flag(p)
    args = p.parse_args(argv)

    import torch

    from suffixspec.http.chat import chat_template_for, find_chat_template
    from suffixspec.models import load_model

    specbench = common.given(args.specbench, SPECBENCH_ENV)
    if specbench is None and ("specbench" in args.sets.split(",") or args.warm):
        print(common.missing("Spec-Bench development prompts", "--specbench", SPECBENCH_ENV), file=sys.stderr)
        return 2
    specbench = Path(specbench) if specbench is not None else None
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model()
    template, _ = chat_template_for(find_chat_template("default"), tokenizer)
    sets = load_sets(args.sets.split(","), args.per_category, tokenizer, template, args.limit, specbench)
    warm = chat_prompts([t for _, t in specbench_sample(args.warm, specbench, skip=args.per_category)],
                        tokenizer, template) if args.warm else []
    given = args.budgets if args.budgets is not None else ("auto" if args.flat_cost else "16,64")
    budgets = [b if b == "auto" else int(b) for b in given.split(",")]
    sources = args.sources.split(",")
    rows, out = [], {}
    print(f"{'set':<10} {'budget':>6} {'source':<8} {'tok/round':>9} {'x copy':>7} {'drafted':>8} {'accepted':>8} "
          f"{'ceiling':>8}" + (f" {'x pass':>7} {'x row':>7}" if args.flat_cost else ""), flush=True)
    for name, prompts in sets.items():
        for budget in budgets:
            got = {}
            for source in sources:
                got[source] = run_setting(model, tokenizer, prompts, source, budget, args.batch,
                                          args.max_new_tokens, args.flat_cost, warm)
            ref = got[sources[0]]["outputs"]
            same = all(g["outputs"] == ref for g in got.values())
            cap = 64 if budget == "auto" else budget
            ceil_rounds = sum(copy_ceiling(p, o, cap) for p, o in zip(prompts, ref))
            ceiling = sum(len(o) for o in ref) / max(1, ceil_rounds)
            base = got.get("copy", {}).get("tokens_per_round")
            for source, g in got.items():
                ratio = g["tokens_per_round"] / base if base else float("nan")
                # a GPU-like pass of k tokens costs 1 + 0.002 (k - 1) steps: one request's tree alone ...
                g["predicted_speedup"] = g["tokens_per_round"] / (1 + 0.002 * g["drafted"] / max(1, g["rounds"]))
                # ... and every pass as fed, all rows together, against plain decoding of the same batches
                g["speedup_pass"] = g["plain_steps"] / g["pass_steps"] if g["pass_steps"] else float("nan")
                print(f"{name:<10} {budget!s:>6} {source:<8} {g['tokens_per_round']:>9.3f} {ratio:>7.3f} "
                      f"{g['drafted']:>8} {g['accepted']:>8} {ceiling:>8.3f}"
                      + (f" {g['speedup_pass']:>7.3f} {g['predicted_speedup']:>7.3f}" if args.flat_cost else ""),
                      flush=True)
                rows.append({"set": name, "budget": budget, "source": source, "prompts": len(prompts),
                             "tokens_per_round": round(g["tokens_per_round"], 4), "vs_copy": round(ratio, 4),
                             "rounds": g["rounds"], "new_tokens": g["new_tokens"], "drafted": g["drafted"],
                             "accepted": g["accepted"], "copy_ceiling": round(ceiling, 4), "identical": same,
                             "predicted_speedup_flat": round(g["predicted_speedup"], 4),
                             **({"predicted_speedup_pass": round(g["speedup_pass"], 4), "passes": g["passes"],
                                 "pass_steps": round(g["pass_steps"], 3), "plain_steps": round(g["plain_steps"], 3)}
                                if args.flat_cost else {})})
                if g["table"] is not None:
                    out[f"{name}/{budget}/{source}/calibration"] = g["table"]
            if not same:
                print(f"!! outputs differ across sources on {name} budget {budget}", file=sys.stderr)
    result = {"benchmark": "recycle", "max_new_tokens": args.max_new_tokens, "batch": args.batch, "warm": len(warm),
              "flat_cost": args.flat_cost, "rows": rows, "calibration": out}
    # the Spec-Bench sample's fixed budgets, the shipped workloads', and the flat-cost replay are kept apart
    name = "recycle_flat" if args.flat_cost else ("recycle" if "specbench" in sets else "recycle_shipped")
    result["benchmark"] = name
    common.emit(result, args, name)
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
