"""The rollout grid: workloads x concurrency x output length, one verdict per cell, and a heat map.

Contract: `GRID` names the default grid ({code_edit, chat, qa} x concurrency {1, 4, 16} x
max_new_tokens {48, 128}); `grid_cells(records_by_length)` turns the `summarize` records of each
(workload, max_new_tokens) benchmark into one cell per concurrency (speculative against plain: the
median speed-up over repeats, the worst repeat, TTFT ratio, drafted tokens per request-round), each
with a `verdict(...)`:

- "loses": the median speed-up < 0.97, or the worst repeat < 0.93 (whatever the median);
- "off": otherwise, when speculation drafted little (fewer than `OFF_DRAFTED_PER_ROUND` draft tokens
  verified per request-round: the automatic budget switched itself off), whatever the median: a
  cell that verified next to no drafts owes its speed-up, either way, to the noise of the machine;
- "speculate": otherwise, the median >= 1.03;
- "neutral": the median within [0.97, 1.03) while still drafting (or with no draft counts, from an
  endpoint that does not report them): drafting costs what it pays back.

The TTFT ratio (speculative / plain, medians) is reported beside the verdict, not part of it, and so
is `paired_ratios(runs, field)`: per concurrency, the median over requests of each request's
speculative TTFT ("ttft_s") or end-to-end latency ("e2e_s") over its own plain one in the same repeat
(`paired_ttft_ratios`; the grid's `ttft_ratio_paired`, `e2e_ratio_paired`), steadier than medians
of a few closed-loop waves. Throughput is the makespan's, which the client with the slowest chain of
requests sets, so a cell whose median request finishes sooner can still show a speed-up below 1.
`format_grid(cells)` is a text table, `write_heatmap(path, cells)` a PNG: one row per (workload,
max_new_tokens), one column per concurrency, each cell coloured by its median speed-up on a scale
centred on 1.0 (red at 0.9x or the worst cell, green at 1.5x or the best) and labelled.
`recycle_arm(cells, results, runs_by_part)` adds the same speculative arm with recycled predictions
on (mode "recycle", `--grid-recycle-both`; the cells' own keys stay the arm with them off):
`recycle_vs_off`, the median over repeats of its throughput over the off arm's in the same repeat
(`_min`, `_max`, `_runs`), and `recycle_verdict` ("loses" < 0.97x or a repeat < 0.93x, "pays" >= 1.03x).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

__all__ = ["GRID", "SPECULATE_AT", "LOSES_BELOW", "WORST_BELOW", "OFF_DRAFTED_PER_ROUND", "verdict", "grid_cells",
           "paired_ratios", "paired_ttft_ratios", "format_grid", "write_heatmap", "recycle_verdict",
           "paired_throughput_ratios", "recycle_arm", "format_recycle", "recycle_heatmap_cells"]

GRID = {"workloads": ("code_edit", "chat", "qa"), "concurrency": (1, 4, 16), "max_new_tokens": (48, 128)}
SPECULATE_AT = 1.03  # median speed-up at or above which speculation pays
LOSES_BELOW = 0.97  # median speed-up below which it loses
WORST_BELOW = 0.93  # a repeat below this loses the cell whatever the median
OFF_DRAFTED_PER_ROUND = 0.5  # fewer draft tokens verified per request-round than this: speculation was off


def verdict(median: float, worst: float, drafted_per_round: float | None) -> str:
    """The cell's verdict from its median speed-up, worst repeat and drafting (module docstring)."""
    if median < LOSES_BELOW or worst < WORST_BELOW:
        return "loses"
    if drafted_per_round is not None and drafted_per_round < OFF_DRAFTED_PER_ROUND:
        return "off"
    if median >= SPECULATE_AT:
        return "speculate"
    return "neutral"


