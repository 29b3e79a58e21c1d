"""The automatic budget in closed loop: auto against every fixed budget on simulated cost curves.

    python bench/bench_closedloop.py --record            # every curve and workload, 1 and 4 requests, seeds 0-4
    python bench/bench_closedloop.py --curves flat --rows 4 --seeds 0,1
    python bench/bench_closedloop.py --curves noisy --recycle on,off   # recycled predictions both ways

`suffixspec.engine.closedloop`: the real engine and proposer, a scripted tiny model (its logits a
rule, so the output is known and identical at every budget) and a simulated clock that each forward
pass advances by the curve's cost (flat: a 64-token pass about 1.1x a one-token step; proportional;
steep; concave; flat with noise; concave with slow periods at seeded simulated times). One seed's
run is a few requests, so each cell runs at every seed of `--seeds`, every budget on the same law,
prompts, noise and spikes (paired). Reported per cell: the throughput (committed tokens over
simulated seconds, pooled over the seeds) of the automatic budget and of each fixed budget, the best
fixed budget so pooled, auto's ratio to it, auto's ratio to that budget seed by seed (mean and
worst), and the mean draft nodes per round. `--recycle`: the recycling settings each cell runs
under, every budget of a run under the same one (`off`, `on`, `product`: the product's rule on the
curve, on where it is flat; by default `off,product`, so a cell runs twice where the product
recycles). Simulated time, not wall time: the figures do not depend on this machine's load (no lock
needed).
"""

from __future__ import annotations

import argparse
import sys

import common


def main(argv=None) -> int:
    from suffixspec.engine import closedloop as cl

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--curves", default=",".join(cl.CURVES), help="comma list of " + ", ".join(cl.CURVES))
    p.add_argument("--workloads", default=",".join(cl.WORKLOADS), help="comma list of " + ", ".join(cl.WORKLOADS))
    p.add_argument("--rows", default="1,4", help="requests decoded together (comma list)")
    p.add_argument("--budgets", default=",".join(map(str, cl.FIXED_BUDGETS)), help="the fixed budgets compared")
    p.add_argument("--seeds", default="0-4", help="seeds, each cell run at every one and paired: a list (0,3,7) "
                   "or a range (0-4)")
    p.add_argument("--recycle", default="off,product", help="recycled predictions: a comma list of off, on and "
                   "product (the product's rule on each curve: on where it is flat); a cell runs once per distinct "
                   "setting, every budget alike (default: off,product)")
    common.add_record_flag(p)
    args = p.parse_args(argv)
    seeds = _seeds(p, args.seeds)
    settings = [x.strip() for x in args.recycle.split(",")]
    if not settings or any(x not in ("off", "on", "product") for x in settings):
        p.error(f"--recycle: expected a comma list of off, on and product, got {args.recycle!r}")

    import torch

    torch.set_num_threads(1)  # a tiny model: one thread is the fastest
    budgets = tuple(int(b) for b in args.budgets.split(","))
    cells = []
    print(f"seeds {args.seeds}; ratio: pooled over seeds against the best fixed budget (pooled), "
          "mean and worst: paired per seed against that budget")
    print(f"{'workload':<8} {'curve':<12} {'rows':>4} {'recycle':>7} {'auto':>8} {'best':>5} {'ratio':>6} {'mean':>6} "
          f"{'worst':>6} {'nodes':>6}")
    for rows, wl, curve, recycle in _cells(cl, args, settings):
        got = cl.compare_seeds(wl, curve, budgets=budgets, rows=rows, seeds=seeds, recycle=recycle)
        cell = {"workload": wl, "curve": curve, "rows": rows, "recycle": recycle,
                "product_recycles": cl.recycles(curve), "seeds": list(seeds),
                "auto_tok_per_s": round(got.pooled["auto"], 3), "best_fixed": got.best,
                "best_tok_per_s": round(got.pooled[got.best], 3), "ratio": round(got.ratio, 4),
                "mean": round(got.mean, 4), "worst": round(got.worst, 4),
                "paired": [round(r, 4) for r in got.paired],
                "per_seed_best": [round(r, 4) for r in got.per_seed_best],
                "auto_nodes_per_round": round(got.auto_nodes_per_round, 2),
                "fixed": {str(b): round(got.pooled[b], 3) for b in budgets}}
        cells.append(cell)
        print(f"{wl:<8} {curve:<12} {rows:>4} {'on' if recycle else 'off':>7} {cell['auto_tok_per_s']:>8.1f} "
              f"{got.best:>5} {got.ratio:>6.3f} {got.mean:>6.3f} {got.worst:>6.3f} "
              f"{got.auto_nodes_per_round:>6.1f}", flush=True)
    result = {"benchmark": "closedloop", "seeds": list(seeds), "budgets": list(budgets), "recycle": settings,
              "min_ratio": min(c["ratio"] for c in cells), "min_mean": min(c["mean"] for c in cells),
              "min_worst": min(c["worst"] for c in cells), "cells": cells}
    common.emit(result, args, "closedloop")
    return 0


def _cells(cl, args, settings):
    """(rows, workload, curve, recycle) per cell and distinct recycling setting, in table order."""
    for rows in (int(r) for r in args.rows.split(",")):
        for wl in args.workloads.split(","):
            for curve in args.curves.split(","):
                rule = cl.recycles(curve)
                for recycle in dict.fromkeys(rule if x == "product" else x == "on" for x in settings):
                    yield rows, wl, curve, recycle


def _seeds(parser, text: str) -> tuple[int, ...]:
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-"))
            seeds = tuple(range(lo, hi + 1))
        else:
            seeds = tuple(int(x) for x in text.split(","))
    except ValueError:
        seeds = ()
    if not seeds or min(seeds) < 0:
        parser.error(f"--seeds: expected a comma list of seeds or a range such as 0-4, got {text!r}")
    return seeds


if __name__ == "__main__":
    sys.exit(main())
