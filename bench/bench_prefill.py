"""Long prompts beside running requests: chunked prefill, and prefill against the model's own forward.

    python bench/bench_prefill.py [--long 8000] [--lengths 1000,4000,8000] [--max-step-tokens N] [--threads 1] [--record [PATH]]
    PYTHONPATH=OTHER_CHECKOUT python bench/bench_prefill.py        # the suffixspec of another revision

Two measurements on the default model, in one process:

1. Admission: four code-edit requests (128 new tokens, automatic budget) run; once each has 16
   tokens, a prompt of `--long` tokens (Python source of the standard library; one new token)
   arrives. The same runners are run again without the newcomer. For each runner, the tokens it
   committed while the newcomer was being admitted (arrival to its first token) are timed in both
   runs (outputs are greedy, so the same token positions): their ratio is the slowdown the
   newcomer caused (median over runners). The newcomer's time to first token is set against the
   model's forward over its prompt (transformers, on the same model object).
2. Prefill: one request of each length with nobody else (time to first token, its own engine)
   against the model's forward over the same tokens; medians of `--repeats`.

An older checkout without `max_step_tokens` reads every prompt whole. Prints a table, then one JSON
line last (`--record`: also appended to bench/results/prefill.jsonl). Run timed benchmarks one at a
time (`flock LOCKFILE python ...`).
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import common


def long_prompt(tokenizer, n: int) -> list[int]:
    """`n` tokens of the standard library's Python source (every machine has it)."""
    ids: list[int] = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        ids += tokenizer.encode(path.read_text(encoding="utf-8", errors="replace"))
        if len(ids) >= n:
            return ids[:n]
    raise SystemExit(f"the standard library holds fewer than {n} tokens")


def forward_s(model, ids) -> float:
    import torch

    with torch.inference_mode():
        t = time.perf_counter()
        model(input_ids=torch.tensor([ids]), logits_to_keep=1)
        return time.perf_counter() - t


def serve(gen, step_tokens):
    from suffixspec.engine.engine import Engine

    kwargs = dict(max_new_tokens=128, max_batch=8)
    if step_tokens and "max_step_tokens" in inspect.signature(Engine.__init__).parameters:
        kwargs["max_step_tokens"] = step_tokens
    return gen.serve(**kwargs)


def admission(gen, runners, newcomer, step_tokens):
    """Token times of each runner ({index: [(position, time)]}) and the newcomer's arrival and first
    token (None without one)."""
    server = serve(gen, step_tokens)
    idx = [server.add(p) for p in runners]
    times = {q: [] for q in idx}
    arrival = first = None
    late = None
    while not server.idle:
        if late is None and newcomer is not None and all(len(server.output(q)) >= 16 for q in idx):
            late = server.add(newcomer, max_new_tokens=1)
            arrival = server.now()
        step = server.step()
        for e in step.events:
            if e.index in times:
                done = len(server.output(e.index))
                times[e.index] += [(done - len(e.tokens) + k, e.time_s) for k in range(len(e.tokens))]
            elif e.index == late and e.tokens and first is None:
                first = e.time_s
    server.close()
    return times, (arrival, first)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--long", type=int, default=8000, help="the newcomer's prompt tokens")
    p.add_argument("--lengths", default="1000,4000,8000", help="prefill lengths against the model's forward")
    p.add_argument("--max-step-tokens", type=int, default=None, help="the server's step budget (default: its own)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    common.add_record_flag(p)
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from suffixspec.bench.workloads import load_workload
    from suffixspec.generate import SpeculativeGenerator
    from suffixspec.models import load_model

    model, tokenizer = load_model()[:2]
    gen = SpeculativeGenerator(model, tokenizer, prefix_cache_bytes=0)
    runners = [tokenizer.encode(r.prompt) for r in load_workload("code_edit", 4).requests]
    newcomer = long_prompt(tokenizer, args.long)
    admission(gen, runners[:1], runners[0][:64], args.max_step_tokens)  # warm-up: kernels, cost model

    base, _ = admission(gen, runners, None, args.max_step_tokens)
    times, (arrival, first) = admission(gen, runners, newcomer, args.max_step_tokens)
    plain_s = statistics.median(forward_s(model, newcomer) for _ in range(args.repeats))
    slow = []
    for q, seen in times.items():
        during = [pos for pos, t in seen if arrival <= t <= first]
        if not during:
            continue
        # from the runner's last token before the arrival to its last one in the window, against the
        # same positions without the newcomer (greedy: the same tokens)
        lo, hi = min(during) - 1, max(during)
        with_, without = dict(seen), dict(base[q])
        slow.append((with_[hi] - with_[lo]) / (without[hi] - without[lo]))
    tpot_ratio = statistics.median(slow) if slow else float("nan")
    ttft = first - arrival

    rows = []
    for n in [int(x) for x in args.lengths.split(",") if x]:
        ids = long_prompt(tokenizer, n)
        ours, theirs = [], []
        for _ in range(args.repeats):
            server = serve(gen, args.max_step_tokens)
            server.add(ids, max_new_tokens=1)
            t = time.perf_counter()
            server.run()
            ours.append(time.perf_counter() - t)
            theirs.append(forward_s(model, ids))
        rows.append({"tokens": n, "prefill_s": statistics.median(ours), "forward_s": statistics.median(theirs),
                     "ratio": statistics.median(ours) / statistics.median(theirs)})

    print(f"admission of a {len(newcomer)}-token prompt beside 4 code-edit streams"
          f" (max_step_tokens {args.max_step_tokens or 'default'}):")
    print(f"  runners' time per token during it / without it: {tpot_ratio:.2f}x (per runner: "
          + ", ".join(f"{x:.2f}" for x in slow) + ")")
    print(f"  newcomer's TTFT {ttft:.2f} s; the model's forward over its prompt {plain_s:.2f} s: {ttft / plain_s:.2f}x")
    print(f"{'tokens':>7} {'prefill s':>10} {'forward s':>10} {'ratio':>7}")
    for r in rows:
        print(f"{r['tokens']:>7} {r['prefill_s']:>10.2f} {r['forward_s']:>10.2f} {r['ratio']:>6.2f}x")
    result = {"long": len(newcomer), "max_step_tokens": args.max_step_tokens, "threads": args.threads,
              "runner_tpot_ratio": tpot_ratio, "runner_tpot_ratios": slow, "newcomer_ttft_s": ttft,
              "newcomer_forward_s": plain_s, "newcomer_ttft_ratio": ttft / plain_s, "prefill": rows}
    common.emit(result, args, "prefill")
    return 0


if __name__ == "__main__":
    sys.exit(main())