def grid_cells(results: list[tuple[str, int, list[dict[str, Any]]]], mode: str = "speculative",
               baseline: str = "plain") -> list[dict[str, Any]]:
    """Cells from `(workload, max_new_tokens, records)` triples: one per concurrency at which both
    `mode` and `baseline` ran and a speed-up was measured, in the order given, then by concurrency."""
    cells = []
    for workload, max_new, records in results:
        base = {r["concurrency"]: r for r in records if r["mode"] == baseline}
        for rec in sorted((r for r in records if r["mode"] == mode), key=lambda r: r["concurrency"]):
            c = rec["concurrency"]
            if c not in base or "speedup" not in rec:
                continue
            plain = base[c]
            drafted = rec.get("drafted_per_round")  # None where the backend reports no rounds
            ttft_ratio = rec["ttft_ms"] / plain["ttft_ms"] if plain.get("ttft_ms") else None
            cells.append({
                "workload": workload, "max_new_tokens": max_new, "concurrency": c,
                "speedup": rec["speedup"], "speedup_min": rec["speedup_min"], "speedup_max": rec["speedup_max"],
                "repeats": rec["repeats"], "ttft_ratio": ttft_ratio, "drafted_per_round": drafted,
                "tokens_per_round": rec.get("mean_accepted_tokens"), "acceptance_rate": rec.get("acceptance_rate"),
                "plain_tok_s": plain["throughput_tok_s"], "tok_s": rec["throughput_tok_s"],
                "mismatches": rec.get("mismatches", 0), "failures": rec.get("failures", 0) + plain.get("failures", 0),
                "verdict": verdict(rec["speedup"], rec["speedup_min"], drafted),
            })
    return cells


def paired_ratios(runs: list[dict[str, Any]], field: str, mode: str = "speculative",
                  baseline: str = "plain") -> dict[int, float]:
    """Per concurrency, the median over requests of `mode`'s `field` (a request's time: "ttft_s",
    "e2e_s") over `baseline`'s for the same request (id) in the same repeat; `runs` as a report keeps
    them (mode, concurrency, repeat, requests). Failed requests, and requests whose baseline time is
    missing or 0, pair with nothing."""
    times = {(r["mode"], r["concurrency"], r["repeat"], q["id"]): q[field] for r in runs for q in r["requests"]
             if q.get("finish_reason") != "error"}
    ratios: dict[int, list[float]] = {}
    for (m, c, k, rid), t in times.items():
        base = times.get((baseline, c, k, rid))
        if m == mode and base:
            ratios.setdefault(c, []).append(t / base)
    return {c: statistics.median(v) for c, v in sorted(ratios.items())}


def paired_ttft_ratios(runs: list[dict[str, Any]], mode: str = "speculative",
                       baseline: str = "plain") -> dict[int, float]:
    """`paired_ratios` of the requests' TTFT."""
    return paired_ratios(runs, "ttft_s", mode, baseline)


def recycle_verdict(median: float, worst: float) -> str:
    """Recycling on against off in one cell: "loses", "pays" or "neutral" (module docstring)."""
    if median < LOSES_BELOW or worst < WORST_BELOW:
        return "loses"
    return "pays" if median >= SPECULATE_AT else "neutral"


def _throughput(run: dict[str, Any]) -> float:
    makespan = run.get("makespan_s") or 0.0
    return sum(q["new_tokens"] for q in run["requests"]) / makespan if makespan > 0 else 0.0


def paired_throughput_ratios(runs: list[dict[str, Any]], mode: str, baseline: str) -> dict[int, list[float]]:
    """Per concurrency, `mode`'s throughput over `baseline`'s in the same repeat, one ratio per repeat
    (in repeat order) where both ran and the baseline's throughput is above 0; `runs` as a report
    keeps them (mode, concurrency, repeat, makespan_s, requests)."""
    thr = {(r["mode"], r["concurrency"], r["repeat"]): _throughput(r) for r in runs}
    out: dict[int, list[float]] = {}
    for (m, c, k), t in sorted(thr.items(), key=lambda item: (item[0][1], item[0][2])):
        base = thr.get((baseline, c, k))
        if m == mode and base:
            out.setdefault(c, []).append(t / base)
    return dict(sorted(out.items()))


