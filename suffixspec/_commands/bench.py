"""`suffixspec bench`: plain vs speculative decoding on a workload, under load; table, JSON, plots.

Two targets run the same workloads, arrival processes, statistics and report: this process (a
model loaded here, modes plain / speculative / prompt_lookup) or, with `--url`, any OpenAI-compatible
endpoint (modes: request-body extensions, `suffixspec.bench.remote`). `--grid` runs the named grid
(`suffixspec.bench.grid`) on either target: one verdict per cell and a heat map.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ..errors import BadInputError
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
    p = sub.add_parser("bench", help="benchmark speculative against plain decoding before rolling it out")
    p.add_argument("--workload", default="code_edit", metavar="FILE|NAME",
                   help="a JSONL file or one of code_edit, code_completion, chat, qa, mtbench, mtbench_turn2 (second "
                        "turns over the model's own first answers), math, math_reasoning, summarization, "
                        "long_context, agent (a tool-using agent writing back the code it read), editor (editor sessions "
                        "over a repository: fill-in-the-middle at every debounced keystroke, superseded requests "
                        "cancelled; see the editor options below) (default code_edit)")
    p.add_argument("--model", default=None, metavar="PATH|NAME",
                   help="local transformers model directory or .gguf (default: embedded SmolLM2-135M-Instruct); "
                        "with --url the served model's name (default: the first of GET /v1/models)")
    p.add_argument("--corpus", action="append", default=[], metavar="INDEX", help="corpus index to draft from (repeatable; default: none)")
    p.add_argument("--filter", action="append", default=[], metavar="K=V", help="restrict corpus documents by tag (repeatable; default: every document)")
    p.add_argument("--concurrency", default="1,4", metavar="C1,C2,...",
                   help="requests in flight: closed-loop clients, or with --qps the most decoded together "
                        "(continuous batching either way); default 1,4")
    p.add_argument("--qps", type=float, default=None, metavar="R", help="Poisson arrivals at R requests/s (default: closed loop)")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="output limit per request (default 64)")
    p.add_argument("--budget", default="auto", metavar="N|auto", help="draft nodes per request and round (default auto)")
    p.add_argument("--recycle", action=argparse.BooleanOptionalAction, default=None,
                   help=recycle_help())
    p.add_argument("--temperature", type=float, default=None, metavar="T", help="sample at temperature T (default: greedy)")
    p.add_argument("--top-p", type=float, default=None, metavar="P", help="nucleus sampling: keep the smallest set of tokens whose probability reaches P (default: off)")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="sample among the K most likely tokens (default: off)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="sampling and arrival seed (default 0)")
    p.add_argument("--repeat", type=int, default=1, metavar="K", help="repeat every configuration K times (default 1)")
    p.add_argument("--num-prompts", type=int, default=4, metavar="N", help="first N prompts of the workload (default 4)")
    p.add_argument("--no-prompt-lookup", action="store_true", help="skip transformers' prompt-lookup peer")
    p.add_argument("--sequential", action="store_true",
                   help="run the modes of a concurrency back to back (default here: together, their engines "
                        "taking turns step by step, each timed only during its own steps)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch CPU threads of a model loaded here (default: one per usable core, idle threads sleeping: OMP_WAIT_POLICY=PASSIVE; "
                        "the log says what was chosen)")
    p.add_argument("--out", default="bench_out", metavar="DIR", help="report directory (default ./bench_out)")
    p.add_argument("--record", nargs="?", const="", default=None, metavar="PATH",
                   help="also append the JSON line printed last, with the date, host, git revision and command line, "
                        "to PATH (default: bench/results/suffixspec_bench.jsonl, or suffixspec_bench_grid.jsonl with "
                        "--grid, of the checkout suffixspec runs from, else of the current folder)")
    add_cost_flags(p)
    g = p.add_argument_group("an HTTP endpoint instead of a model loaded here")
    g.add_argument("--url", default=None, metavar="http://HOST:PORT",
                   help="benchmark an OpenAI-compatible server (suffixspec serve, or another) through streaming requests "
                        "(default: a model loaded in this process)")
    g.add_argument("--api-key", default=None, metavar="KEY",
                   help="sent as 'Authorization: Bearer KEY' (default: $SUFFIXSPEC_API_KEY, else none)")
    g.add_argument("--endpoint", default="completions", choices=("completions", "chat"),
                   help="/v1/completions with the workload's text as is (default; chat templates already applied) "
                        "or /v1/chat/completions with its turns as messages")
    g.add_argument("--url-modes", default=None, metavar="JSON|@FILE",
                   help="modes as a JSON object: name -> object merged into every request body of that mode "
                        "(its key base_url points the mode at another endpoint); the mode 'plain', else the first, "
                        "is the baseline. Default: suffixspec serve's "
                        '{"plain": {"suffixspec": {"budget": 0}}, "speculative": {"suffixspec": {"budget": BUDGET}}}')
    g.add_argument("--timeout", type=float, default=600.0, metavar="S", help="per-request timeout in seconds (default 600)")
    g = p.add_argument_group("the rollout grid")
    g.add_argument("--grid", action="store_true",
                   help="workloads x concurrency x max-new-tokens (default code_edit,chat,qa x 1,4,16 x 48,128; "
                        "plain and speculative only): one verdict per cell, grid.json, grid_speedup.png")
    g.add_argument("--grid-workloads", default=None, metavar="W1,W2,...", help="the grid's workloads (default code_edit,chat,qa)")
    g.add_argument("--grid-concurrency", default=None, metavar="C1,C2,...", help="the grid's concurrencies (default 1,4,16)")
    g.add_argument("--grid-max-new-tokens", default=None, metavar="N1,N2,...", help="the grid's output limits (default 48,128)")
    g.add_argument("--grid-recycle-both", action="store_true",
                   help="run the speculative arm twice, interleaved with plain: with recycled predictions off (mode "
                        "speculative, the cells' own figures) and on (mode recycle: recycle_* keys, recycling on "
                        "over off per cell, grid_recycle.png); not with --recycle / --no-recycle")
    from .bench_editor import add_arguments

    add_arguments(p)
    p.set_defaults(func=run)


def parse_concurrency(text: str, flag: str = "--concurrency") -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BadInputError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise BadInputError(f"{flag}: expected positive integers, got {text!r}")
    return sorted(set(values))


def settings_from_args(args):
    from ..bench import MODES, BenchSettings

    if args.max_new_tokens <= 0:
        raise BadInputError(f"--max-new-tokens: expected > 0, got {args.max_new_tokens}")
    if args.repeat <= 0:
        raise BadInputError(f"--repeat: expected > 0, got {args.repeat}")
    if args.qps is not None and args.qps <= 0:
        raise BadInputError(f"--qps: expected > 0, got {args.qps}")
    modes = tuple(m for m in MODES if not (m == "prompt_lookup" and (args.no_prompt_lookup or args.grid)))
    if getattr(args, "grid_recycle_both", False):
        if not args.grid:
            raise BadInputError("--grid-recycle-both: applies to --grid")
        if args.recycle is not None:
            raise BadInputError("--grid-recycle-both: runs recycling on and off, not with --recycle / --no-recycle")
        modes += ("recycle",)
    return BenchSettings(concurrency=parse_concurrency(args.concurrency), qps=args.qps,
                         max_new_tokens=args.max_new_tokens, budget=parse_budget(args.budget),
                         temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                         repeat=args.repeat, modes=modes, interleave=not args.sequential)


def grid_from_args(args) -> tuple[list[str], list[int], list[int]]:
    """The grid's (workloads, concurrencies, output limits): `GRID`, or the lists given."""
    from ..bench.grid import GRID

    workloads = list(GRID["workloads"])
    if args.grid_workloads is not None:
        workloads = list(dict.fromkeys(w.strip() for w in args.grid_workloads.split(",") if w.strip()))
        if not workloads:
            raise BadInputError(f"--grid-workloads: expected comma-separated workload names, got {args.grid_workloads!r}")
    concurrency = list(GRID["concurrency"])
    if args.grid_concurrency is not None:
        concurrency = parse_concurrency(args.grid_concurrency, "--grid-concurrency")
    lengths = list(GRID["max_new_tokens"])
    if args.grid_max_new_tokens is not None:
        lengths = parse_concurrency(args.grid_max_new_tokens, "--grid-max-new-tokens")
    return workloads, concurrency, lengths


