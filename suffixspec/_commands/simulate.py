"""`suffixspec simulate TRACES.jsonl`: acceptance of the proposer on recorded traces, no model."""

from __future__ import annotations

import json

from ..errors import BadInputError
from .args import open_corpora, parse_filters


def add_parser(sub) -> None:
    p = sub.add_parser("simulate", help="replay recorded traces through the proposer (no model needed)")
    p.add_argument("traces", metavar="TRACES.jsonl", help="recorded (prompt, output) traces, one JSON object a line")
    p.add_argument("--corpus", action="append", default=[], metavar="INDEX", help="corpus index to draft from (repeatable; default: none)")
    p.add_argument("--filter", action="append", default=[], metavar="K=V", help="restrict corpus documents by tag (repeatable; default: every document)")
    p.add_argument("--budget", type=int, default=16, metavar="N", help="draft-tree nodes per round (default 16)")
    p.add_argument("--tokenizer", default=None, metavar="TOK", help="tokenizer for text traces (default: embedded)")
    p.add_argument("--vocab-size", type=int, default=None, metavar="N",
                   help="token ids must be below N (default: the tokenizer's or the corpus's vocabulary, when known)")
    p.add_argument("--no-global-cache", action="store_true", help="do not learn from earlier traces' outputs")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..draft.proposer import Proposer
    from ..draft.simulate import load_traces, simulate

    if args.budget < 1:
        raise BadInputError(f"--budget: expected an integer >= 1, got {args.budget}")
    if args.vocab_size is not None and args.vocab_size < 1:
        raise BadInputError(f"--vocab-size: expected an integer >= 1, got {args.vocab_size}")
    tokenizer = None
    if args.tokenizer is not None:
        from ..tokenizer import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer)
    try:
        traces = load_traces(args.traces, tokenizer, args.vocab_size)
    except BadInputError as exc:
        if tokenizer is not None or "needs a tokenizer" not in str(exc):
            raise
        from ..tokenizer import load_tokenizer

        tokenizer = load_tokenizer(None)  # text traces and no --tokenizer: the embedded default
        traces = load_traces(args.traces, tokenizer, args.vocab_size)
    filters = parse_filters(args.filter)
    corpora = open_corpora(args.corpus, tokenizer)
    if filters and not corpora:
        raise BadInputError("--filter needs at least one --corpus index")
    vocab = args.vocab_size or next((int(c.tokenizer_info["vocab_size"]) for c in corpora), None)
    if vocab is not None and args.vocab_size is None and tokenizer is None:
        load_traces(args.traces, None, vocab)  # id traces against the corpus's vocabulary
    proposer = Proposer(corpus=corpora or None, global_cache=not args.no_global_cache)
    stats = simulate(traces, proposer, args.budget, filter=filters or None)
    print(f"traces            {len(traces)}")
    for key in ("rounds", "output_tokens", "mean_accepted_tokens", "oracle_mean_accepted_tokens",
                "context_bound_mean_accepted_tokens", "acceptance_rate", "drafted_per_round", "propose_us_p50",
                "propose_us_p99", "propose_us_max"):
        value = stats[key]
        print(f"{key:<29} {value:.3f}" if isinstance(value, float) else f"{key:<29} {value}")
    print("accepted_by_position          " + " ".join(f"{x:.2f}" for x in stats["accepted_by_position"][:16]))
    if args.json:
        print(json.dumps(stats))
    return 0