def recycle_arm(cells: list[dict[str, Any]], results: list[tuple[str, int, list[dict[str, Any]]]],
                runs_by_part: dict[tuple[str, int], list[dict[str, Any]]], arm: str = "recycle",
                off: str = "speculative") -> list[dict[str, Any]]:
    """`cells` (of `grid_cells(results, off, ...)`) with the `arm` mode's keys added in place (module
    docstring): its speed-up over the baseline (`recycle_speedup`, `_min`, `_max`), its throughput over
    `off`'s repeat by repeat (`recycle_vs_off`, `_min`, `_max`, `_runs`), drafting, mismatches and
    failures, and `recycle_verdict`. A cell whose arm did not run is left as it was."""
    records = {(w, m, r["concurrency"]): r for w, m, recs in results for r in recs if r["mode"] == arm}
    for cell in cells:
        key = (cell["workload"], cell["max_new_tokens"], cell["concurrency"])
        rec = records.get(key)
        ratios = paired_throughput_ratios(runs_by_part.get(key[:2], []), arm, off).get(key[2])
        if rec is None or not ratios:
            continue
        cell.update({
            "recycle_speedup": rec.get("speedup"), "recycle_speedup_min": rec.get("speedup_min"),
            "recycle_speedup_max": rec.get("speedup_max"), "recycle_tok_s": rec["throughput_tok_s"],
            "recycle_vs_off": statistics.median(ratios), "recycle_vs_off_min": min(ratios),
            "recycle_vs_off_max": max(ratios), "recycle_vs_off_runs": ratios,
            "recycle_drafted_per_round": rec.get("drafted_per_round"),
            "recycle_tokens_per_round": rec.get("mean_accepted_tokens"),
            "recycle_acceptance_rate": rec.get("acceptance_rate"),
            "recycle_mismatches": rec.get("mismatches", 0), "recycle_failures": rec.get("failures", 0),
            "recycle_verdict": recycle_verdict(statistics.median(ratios), min(ratios)),
        })
    return cells