class LocalTarget:
    """A model loaded in this process: plain and speculative through `SpeculativeGenerator`, and
    transformers' prompt lookup."""

    def __init__(self, args, settings):
        from .bench_editor import engine_options

        filters = parse_filters(args.filter)
        if filters and not args.corpus:
            raise BadInputError("--filter needs at least one --corpus index")
        if getattr(args, "request_filters", False):
            raise BadInputError("--request-filters applies to --url (in process, --corpus sends them)")
        options = engine_options(args)
        check_threads(args.threads)
        cost = cost_options(args)  # a bad --cost-curve is refused before the model loads
        from ..threads import ThreadPlan

        plan = ThreadPlan.start(args.threads)  # before torch is imported (OpenMP reads its settings once)
        from .. import bench
        from ..draft.proposer import Proposer
        from ..engine.costmodel import CostModel
        from ..models import load_model

        self.allocator = bench.keep_freed_memory()  # before the model's memory is allocated
        self.args, self.filters = args, filters
        self.model, self.tokenizer = load_model(args.model)
        print(f"suffixspec bench: {plan.finish().describe()}", file=sys.stderr)
        corpora = open_corpora(args.corpus, self.tokenizer)
        both = "recycle" in settings.modes  # --grid-recycle-both: speculative with recycling off, recycle with it on
        pinned = CostModel.from_relative(cost["cost_curve"]) if "cost_curve" in cost else None

        def backend(recycle: bool):
            return bench.SpeculativeBackend(self.model, self.tokenizer, lambda: Proposer(corpus=corpora or None),
                                            filter=filters or None, recycle=recycle, cost_model=pinned,
                                            learn_cost=cost["learn_cost"], engine_options=options)

        self.spec = backend(False if both else recycle_default(args.recycle))
        self.backends = {"plain": self.spec, "speculative": self.spec}
        if both:
            self.backends["recycle"] = backend(True)
        if "prompt_lookup" in settings.modes:
            self.backends["prompt_lookup"] = bench.PromptLookupBackend(self.model, settings.prompt_lookup_num_tokens)

    def prompts(self, workload):
        """Token prompts (second turns answered by plain greedy decoding, untimed)."""
        from .. import bench

        if self.tokenizer is None and any(r.prompt_ids is None for r in workload.requests):
            raise BadInputError(f"model {self.args.model!r} has no tokenizer.json; text workloads need one")
        prompts = [r.prompt_ids if r.prompt_ids is not None else list(self.tokenizer.encode(r.prompt))
                   for r in workload.requests]
        if any(r.followup is not None for r in workload.requests):
            print(f"suffixspec bench: {workload.name}: answering the first turns (plain greedy, untimed)", file=sys.stderr)
            from ..generate import SpeculativeGenerator

            first_turns = SpeculativeGenerator(self.model, self.tokenizer)  # budget 0 below: plain greedy decoding
            prompts = bench.prepare_followups(workload, prompts, self.tokenizer, lambda ids, n: first_turns.generate(
                [ids], max_new_tokens=n, budget=0).sequences[0])
        return workload, prompts

    def decode(self, out) -> str:
        return self.tokenizer.decode(out) if self.tokenizer is not None else " ".join(map(str, out))

    def describe(self, settings) -> dict:
        from .. import bench

        return {"model": self.args.model or "default (SmolLM2-135M-Instruct, embedded GGUF)",
                "corpora": self.args.corpus, "filter": self.filters,
                "prompt_lookup_num_tokens": settings.prompt_lookup_num_tokens,
                "plain_mode": "SpeculativeGenerator with budget=0 (same runtime, cache and sampler)",
                "cost_curve": self.spec.cost_model.relative() if self.spec.cost_model is not None else None,
                "recycle": "by the cost curve" if self.spec.recycle is None else self.spec.recycle,
                "environment": {**bench.environment(self.model, self.tokenizer), "allocator": self.allocator}}

    def extra_checks(self, prompts, settings) -> dict | None:
        if self.tokenizer is None:
            return None
        return _constraint_check(self.spec, self.model, self.tokenizer, prompts, settings)


