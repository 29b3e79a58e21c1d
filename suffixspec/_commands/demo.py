"""`suffixspec demo`: the embedded default end to end, no download.

Indexes the shipped code-edit sample with the embedded tokenizer, prints what the automaton
holds, replays the shipped code-edit traces through the proposer (acceptance measured without
a model) next to the copy-oracle, then generates with the embedded model (SmolLM2-135M-Instruct)
on a shipped code-edit prompt, speculative against plain greedy decoding, and checks that the
outputs are identical. `--no-generate` skips the model.
"""

from __future__ import annotations

import json
import time
from importlib import resources


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="index a shipped sample and replay shipped traces (embedded default)")
    p.add_argument("--budget", type=int, default=16, help="draft-tree nodes per round (default 16)")
    p.add_argument("--no-generate", action="store_true", help="skip generation with the embedded model")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N", help="most tokens generated (default 128)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch CPU threads (default: one per usable core, idle threads sleeping: OMP_WAIT_POLICY=PASSIVE; "
                        "the log says what was chosen)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.set_defaults(func=run)


def _generate(max_new_tokens: int, plan) -> dict:
    import sys

    import torch

    from ..draft.proposer import Proposer
    from ..generate import SpeculativeGenerator
    from ..models import load_model

    with resources.as_file(resources.files("suffixspec.corpora") / "copy_edit_prompts.jsonl") as path:
        with open(path, encoding="utf-8") as f:
            rec = json.loads(f.readline())
    model, tok = load_model(None)
    print(f"suffixspec demo: {plan.finish().describe()}", file=sys.stderr)
    ids = rec["prompt_ids"]
    gen = SpeculativeGenerator(model, tok, proposer=Proposer(global_cache=False))
    gen.generate([ids[:32]], max_new_tokens=8)  # warm up both paths (and measure the cost curve once)
    with torch.inference_mode():
        model.generate(torch.tensor([ids[:32]]), max_new_tokens=8, do_sample=False, pad_token_id=tok.eos_token_id)
        t = time.perf_counter()
        plain = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                               max_new_tokens=max_new_tokens, do_sample=False,
                               pad_token_id=tok.eos_token_id)[0, len(ids):].tolist()
        plain_s = time.perf_counter() - t
    result = gen.generate([ids], max_new_tokens=max_new_tokens)
    stats = result.stats
    out = result.sequences[0]
    print(f"prompt         {rec['id']}: {rec['instruction']} ({len(ids)} tokens)")
    print("output         " + tok.decode(out).strip().replace("\n", "\n               ")[:1200])
    print(f"generation     plain greedy {len(plain) / plain_s:.1f} tok/s, speculative {stats.tokens_per_s:.1f} tok/s "
          f"({stats.tokens_per_s * plain_s / max(len(plain), 1):.2f}x), {stats.tokens_per_round:.2f} tokens/round, "
          f"identical output: {'yes' if out == plain else 'NO'}")
    return {"plain_tok_s": len(plain) / plain_s, "speculative_tok_s": stats.tokens_per_s,
            "tokens_per_round": stats.tokens_per_round, "identical": out == plain}


def run(args) -> int:
    from ..threads import ThreadPlan
    from .args import check_threads

    check_threads(args.threads)
    plan = None if args.no_generate else ThreadPlan.start(args.threads)  # before torch is imported
    import numpy as np

    from ..draft.automaton import SuffixAutomaton
    from ..draft.proposer import Proposer
    from ..draft.simulate import load_traces, simulate
    from ..tokenizer import load_tokenizer

    tok = load_tokenizer(None)
    traces_path = resources.files("suffixspec.corpora") / "code_edit_traces.jsonl"
    with resources.as_file(traces_path) as path:
        traces = load_traces(path, tok)
    SuffixAutomaton([1, 2, 1]).freeze()  # load the compiled kernels before timing
    sam = SuffixAutomaton()
    t0 = time.perf_counter()
    for t in traces:
        sam.add_document(t.prompt)
    build_s = time.perf_counter() - t0
    frozen = sam.freeze()
    print(f"tokenizer      {tok.name} ({tok.vocab_size} ids, fingerprint {tok.fingerprint[:12]})")
    print(f"indexed        {len(sam)} tokens in {sam.n_documents} documents, {sam.n_states} states, {sam.n_edges} edges")
    print(f"memory         {sam.nbytes / len(sam):.1f} B/token live, {frozen.nbytes / len(sam):.1f} B/token frozen; built in {build_s * 1e3:.1f} ms")
    for text in (" return self", " import os"):
        probe = np.asarray(tok.encode(text), np.int32)
        print(f"query          {text.strip()!r} ({len(probe)} tokens) occurs {frozen.count(probe)} times")
    stats = simulate(traces, Proposer(), args.budget)
    print(f"replay         {len(traces)} code-edit traces, budget {args.budget}: "
          f"{stats['mean_accepted_tokens']:.2f} tokens/round (copy-oracle {stats['oracle_mean_accepted_tokens']:.2f}), "
          f"acceptance rate {stats['acceptance_rate']:.2f}, propose p50 {stats['propose_us_p50']:.1f} us")
    record = {"n_tokens": len(sam), "bytes_per_token": sam.nbytes / len(sam), **stats}
    if not args.no_generate:
        record["generation"] = _generate(args.max_new_tokens, plan)
    if args.json:
        print(json.dumps(record))
    return 0 if record.get("generation", {}).get("identical", True) else 1
