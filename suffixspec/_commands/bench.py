"""`suffixspec bench`: plain vs speculative decoding on a workload, under load; table, JSON, plots."""

from __future__ import annotations

import json
import sys
import time

from ..errors import BadInputError
from .args import open_corpora, parse_budget, parse_filters


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmark speculative against plain decoding before rolling it out")
    p.add_argument("--workload", default="code_edit", metavar="FILE|NAME",
                   help="a JSONL file or one of code_edit, code_completion, chat, mtbench, mtbench_turn2 (second "
                        "turns over the model's own first answers), math, math_reasoning, summarization, "
                        "long_context (default code_edit)")
    p.add_argument("--model", default=None, metavar="PATH",
                   help="local transformers model directory or .gguf (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--corpus", action="append", default=[], metavar="INDEX", help="corpus index to draft from (repeatable)")
    p.add_argument("--filter", action="append", default=[], metavar="K=V", help="restrict corpus documents by tag (repeatable)")
    p.add_argument("--concurrency", default="1,4", metavar="C1,C2,...",
                   help="requests in flight: closed-loop clients, or with --qps the most decoded together "
                        "(continuous batching either way); default 1,4")
    p.add_argument("--qps", type=float, default=None, metavar="R", help="Poisson arrivals at R requests/s (default: closed loop)")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="output limit per request (default 64)")
    p.add_argument("--budget", default="auto", metavar="N|auto", help="draft nodes per request and round (default auto)")
    p.add_argument("--temperature", type=float, default=None, metavar="T", help="sample at temperature T (default: greedy)")
    p.add_argument("--top-p", type=float, default=None, metavar="P")
    p.add_argument("--top-k", type=int, default=None, metavar="K")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="sampling and arrival seed (default 0)")
    p.add_argument("--repeat", type=int, default=1, metavar="K", help="repeat every configuration K times (default 1)")
    p.add_argument("--num-prompts", type=int, default=4, metavar="N", help="first N prompts of the workload (default 4)")
    p.add_argument("--no-prompt-lookup", action="store_true", help="skip transformers' prompt-lookup peer")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads (default: torch's)")
    p.add_argument("--out", default="bench_out", metavar="DIR", help="report directory (default ./bench_out)")
    p.set_defaults(func=run)


def parse_concurrency(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BadInputError(f"--concurrency: expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise BadInputError(f"--concurrency: expected positive integers, got {text!r}")
    return sorted(set(values))


def settings_from_args(args):
    from ..bench import MODES, BenchSettings

    if args.max_new_tokens <= 0:
        raise BadInputError(f"--max-new-tokens: expected > 0, got {args.max_new_tokens}")
    if args.repeat <= 0:
        raise BadInputError(f"--repeat: expected > 0, got {args.repeat}")
    if args.qps is not None and args.qps <= 0:
        raise BadInputError(f"--qps: expected > 0, got {args.qps}")
    modes = tuple(m for m in MODES if not (m == "prompt_lookup" and args.no_prompt_lookup))
    return BenchSettings(concurrency=parse_concurrency(args.concurrency), qps=args.qps,
                         max_new_tokens=args.max_new_tokens, budget=parse_budget(args.budget),
                         temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                         repeat=args.repeat, modes=modes)


def run(args) -> int:
    settings = settings_from_args(args)
    from .. import bench

    workload = bench.load_workload(args.workload, args.num_prompts)
    filters = parse_filters(args.filter)
    if filters and not args.corpus:
        raise BadInputError("--filter needs at least one --corpus index")
    t_start = time.perf_counter()

    import torch

    from ..models import load_model
    from ..proposer import Proposer

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model)
    if tokenizer is None and any(r.prompt_ids is None for r in workload.requests):
        raise BadInputError(f"model {args.model!r} has no tokenizer.json; text workloads need one")
    prompts = [r.prompt_ids if r.prompt_ids is not None else list(tokenizer.encode(r.prompt)) for r in workload.requests]
    corpora = open_corpora(args.corpus, tokenizer)
    if filters:
        corpora = [c.restrict(filters) for c in corpora]

    def make_proposer():
        return Proposer(corpus=corpora or None)

    spec = bench.SpeculativeBackend(model, tokenizer, make_proposer)
    if any(r.followup is not None for r in workload.requests):
        print(f"suffixspec bench: {workload.name}: answering the first turns (plain greedy, untimed)", file=sys.stderr)
        from ..generate import SpeculativeGenerator

        first_turns = SpeculativeGenerator(model, tokenizer)  # budget 0 below: plain greedy decoding
        prompts = bench.prepare_followups(workload, prompts, tokenizer, lambda ids, n: first_turns.generate(
            [ids], max_new_tokens=n, budget=0).sequences[0])
    backends = {"plain": spec, "speculative": spec}
    if "prompt_lookup" in settings.modes and 1 in settings.concurrency:
        backends["prompt_lookup"] = bench.PromptLookupBackend(model, settings.prompt_lookup_num_tokens)
    load_s = time.perf_counter() - t_start

    # warm up every path (and measure the cost curve once) on the first prompt
    print(f"suffixspec bench: {workload.name} ({len(prompts)} prompts, {sum(map(len, prompts))} prompt tokens), "
          f"model loaded in {load_s:.1f} s; warming up", file=sys.stderr)
    bench.warm_up_all(backends, prompts, settings)  # with the whole first prompt
    settings.warmup = False  # done above

    t_bench = time.perf_counter()
    runs = bench.run_benchmark(workload, prompts, backends, settings, progress=True)
    records = bench.summarize(runs, settings)
    bench_s = time.perf_counter() - t_bench

    decode = (lambda ids: tokenizer.decode(ids)) if tokenizer is not None else (lambda ids: " ".join(map(str, ids)))
    quality = bench.quality_gate(workload, runs, decode)
    constraint = None
    if tokenizer is not None:
        constraint = _constraint_check(bench, spec, model, tokenizer, prompts, settings)

    report = {
        "tool": "suffixspec bench",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": sys.argv,
        "settings": {
            "workload": {"name": workload.name, "source": workload.source, "note": workload.note,
                         "prompts": len(prompts), "request_ids": [r.id for r in workload.requests],
                         "prompt_tokens": [len(p) for p in prompts]},
            "model": args.model or "default (SmolLM2-135M-Instruct, embedded GGUF)",
            "corpora": args.corpus, "filter": filters,
            "concurrency": settings.concurrency,
            "arrivals": ({"kind": "poisson", "qps": settings.qps, "seed": settings.seed, "max_batch": settings.concurrency}
                         if settings.qps else {"kind": "closed_loop", "clients": settings.concurrency}),
            "batching": "continuous: requests join the running batch between rounds (at most C), finished ones leave",
            "max_new_tokens": settings.max_new_tokens, "budget": settings.budget,
            "sampling": {"do_sample": settings.do_sample, "temperature": settings.temperature, "top_k": settings.top_k,
                         "top_p": settings.top_p, "seed": settings.seed},
            "repeat": settings.repeat, "modes": list(settings.modes),
            "prompt_lookup_num_tokens": settings.prompt_lookup_num_tokens,
            "plain_mode": "SpeculativeGenerator with budget=0 (same runtime, cache and sampler)",
            "cost_curve": spec.cost_model.relative() if spec.cost_model is not None else None,
        },
        "environment": bench.environment(model, tokenizer),
        "timing": {"load_s": load_s, "bench_s": bench_s, "total_s": time.perf_counter() - t_start},
        "records": records,
        "quality": quality,
        "structured_output": constraint,
        "runs": [{"mode": r.mode, "concurrency": r.concurrency, "repeat": r.repeat, "makespan_s": r.makespan_s,
                  "requests": r.requests, "errors": r.errors,
                  **({"outputs": [decode(o) for o in r.outputs]} if r.repeat == 0 else {})} for r in runs],
    }
    from pathlib import Path

    out = Path(args.out)
    bench.write_report(out / "report.json", report)
    plots = bench.write_plots(out, records, f"({workload.name})")

    print(f"workload {workload.name}: {len(prompts)} prompts, max_new_tokens {settings.max_new_tokens}, "
          f"budget {settings.budget}, {'T=' + str(settings.temperature) if settings.do_sample else 'greedy'}, "
          f"{'qps ' + str(settings.qps) if settings.qps else 'closed loop'}, repeat {settings.repeat}")
    print(bench.format_table(records))
    for rec in records:
        if "sampled_identical_to_plain" in rec:
            print(f"sampling, c={rec['concurrency']}: speculative outputs identical to plain decoding with the same "
                  f"draws: {rec['sampled_identical_to_plain']}")
    if quality:
        parts = [f"{m} {quality[m]['correct']}/{quality[m]['total']} [{quality[m]['ci95'][0]:.2f}, {quality[m]['ci95'][1]:.2f}]"
                 for m in ("plain", "speculative", "prompt_lookup") if m in quality]
        verdict = "" if "within_noise" not in quality else ("  same within noise" if quality["within_noise"] else "  DIFFERENT")
        print(f"quality ({quality['metric']}): " + "  ".join(parts) + verdict)
    if constraint:
        print(f"structured output ({constraint['constraint']}): {constraint['requests']} speculative outputs, "
              f"{constraint['invalid']} invalid, {constraint['mismatches']} differ from plain")
    print(f"report {out / 'report.json'}  plots {', '.join(Path(p).name for p in plots)}  "
          f"({report['timing']['total_s']:.0f} s)")
    slim = [{k: rec.get(k) for k in ("mode", "concurrency", "ttft_ms", "tpot_ms", "e2e_ms_p50", "throughput_tok_s",
                                      "mean_accepted_tokens", "acceptance_rate", "mismatches", "speedup")}
            for rec in records]
    print(json.dumps({"report": str(out / "report.json"), "records": slim}))
    failed = any(rec["failures"] for rec in records) or (constraint and (constraint["invalid"] or constraint["mismatches"]))
    return 1 if failed else 0


def _constraint_check(bench, spec, model, tokenizer, prompts, settings) -> dict:
    """Speculative decoding under a structured-output constraint (a LogitsProcessor): every output must
    stay inside the grammar; greedy outputs must also equal plain decoding under the same constraint."""
    vocab = int(model.get_input_embeddings().weight.shape[0])
    eos = getattr(model.generation_config, "eos_token_id", None)
    eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    constraint = bench.CharsetConstraint(tokenizer, vocab, eos_token_id=eos)
    sample = prompts[: min(2, len(prompts))]
    kw = dict(max_new_tokens=min(16, settings.max_new_tokens), do_sample=settings.do_sample,
              temperature=settings.temperature if settings.do_sample else 1.0, top_k=settings.top_k,
              top_p=settings.top_p, seed=settings.seed, logits_processor=[constraint])
    got = spec.fresh().generate(sample, budget=settings.budget, **kw).sequences
    invalid = sum(not constraint.valid(seq) for seq in got)
    mismatches = 0
    if not settings.do_sample:
        ref = spec.fresh().generate(sample, budget=0, **kw).sequences
        mismatches = sum(a != b for a, b in zip(got, ref))
    return {"constraint": f"tokens over the charset {constraint.charset!r} + eos", "requests": len(got),
            "invalid": invalid, "mismatches": mismatches, "outputs": [tokenizer.decode(s) for s in got]}