class RemoteTarget:
    """An OpenAI-compatible endpoint (`--url`): one `HTTPBackend` per mode."""

    def __init__(self, args, settings):
        from ..bench import remote

        for flag, given in (("--corpus", args.corpus), ("--filter", args.filter), ("--threads", args.threads),
                            ("--cost-curve", args.cost_curve), ("--no-learn-cost", args.no_learn_cost)):
            if given:
                raise BadInputError(f"{flag} applies to a model loaded here, not to --url (the server has its own)")
        if args.timeout <= 0:
            raise BadInputError(f"--timeout: expected > 0, got {args.timeout}")
        self.args, self.remote = args, remote
        self.url = args.url.rstrip("/")
        self.api_key = args.api_key or os.environ.get("SUFFIXSPEC_API_KEY") or None
        self.models = remote.list_models(self.url, self.api_key)
        self.model = args.model or (self.models[0] if self.models else None)
        both = "recycle" in settings.modes  # --grid-recycle-both
        if both and args.url_modes:
            raise BadInputError("--grid-recycle-both: names its own modes, not with --url-modes")
        self.modes = remote.parse_modes(args.url_modes) if args.url_modes else remote.default_modes(
            settings.budget, False if both else args.recycle)
        if both:
            self.modes["recycle"] = {"suffixspec": {"budget": settings.budget, "recycle": True}}
        settings.modes = tuple(self.modes)
        settings.baseline = self.baseline = "plain" if "plain" in self.modes else next(iter(self.modes))
        self.backends = {name: remote.HTTPBackend(self.url, body=body, api_key=self.api_key, model=self.model,
                                                  endpoint=args.endpoint, timeout=args.timeout)
                         for name, body in self.modes.items()}

    def prompts(self, workload):
        """What each request sends (text or token ids, and chat messages); second turns answered
        through the baseline mode (greedy, untimed)."""
        from ..bench import FIRST_TURN_TOKENS, resolve_followups

        if any(r.followup is not None for r in workload.requests):
            print(f"suffixspec bench: {workload.name}: answering the first turns through the endpoint (greedy, untimed)",
                  file=sys.stderr)
            base = self.backends[self.baseline]

            def answer(req) -> str:
                body = {**base.payload({"prompt": req.prompt, "messages": req.messages}),
                        "max_tokens": FIRST_TURN_TOKENS, "temperature": 0.0, "base_url": base.url, **base.body}
                if self.model is not None:
                    body.setdefault("model", self.model)
                return self.remote.complete_text(self.url, body, self.api_key, self.args.timeout)

            workload = resolve_followups(workload, answer)
        return workload, self.remote.request_prompts(workload)

    def decode(self, out) -> str:
        return out if isinstance(out, str) else " ".join(map(str, out))

    def describe(self, settings) -> dict:
        from ..bench import environment

        return {"url": self.url, "endpoint": self.args.endpoint, "model": self.model, "served_models": self.models,
                "mode_bodies": self.modes,
                "token_counts": {name: dict(b.counted_by) for name, b in self.backends.items()},
                "environment": environment()}

    def extra_checks(self, prompts, settings) -> None:
        return None  # a logits processor cannot travel over HTTP


