"""`suffixspec generate`: speculative generation with a real target model, streamed."""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..engine.options import DecodeOptions
from ..errors import BadInputError
from ..textinput import read_utf8
from .args import (
    add_cost_flags,
    check_threads,
    cost_options,
    open_corpora,
    parse_budget,
    parse_filters,
    recycle_default,
    recycle_help,
)


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate with a target model, drafting from prompt, outputs and corpora")
    p.add_argument("--model", default=None, metavar="PATH",
                   help="local transformers model directory or .gguf (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--corpus", action="append", default=[], metavar="INDEX", help="corpus index to draft from (repeatable; default: none)")
    p.add_argument("--filter", action="append", default=[], metavar="K=V", help="restrict corpus documents by tag (repeatable; default: every document)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", metavar="TEXT", help="the prompt text (this or --prompt-file is required)")
    src.add_argument("--prompt-file", metavar="F", help="read the prompt from a file ('-': stdin; this or --prompt is required)")
    p.add_argument("--chat", action="store_true",
                   help="the prompt is one user turn, rendered with the model's chat template (as `suffixspec serve` does)")
    p.add_argument("--chat-template", default=None, metavar="FILE", help="jinja2 chat template for --chat (default: the model's)")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N", help="most tokens generated (default 128)")
    p.add_argument("--temperature", type=float, default=None, metavar="T", help="sample at temperature T (default: greedy)")
    p.add_argument("--top-p", type=float, default=None, metavar="P", help="nucleus sampling: keep the smallest set of tokens whose probability reaches P (default: off)")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="sample among the K most likely tokens (default: off)")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="sampling seed (default: a random one)")
    p.add_argument("--budget", default="auto", metavar="N|auto", help="draft nodes per round (0: plain decoding; default auto)")
    p.add_argument("--recycle", action=argparse.BooleanOptionalAction, default=None,
                   help=recycle_help())
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch CPU threads (default: one per usable core, idle threads sleeping: OMP_WAIT_POLICY=PASSIVE; "
                        "the log says what was chosen)")
    p.add_argument("--stats", action="store_true", help="print generation statistics")
    p.add_argument("--compare", action="store_true", help="also run plain greedy decoding (transformers) and compare")
    p.add_argument("--json", action="store_true", help="print one JSON object with the statistics as the last line")
    add_cost_flags(p)
    p.set_defaults(func=run)


def run(args) -> int:
    budget, cost = parse_budget(args.budget), cost_options(args)  # a bad --cost-curve: refused before the model loads
    if args.max_new_tokens < 0:
        raise BadInputError(f"--max-new-tokens: expected >= 0, got {args.max_new_tokens}")
    if args.temperature is not None and not args.temperature >= 0:
        raise BadInputError(f"--temperature: expected a number >= 0 (0: greedy), got {args.temperature}")
    do_sample = args.temperature is not None and args.temperature > 0
    # every sampling setting is checked before the model loads
    DecodeOptions(max_new_tokens=args.max_new_tokens, do_sample=do_sample,
                  temperature=args.temperature if do_sample else 1.0, top_k=args.top_k, top_p=args.top_p,
                  seed=args.seed, budget=budget)
    prompt = args.prompt if args.prompt is not None else read_utf8(args.prompt_file, "--prompt-file")
    if args.chat_template is not None and not args.chat:
        raise BadInputError("--chat-template: expected together with --chat")
    found = None
    if args.chat:
        from ..http.chat import find_chat_template  # chat templates need no web stack

        found = find_chat_template(args.model, args.chat_template)

    check_threads(args.threads)
    from ..threads import ThreadPlan

    plan = ThreadPlan.start(args.threads)  # before torch is imported (OpenMP reads its settings once)
    import torch

    from ..draft.proposer import Proposer
    from ..generate import SpeculativeGenerator
    from ..models import load_model

    model, tokenizer = load_model(args.model)
    print(f"suffixspec generate: {plan.finish().describe()}", file=sys.stderr)
    if tokenizer is None:
        raise BadInputError(f"model {args.model!r} has no tokenizer.json; the CLI needs one to encode the prompt")
    filters = parse_filters(args.filter)
    corpora = open_corpora(args.corpus, tokenizer)
    if filters and not corpora:
        raise BadInputError("--filter needs at least one --corpus index")
    if found is not None:
        from ..http.chat import chat_template_for

        chat, _ = chat_template_for(found, tokenizer)
        if chat is None:
            raise BadInputError(f"--chat: model {args.model or 'default'!r} has no chat template; give --chat-template FILE")
        prompt = chat.render([{"role": "user", "content": prompt}])
    gen = SpeculativeGenerator(model, tokenizer, proposer=Proposer(corpus=corpora or None),
                               recycle=recycle_default(args.recycle), **cost)
    ids = tokenizer.encode(prompt)
    # one-time work (kernels, the tree check, the cost curve) before the clock, reported apart
    prep = gen.prepare(drafts=budget != 0, cost_curve=budget == "auto", prompt=ids)
    print(f"suffixspec generate: {prep.describe()}", file=sys.stderr)

    shown = [""]
    committed: list[int] = []

    def stream(_request, tokens):
        committed.extend(tokens)
        text = tokenizer.decode(committed)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the rest
            return
        sys.stdout.write(text[len(shown[0]):])
        sys.stdout.flush()
        shown[0] = text

    result = gen.generate([ids], max_new_tokens=args.max_new_tokens, do_sample=do_sample,
                          temperature=args.temperature if do_sample else 1.0, top_k=args.top_k, top_p=args.top_p,
                          seed=args.seed, stream=stream, budget=budget, filter=filters or None)
    final = tokenizer.decode(result.sequences[0])
    sys.stdout.write(final[len(shown[0]):] + "\n")
    stats = result.stats
    report = stats.to_dict()
    report.pop("per_request")
    report["prompt_tokens"] = len(ids)
    report["warmup_s"] = prep.total_s
    report["warmup"] = {"kernels_s": prep.kernels_s, "check_s": prep.check_s, "cost_curve_s": prep.cost_curve_s,
                        "first_pass_s": prep.first_pass_s}
    if gen.cost_model is not None:
        report["cost_curve"] = gen.cost_model.relative()
    if args.stats or args.compare:
        print("--- statistics", file=sys.stderr if args.json else sys.stdout)
        print(stats.summary())
        if gen.cost_model is not None:
            curve = ", ".join(f"{k}:{v:.2f}" for k, v in gen.cost_model.relative().items())
            print(f"pass cost relative to one token: {curve}")
    if args.compare:
        with torch.inference_mode():
            t = time.perf_counter()
            plain = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                   max_new_tokens=args.max_new_tokens, do_sample=False,
                                   pad_token_id=tokenizer.eos_token_id or 0)[0, len(ids):].tolist()
            plain_s = time.perf_counter() - t
        plain_tps = len(plain) / plain_s if plain_s > 0 else 0.0
        identical = plain == result.sequences[0] if not do_sample else None
        speedup = stats.tokens_per_s / plain_tps if plain_tps else 0.0
        print(f"plain decoding {plain_tps:.1f} tok/s  speculative {stats.tokens_per_s:.1f} tok/s  speedup {speedup:.2f}x"
              + ("" if identical is None else f"  identical output: {'yes' if identical else 'NO'}"))
        report.update(plain_tokens_per_s=plain_tps, speedup=speedup, identical=identical)
    if args.json:
        print(json.dumps(report))
    return 0
