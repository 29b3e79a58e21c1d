"""The vLLM adapter's draft sizing in closed loop: its own lengths against every fixed cap on simulated
step-cost curves, without vLLM.

    python bench/bench_vllm_closedloop.py --record          # every curve and workload, 8 and 1 rows, seeds 0-2
    python bench/bench_vllm_closedloop.py --curves flat --rows 8 --seeds 0

`suffixspec.integrations.vllm_closedloop`: the adapter's `DraftCore` (proposer trees, path values,
lengths planned against its measured step cost) drafting for a scripted target (a rule: outputs known
and identical at every cap) whose steps advance a simulated clock by the curve's cost of the tokens
they feed. Reported per cell: committed tokens per simulated second of the adapter ("auto") and of
each fixed cap (every row drafting its best path up to the cap), pooled over the seeds, the best cap,
auto's ratio to it (pooled, and per seed the worst), and drafted / accepted tokens. Simulated time,
not wall time: no lock needed.
"""

from __future__ import annotations

import argparse
import sys

import common


def main(argv=None) -> int:
    from suffixspec.integrations import vllm_closedloop as vc

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--curves", default=",".join(vc.CURVES), help="comma list of " + ", ".join(vc.CURVES))
    p.add_argument("--workloads", default=",".join(vc.WORKLOADS), help="comma list of " + ", ".join(vc.WORKLOADS))
    p.add_argument("--rows", default="8,1", help="requests run together (comma list)")
    p.add_argument("--caps", default=",".join(map(str, vc.FIXED_CAPS)), help="the fixed caps compared")
    p.add_argument("--seeds", default="0,1,2", help="comma list of seeds (each cell runs at every one, paired)")
    common.add_record_flag(p)
    args = p.parse_args(argv)
    try:
        seeds = tuple(int(s) for s in args.seeds.split(","))
        caps = tuple(int(c) for c in args.caps.split(","))
    except ValueError:
        p.error(f"--seeds / --caps: expected comma lists of integers, got {args.seeds!r} / {args.caps!r}")
    cells = []
    print(f"{'workload':<8} {'curve':<12} {'rows':>4} {'auto':>8} {'best':>5} {'ratio':>6} {'worst':>6} "
          f"{'drafted':>8} {'accepted':>8}")
    for rows in (int(r) for r in args.rows.split(",")):
        for wl in args.workloads.split(","):
            for curve in args.curves.split(","):
                runs = [vc.compare(wl, curve, caps=caps, rows=rows, seed=s) for s in seeds]
                arms = ["auto", *caps]
                pooled = {a: sum(r[a].tokens for r in runs) / sum(r[a].seconds for r in runs) for a in arms}
                best = max(caps, key=lambda c: pooled[c])
                worst = min(r["auto"].throughput / max(r[c].throughput for c in caps) for r in runs)
                cell = {"workload": wl, "curve": curve, "rows": rows, "seeds": list(seeds),
                        "auto_tok_per_s": round(pooled["auto"], 3), "best_cap": best,
                        "ratio": round(pooled["auto"] / pooled[best], 4), "worst": round(worst, 4),
                        "drafted": {str(a): sum(r[a].drafted for r in runs) for a in arms},
                        "accepted": {str(a): sum(r[a].accepted for r in runs) for a in arms},
                        "fixed": {str(c): round(pooled[c], 3) for c in caps}}
                cells.append(cell)
                print(f"{wl:<8} {curve:<12} {rows:>4} {pooled['auto']:>8.1f} {best:>5} {cell['ratio']:>6.3f} "
                      f"{worst:>6.3f} {cell['drafted']['auto']:>8} {cell['accepted']['auto']:>8}", flush=True)
    result = {"benchmark": "vllm_closedloop", "seeds": list(seeds), "caps": list(caps),
              "min_ratio": min(c["ratio"] for c in cells), "min_worst": min(c["worst"] for c in cells), "cells": cells}
    common.emit(result, args, "vllm_closedloop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