def _bench_one(target, workload, settings) -> dict:
    """Warm-up, timed runs, records and the quality gate of one workload on `target`."""
    from .. import bench

    workload, prompts = target.prompts(workload)
    print(f"suffixspec bench: {workload.name} ({len(prompts)} prompts, max_new_tokens {settings.max_new_tokens}); "
          "warming up", file=sys.stderr)
    t_warm = time.perf_counter()
    bench.warm_up_all(target.backends, prompts, settings)  # with the whole first prompt
    warmup_s = time.perf_counter() - t_warm
    print(f"suffixspec bench: warm-up {warmup_s:.1f} s (one time: kernels, cost curve, first passes; "
          "not in the timings)", file=sys.stderr)
    settings.warmup = False  # done above
    t_bench = time.perf_counter()
    runs = bench.run_benchmark(workload, prompts, target.backends, settings, progress=True)
    records = bench.summarize(runs, settings)
    return {"workload": workload, "prompts": prompts, "runs": runs, "records": records, "warmup_s": warmup_s,
            "bench_s": time.perf_counter() - t_bench, "quality": bench.quality_gate(workload, runs, target.decode)}


def _settings_dict(settings, workload, prompts, backends) -> dict:
    from ..bench import interleaves

    together = interleaves(settings, backends.values())
    return {
        "workload": {"name": workload.name, "source": workload.source, "note": workload.note,
                     "prompts": len(prompts), "request_ids": [r.id for r in workload.requests],
                     "prompt_tokens": [len(p) if isinstance(p, list) else None for p in prompts]},
        "concurrency": settings.concurrency,
        "arrivals": ({"kind": "poisson", "qps": settings.qps, "seed": settings.seed, "max_batch": settings.concurrency}
                     if settings.qps else {"kind": "closed_loop", "clients": settings.concurrency}),
        "batching": "continuous: requests join the running batch between rounds (at most C), finished ones leave",
        "max_new_tokens": settings.max_new_tokens, "budget": settings.budget,
        "sampling": {"do_sample": settings.do_sample, "temperature": settings.temperature, "top_k": settings.top_k,
                     "top_p": settings.top_p, "seed": settings.seed},
        "repeat": settings.repeat, "modes": list(settings.modes), "baseline": settings.baseline,
        "mode_runs": "interleaved" if together else "back_to_back",
    }