def format_recycle(cells: list[dict[str, Any]]) -> str:
    """The cells that ran the recycling arm as a text table: recycling on against off."""
    head = ["workload", "max_new", "conc", "off tok/s", "on tok/s", "on/off [min-max]", "on/plain", "drafted/rd off>on",
            "tok/round off>on", "mism", "verdict"]
    rows = [head]

    def two(a, b):
        return "-" if a is None or b is None else f"{a:.2f}>{b:.2f}"

    for c in cells:
        if "recycle_vs_off" not in c:
            continue
        rows.append([c["workload"], str(c["max_new_tokens"]), str(c["concurrency"]), f"{c['tok_s']:.1f}",
                     f"{c['recycle_tok_s']:.1f}",
                     f"{c['recycle_vs_off']:.3f}x [{c['recycle_vs_off_min']:.3f}-{c['recycle_vs_off_max']:.3f}]",
                     "-" if c["recycle_speedup"] is None else f"{c['recycle_speedup']:.2f}x",
                     two(c["drafted_per_round"], c["recycle_drafted_per_round"]),
                     two(c["tokens_per_round"], c["recycle_tokens_per_round"]), str(c["recycle_mismatches"]),
                     c["recycle_verdict"]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(x.rjust(w) if 0 < i < len(head) - 1 else x.ljust(w) for i, (x, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def recycle_heatmap_cells(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cells that ran the recycling arm, shaped for `write_heatmap` (on over off)."""
    return [{"workload": c["workload"], "max_new_tokens": c["max_new_tokens"], "concurrency": c["concurrency"],
             "speedup": c["recycle_vs_off"], "speedup_min": c["recycle_vs_off_min"], "verdict": c["recycle_verdict"]}
            for c in cells if "recycle_vs_off" in c]


def format_grid(cells: list[dict[str, Any]]) -> str:
    head = ["workload", "max_new", "conc", "plain tok/s", "spec tok/s", "speedup [min-max]", "TTFT x", "TTFT paired",
            "e2e paired", "drafted/rd", "tok/round", "mism", "verdict"]
    rows = [head]
    for c in cells:
        rows.append([c["workload"], str(c["max_new_tokens"]), str(c["concurrency"]), f"{c['plain_tok_s']:.1f}",
                     f"{c['tok_s']:.1f}", f"{c['speedup']:.2f}x [{c['speedup_min']:.2f}-{c['speedup_max']:.2f}]",
                     "-" if c["ttft_ratio"] is None else f"{c['ttft_ratio']:.2f}",
                     "-" if c.get("ttft_ratio_paired") is None else f"{c['ttft_ratio_paired']:.2f}",
                     "-" if c.get("e2e_ratio_paired") is None else f"{c['e2e_ratio_paired']:.2f}",
                     "-" if c["drafted_per_round"] is None else f"{c['drafted_per_round']:.2f}",
                     "-" if c["tokens_per_round"] is None else f"{c['tokens_per_round']:.2f}",
                     str(c["mismatches"]), c["verdict"]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(x.rjust(w) if 0 < i < len(head) - 1 else x.ljust(w) for i, (x, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def write_heatmap(path, cells: list[dict[str, Any]], title: str = "speculative / plain") -> str:
    """The grid's speed-ups as a PNG heat map (module docstring) headed by `title` (what is divided by
    what); returns its path."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    rows = list(dict.fromkeys((c["workload"], c["max_new_tokens"]) for c in cells))
    cols = sorted({c["concurrency"] for c in cells})
    grid = np.full((len(rows), len(cols)), np.nan)
    for c in cells:
        grid[rows.index((c["workload"], c["max_new_tokens"])), cols.index(c["concurrency"])] = c["speedup"]
    finite = grid[np.isfinite(grid)]
    # the two sides of 1.0 scale apart, so that a 10% loss is as red as the best cell is green
    low = min(0.9, float(finite.min())) if finite.size else 0.9
    high = max(1.5, float(finite.max())) if finite.size else 1.5
    norm = TwoSlopeNorm(vmin=low, vcenter=1.0, vmax=high)
    fig, ax = plt.subplots(figsize=(1.9 * len(cols) + 2.8, 0.85 * len(rows) + 1.6))
    image = ax.imshow(np.ma.masked_invalid(grid), cmap="RdYlGn", norm=norm, aspect="auto")
    for c in cells:
        i, j = rows.index((c["workload"], c["max_new_tokens"])), cols.index(c["concurrency"])
        shade = norm(c["speedup"])
        ax.text(j, i, f"{c['speedup']:.2f}x (min {c['speedup_min']:.2f})\n{c['verdict']}", ha="center", va="center",
                fontsize=9, color="white" if shade < 0.15 or shade > 0.85 else "black",
                fontweight="bold" if c["verdict"] == "loses" else "normal")
    ax.set_xticks(range(len(cols)), [str(c) for c in cols])
    ax.set_yticks(range(len(rows)), [f"{w}, {m} tokens" for w, m in rows])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_title(f"Throughput {title}: median of repeats (min: the worst repeat)", fontsize=10)
    bar = fig.colorbar(image, ax=ax, fraction=0.05)
    bar.set_label(f"speed-up, {title}")
    # the norm's two halves differ in scale: ticks on both sides of 1.0, or the losing side has none;
    # exact values inside [low, high] (a tick beyond the norm's range blanks the bar), printed rounded
    bar.set_ticks([low, (low + 1.0) / 2, *np.linspace(1.0, high, 5).tolist()])
    bar.ax.yaxis.set_major_formatter("{x:.2f}")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)
