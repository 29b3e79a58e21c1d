"""`suffixspec demo`: the embedded default end to end, no download.

Indexes the shipped code-edit sample with the embedded tokenizer, prints what the automaton
holds, then replays the shipped code-edit traces through the proposer (acceptance measured
without a model) next to the copy-oracle. With `--generate` (the default once the model
package is installed) it also runs speculative generation with the embedded model against
plain decoding.
"""

from __future__ import annotations

import json
import time
from importlib import resources


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="index a shipped sample and replay shipped traces (embedded default)")
    p.add_argument("--budget", type=int, default=16, help="draft-tree nodes per round")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.set_defaults(func=run)


def run(args) -> int:
    import numpy as np

    from ..automaton import SuffixAutomaton
    from ..proposer import Proposer
    from ..simulate import load_traces, simulate
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
    if args.json:
        print(json.dumps({"n_tokens": len(sam), "bytes_per_token": sam.nbytes / len(sam), **stats}))
    return 0