def run(args) -> int:
    settings = settings_from_args(args)
    from .. import bench
    from .bench_editor import engine_options

    engine_options(args)  # the prefix cache flags, checked before the model loads

    grid = grid_from_args(args) if args.grid else None
    editor = args.workload == "editor" and not grid
    if editor:
        from .bench_editor import sessions_from_args

        sessions_from_args(args)  # checked before the model loads
    workload = None if grid or editor else bench.load_workload(args.workload, args.num_prompts)
    if grid:
        for name in grid[0]:
            bench.load_workload(name, args.num_prompts)  # every name checked before the model loads
    t_start = time.perf_counter()
    target = RemoteTarget(args, settings) if args.url else LocalTarget(args, settings)
    load_s = time.perf_counter() - t_start
    print(f"suffixspec bench: {'endpoint ' + target.url if args.url else 'model'} ready in {load_s:.1f} s",
          file=sys.stderr)
    if grid:
        return _run_grid(args, settings, target, grid, t_start)
    if editor:
        from .bench_editor import run_editor_bench

        return run_editor_bench(args, settings, target, t_start, load_s)

    one = _bench_one(target, workload, settings)
    workload, prompts, runs, records, quality = one["workload"], one["prompts"], one["runs"], one["records"], one["quality"]
    constraint = target.extra_checks(prompts, settings)
    described = target.describe(settings)
    report = {
        "tool": "suffixspec bench",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": sys.argv,
        "settings": {**_settings_dict(settings, workload, prompts, target.backends),
                     **{k: v for k, v in described.items() if k != "environment"}},
        "environment": described["environment"],
        "timing": {"load_s": load_s, "warmup_s": one["warmup_s"], "bench_s": one["bench_s"],
                   "total_s": time.perf_counter() - t_start},
        "records": records,
        "quality": quality,
        "structured_output": constraint,
        "runs": [_run_dict(r, [target.decode(o) for o in r.outputs] if r.repeat == 0 else None) for r in runs],
    }
    out = Path(args.out)
    bench.write_report(out / "report.json", report)
    plots = bench.write_plots(out, records, f"({workload.name})")

    where = f"endpoint {target.url}, " if args.url else ""
    print(f"workload {workload.name}: {len(prompts)} prompts, {where}max_new_tokens {settings.max_new_tokens}, "
          f"budget {settings.budget}, {'T=' + str(settings.temperature) if settings.do_sample else 'greedy'}, "
          f"{'qps ' + str(settings.qps) if settings.qps else 'closed loop'}, repeat {settings.repeat}")
    print(bench.format_table(records))
    for rec in records:
        if "sampled_identical_to_plain" in rec:
            print(f"sampling, {rec['mode']} c={rec['concurrency']}: outputs identical to {settings.baseline} with the "
                  f"same draws: {rec['sampled_identical_to_plain']}")
        for err in rec["errors"][:3]:
            print(f"  {rec['mode']} c={rec['concurrency']}: {err}")
    if quality:
        parts = [f"{m} {quality[m]['correct']}/{quality[m]['total']} [{quality[m]['ci95'][0]:.2f}, {quality[m]['ci95'][1]:.2f}]"
                 for m in settings.modes if m in quality]
        verdict = "" if "within_noise" not in quality else ("  same within noise" if quality["within_noise"] else "  DIFFERENT")
        print(f"quality ({quality['metric']}): " + "  ".join(parts) + verdict)
    if constraint:
        print(f"structured output ({constraint['constraint']}): {constraint['requests']} speculative outputs, "
              f"{constraint['invalid']} invalid, {constraint['mismatches']} differ from plain")
    print(f"report {out / 'report.json'}  plots {', '.join(Path(p).name for p in plots)}  "
          f"({report['timing']['total_s']:.0f} s)")
    slim = [{**{k: rec.get(k) for k in ("mode", "concurrency", "ttft_ms", "tpot_ms", "e2e_ms_p50", "throughput_tok_s",
                                         "mean_accepted_tokens", "acceptance_rate", "mismatches", "speedup")},
             "time_split": rec["time_split"]["share"] if rec.get("time_split") else None} for rec in records]
    from ..bench.record import emit

    emit({"report": str(out / "report.json"), "records": slim}, args, "suffixspec_bench")
    failed = any(rec["failures"] for rec in records) or (constraint and (constraint["invalid"] or constraint["mismatches"]))
    return 1 if failed else 0


