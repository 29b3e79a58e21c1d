"""Through HTTP against in-process, interleaved: the same workload served by `suffixspec serve` (driven
by `suffixspec bench --url`'s client, `suffixspec.bench.remote`) and by the in-process `Engine`
(`suffixspec bench`'s own backend), repeat by repeat in alternating order, so that the slow drifts
of a shared machine fall on both sides alike instead of on whichever ran second.

    python bench/bench_http_parity.py                       # code edits, 8 prompts, 64 tokens, c=1,4, repeat 4
    python bench/bench_http_parity.py --num-prompts 12 --repeat 5 --concurrency 1,4

Both sides run plain decoding (budget 0) and speculation (budget auto) in each repeat, one torch
thread each (`--threads`). The server runs `--no-response-cache` and keeps one generator for its
life, so what its budget policy and proposer learn (calibration, cost curve, source weighting)
carries from run to run; the in-process side does the same by default (`--in-process kept`: one
generator over a proposer without a response cache, for every run, warm-up included).
`--in-process fresh` gives it a new generator and proposer per run instead, as `suffixspec bench` does. Per side and concurrency: TPOT
(median over requests and repeats) and the speed-up (throughput ratio to plain of the same side and
repeat: median [min-max] over repeats); then how far HTTP is from in-process: the ratio of the
medians, and the median [min-max] of the per-repeat ratios. Greedy texts are compared across sides
and modes (they must all be equal). Prints a table, then one JSON line (`--record [PATH]`: also
appended to bench/results/http_parity.jsonl with the date, host and git revision). The server's log
goes to `--server-log PATH`, default a new file in the system's temporary folder (its path printed).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import common


class KeptBackend:
    """One generator for every run (no `fresh()`), as a long-lived server keeps one."""

    def __init__(self, backend):
        self.backend = backend

    def serve(self, **kw):
        return self.backend.serve(**kw)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="code_edit")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default=None)
    ap.add_argument("--in-process", choices=("kept", "fresh"), default="kept",
                    help="kept: one generator for every run, as the server keeps (default); fresh: a new one per run")
    ap.add_argument("--server-log", default=None, metavar="PATH",
                    help="the server's stderr (default: a new file in the temporary folder)")
    common.add_record_flag(ap)
    args = ap.parse_args()
    if args.server_log is None:
        with tempfile.NamedTemporaryFile(prefix="suffixspec-parity-server-", suffix=".log", delete=False) as f:
            args.server_log = f.name
    print(f"server log: {args.server_log}", file=sys.stderr)
    concurrency = [int(c) for c in args.concurrency.split(",")]

    import torch

    from suffixspec import bench
    from suffixspec.bench import remote
    from suffixspec.draft.proposer import Proposer
    from suffixspec.models import load_model

    torch.set_num_threads(args.threads)
    workload = bench.load_workload(args.workload, args.num_prompts)
    if any(r.followup is not None for r in workload.requests):
        raise SystemExit(f"{args.workload}: second-turn workloads are not supported here")
    model, tokenizer = load_model(args.model)
    if args.in_process == "kept":
        local = KeptBackend(bench.SpeculativeBackend(model, tokenizer, lambda: Proposer(global_cache=False)).fresh())
    else:
        local = bench.SpeculativeBackend(model, tokenizer, lambda: Proposer())
    proc, url = common.spawn_server(args.model, max(concurrency), args.server_log,
                             ["--threads", str(args.threads), "--no-response-cache"])
    try:
        served = remote.list_models(url)
        http = {name: remote.HTTPBackend(url, body=body, model=served[0]) for name, body in
                remote.default_modes("auto").items()}
        sides = {"in-process": ({"plain": local, "speculative": local},
                                [r.prompt_ids if r.prompt_ids is not None else list(tokenizer.encode(r.prompt))
                                 for r in workload.requests]),
                 "http": (http, remote.request_prompts(workload))}
        settings = bench.BenchSettings(concurrency=concurrency, max_new_tokens=args.max_new_tokens, repeat=1,
                                       modes=("plain", "speculative"), warmup=False)
        for backends, prompts in sides.values():
            bench.warm_up_all(backends, prompts, settings)
        runs: dict[str, list] = {name: [] for name in sides}
        t0 = time.perf_counter()
        for r in range(args.repeat):
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            for name in order:
                backends, prompts = sides[name]
                for run in bench.run_benchmark(workload, prompts, backends, settings, progress=False):
                    run.repeat = r
                    runs[name].append(run)
                print(f"repeat {r + 1}/{args.repeat} {name} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()

    full = bench.BenchSettings(concurrency=concurrency, max_new_tokens=args.max_new_tokens, repeat=args.repeat,
                               modes=("plain", "speculative"))
    records = {name: {(rec["mode"], rec["concurrency"]): rec for rec in bench.summarize(rs, full)}
               for name, rs in runs.items()}
    # greedy: every side's and mode's text equals in-process plain decoding's
    texts = {}
    for name, rs in runs.items():
        for run in rs:
            for q, out in enumerate(run.outputs):
                texts.setdefault(q, set()).add(out if isinstance(out, str) else tokenizer.decode(out))
    mismatched = sum(len(t) > 1 for t in texts.values())

    summary = []
    print(f"{args.workload}, {args.num_prompts} prompts, {args.max_new_tokens} tokens, repeat {args.repeat} "
          f"(interleaved), {args.threads} thread(s), in-process generator {args.in_process}")
    print(f"{'c':>3} {'side':<11} {'TPOT plain':>10} {'TPOT spec':>10} {'tok/round':>9} {'speed-up':>22}")
    for c in concurrency:
        sp = {}
        for name in sides:
            plain, spec = records[name][("plain", c)], records[name][("speculative", c)]
            sp[name] = spec["speedup_runs"]
            tpr = spec["mean_accepted_tokens"]
            print(f"{c:>3} {name:<11} {plain['tpot_ms']:>8.1f}ms {spec['tpot_ms']:>8.1f}ms "
                  f"{tpr if tpr is not None else float('nan'):>9.2f} {spread(spec['speedup_runs']):>22}")
        paired = [h / i for h, i in zip(sp["http"], sp["in-process"])]
        med = {name: statistics.median(v) for name, v in sp.items()}
        tpot = {mode: records["http"][(mode, c)]["tpot_ms"] / records["in-process"][(mode, c)]["tpot_ms"]
                for mode in ("plain", "speculative")}
        print(f"{c:>3} {'http/in':<11} {tpot['plain']:>9.3f}x {tpot['speculative']:>9.3f}x {'':>9} "
              f"medians {med['http'] / med['in-process']:.3f}x, per repeat {spread(paired)}")
        summary.append({"concurrency": c, "speedup_http": med["http"], "speedup_in_process": med["in-process"],
                        "speedup_http_runs": sp["http"], "speedup_in_process_runs": sp["in-process"],
                        "speedup_ratio_of_medians": med["http"] / med["in-process"],
                        "speedup_ratio_paired_median": statistics.median(paired),
                        "tpot_ratio_plain": tpot["plain"], "tpot_ratio_speculative": tpot["speculative"],
                        "tpot_ms": {name: {mode: records[name][(mode, c)]["tpot_ms"] for mode in ("plain", "speculative")}
                                    for name in sides}})
    print(f"greedy texts differing across sides and modes: {mismatched} of {len(texts)} prompts")
    common.emit({"bench": "http_parity", "workload": args.workload, "prompts": args.num_prompts,
                 "in_process": args.in_process, "max_new_tokens": args.max_new_tokens, "repeat": args.repeat,
                 "threads": args.threads, "mismatched_prompts": mismatched, "cells": summary}, args, "http_parity")
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
