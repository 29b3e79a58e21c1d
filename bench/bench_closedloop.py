"""The automatic budget in closed loop: auto against every fixed budget on simulated cost curves.

    python bench/bench_closedloop.py --record            # every curve and workload, 1 and 4 requests
    python bench/bench_closedloop.py --curves flat --rows 4

`suffixspec.engine.closedloop`: the real engine and proposer, a scripted tiny model (its logits a
rule, so the output is known and identical at every budget) and a simulated clock that each forward
pass advances by the curve's cost (flat: a 64-token pass about 1.1x a one-token step; proportional;
steep; concave; flat with noise; concave with noise and spikes). Reported per cell: the throughput
(committed tokens over simulated seconds) of the automatic budget and of each fixed budget, the best
fixed budget, auto's ratio to it, and the mean draft nodes per round. Simulated time, not wall time:
the figures do not depend on this machine's load (no lock needed).
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
    p.add_argument("--seed", type=int, default=0)
    common.add_record_flag(p)
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(1)  # a tiny model: one thread is the fastest
    budgets = tuple(int(b) for b in args.budgets.split(","))
    cells = []
    print(f"{'workload':<8} {'curve':<12} {'rows':>4} {'auto':>8} {'best fixed':>10} {'ratio':>6} {'nodes':>6}")
    for rows in (int(r) for r in args.rows.split(",")):
        for wl in args.workloads.split(","):
            for curve in args.curves.split(","):
                got = cl.compare(wl, curve, budgets=budgets, rows=rows, seed=args.seed)
                best = max(budgets, key=lambda b: got[b].throughput)
                cell = {"workload": wl, "curve": curve, "rows": rows, "tokens": got["auto"].tokens,
                        "auto_tok_per_s": round(got["auto"].throughput, 3), "best_fixed": best,
                        "best_tok_per_s": round(got[best].throughput, 3), "ratio": round(got["ratio"], 4),
                        "auto_nodes_per_round": round(got["auto"].drafted_per_round, 2),
                        "fixed": {str(b): round(got[b].throughput, 3) for b in budgets}}
                cells.append(cell)
                print(f"{wl:<8} {curve:<12} {rows:>4} {cell['auto_tok_per_s']:>8.1f} {best:>10} {cell['ratio']:>6.3f} "
                      f"{cell['auto_nodes_per_round']:>6.1f}", flush=True)
    result = {"benchmark": "closedloop", "seed": args.seed, "budgets": list(budgets),
              "min_ratio": min(c["ratio"] for c in cells), "cells": cells}
    common.emit(result, args, "closedloop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