def _run_dict(run, outputs=None) -> dict:
    """One run as a report keeps it: its per-request figures (so modes pair request by request),
    plus its decoded outputs where given."""
    return {"mode": run.mode, "concurrency": run.concurrency, "repeat": run.repeat, "makespan_s": run.makespan_s,
            "requests": run.requests, "errors": run.errors, **({"outputs": outputs} if outputs is not None else {})}


def _run_grid(args, settings, target, grid, t_start) -> int:
    """Every (workload, max_new_tokens) of the grid at every concurrency; cells, grid.json, heat map."""
    from .. import bench
    from ..bench.grid import (
        format_grid,
        format_recycle,
        grid_cells,
        paired_ratios,
        recycle_arm,
        recycle_heatmap_cells,
        write_heatmap,
    )

    workloads, concurrency, lengths = grid
    spec_mode = next((m for m in settings.modes if m != settings.baseline and m != "prompt_lookup"), None)
    if spec_mode is None:
        raise BadInputError(f"--grid: expected a mode besides the baseline {settings.baseline!r}, got {list(settings.modes)}")
    results, parts = [], []
    for name in workloads:
        for max_new in lengths:
            cell_settings = bench.BenchSettings(**{**vars(settings), "concurrency": concurrency, "max_new_tokens": max_new,
                                                   "warmup": True})
            one = _bench_one(target, bench.load_workload(name, args.num_prompts), cell_settings)
            results.append((name, max_new, one["records"]))
            parts.append({"workload": name, "max_new_tokens": max_new, "warmup_s": one["warmup_s"], "bench_s": one["bench_s"],
                          "settings": _settings_dict(cell_settings, one["workload"], one["prompts"], target.backends),
                          "records": one["records"], "quality": one["quality"],
                          # per request, so that a cell's two modes can be paired request by request
                          "runs": [_run_dict(r) for r in one["runs"]]})
    cells = grid_cells(results, mode=spec_mode, baseline=settings.baseline)
    for field, key in (("ttft_s", "ttft_ratio_paired"), ("e2e_s", "e2e_ratio_paired")):
        paired = {(part["workload"], part["max_new_tokens"]): paired_ratios(part["runs"], field, spec_mode,
                                                                            settings.baseline)
                  for part in parts}
        for cell in cells:
            cell[key] = paired[cell["workload"], cell["max_new_tokens"]].get(cell["concurrency"])
    both = "recycle" in settings.modes  # --grid-recycle-both: the arm with recycling on beside the cells
    if both:
        recycle_arm(cells, results, {(part["workload"], part["max_new_tokens"]): part["runs"] for part in parts},
                    off=spec_mode)
    described = target.describe(settings)
    out = Path(args.out)
    report = {"tool": "suffixspec bench --grid", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": sys.argv,
              "grid": {"workloads": workloads, "concurrency": concurrency, "max_new_tokens": lengths,
                       "mode": spec_mode, "baseline": settings.baseline, "repeat": settings.repeat,
                       "rule": "loses: median < 0.97x or worst repeat < 0.93x; speculate: median >= 1.03x; off: "
                               "within, drafting < 0.5 tokens per request-round; neutral: within, still drafting",
                       **({"recycle_arm": "recycle", "recycle_rule": "recycle_vs_off: the median over repeats of "
                           "recycle's throughput over speculative's in the same repeat; loses: < 0.97x or a repeat "
                           "< 0.93x; pays: >= 1.03x; neutral: between"} if both else {})},
              "settings": {k: v for k, v in described.items() if k != "environment"},
              "environment": described["environment"], "cells": cells, "benchmarks": parts,
              "timing": {"total_s": time.perf_counter() - t_start}}
    bench.write_report(out / "grid.json", report)
    maps = [write_heatmap(out / "grid_speedup.png", cells, f"{spec_mode} / {settings.baseline}")]
    print(f"grid: {', '.join(workloads)} x concurrency {','.join(map(str, concurrency))} x max_new_tokens "
          f"{','.join(map(str, lengths))}, {args.num_prompts} prompts, repeat {settings.repeat}, "
          f"{spec_mode} vs {settings.baseline}")
    print(format_grid(cells))
    counts = {v: sum(c["verdict"] == v for c in cells) for v in ("speculate", "off", "neutral", "loses")}
    print("verdicts: " + ", ".join(f"{v} {n}" for v, n in counts.items()))
    if both:
        maps.append(write_heatmap(out / "grid_recycle.png", recycle_heatmap_cells(cells),
                                  f"recycle on / off ({spec_mode})"))
        print(f"recycled predictions on (mode recycle) against off ({spec_mode}), paired repeat by repeat")
        print(format_recycle(cells))
        counts = {v: sum(c.get("recycle_verdict") == v for c in cells) for v in ("pays", "neutral", "loses")}
        print("recycling: " + ", ".join(f"{v} {n}" for v, n in counts.items()))
    print(f"report {out / 'grid.json'}  heat map {'  '.join(Path(m).name for m in maps)}  ({report['timing']['total_s']:.0f} s)")
    from ..bench.record import emit

    emit({"report": str(out / "grid.json"), "cells": [
        {k: c[k] for k in ("workload", "max_new_tokens", "concurrency", "speedup", "speedup_min", "verdict",
                           *RECORDED_EXTRA) if k in c}
        for c in cells]}, args, "suffixspec_bench_grid")
    failed = any(c["failures"] or c.get("recycle_failures") for c in cells) or \
        len(cells) < len(workloads) * len(lengths) * len(concurrency) or \
        (both and any("recycle_vs_off" not in c for c in cells))
    return 1 if failed else 0


# what the recorded line keeps of a cell beyond its verdict: drafting, and the recycling arm (--grid-recycle-both)
RECORDED_EXTRA = ("recycle_vs_off", "recycle_vs_off_min", "recycle_vs_off_max", "recycle_speedup", "recycle_verdict",
                "drafted_per_round", "recycle_drafted_per_round")


def _constraint_check(spec, model, tokenizer, prompts, settings) -> dict:
    """Speculative decoding under a structured-output constraint (a LogitsProcessor): every output must
    stay inside the grammar; greedy outputs must also equal plain decoding under the same constraint."""
    from ..bench import CharsetConstraint

    vocab = int(model.get_input_embeddings().weight.shape[0])
    eos = getattr(model.generation_config, "eos_token_id", None)
    eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    constraint = CharsetConstraint(tokenizer, vocab, eos_token_id=eos)
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
