"""Report of a benchmark: environment, text table, JSON file and PNG plots of its records.

Contract: `format_table(records)` is a fixed-column text table (speed-up with its min-max over
repeats; the time split as prefill/draft/verify/rest percentages); `write_report(path, report)` writes JSON atomically; `write_plots(out_dir, records)` writes
speed-up vs concurrency, accepted tokens by draft position and TPOT distributions as PNG files
(matplotlib, Agg backend) and returns their paths; `environment(model, tokenizer)` describes the
machine, versions and model.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["environment", "format_table", "write_report", "write_plots", "split_cell"]


def environment(model=None, tokenizer=None) -> dict[str, Any]:
    import importlib.metadata as md

    def version(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    env = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
           "versions": {n: version(n) for n in ("suffixspec", "torch", "transformers", "numpy", "numba")}}
    try:
        import torch

        env["torch_threads"] = torch.get_num_threads()
        if model is not None:
            p = next(model.parameters())
            env["device"] = str(p.device)
            env["precision"] = str(p.dtype).replace("torch.", "")
            env["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
            env["model_class"] = type(model).__name__
            env["parameters"] = int(sum(x.numel() for x in model.parameters()))
            if p.device.type == "cuda":
                env["gpu"] = torch.cuda.get_device_name(p.device)
    except ImportError:
        pass
    if tokenizer is not None:
        env["tokenizer"] = {"name": getattr(tokenizer, "name", type(tokenizer).__name__),
                            "vocab_size": getattr(tokenizer, "vocab_size", None),
                            "fingerprint": getattr(tokenizer, "fingerprint", None)}
    return env


_FIELDS = (("mode", "mode", "{}"), ("conc", "concurrency", "{}"), ("TTFT ms", "ttft_ms", "{:.0f}"),
           ("TPOT ms", "tpot_ms", "{:.1f}"), ("e2e p50", "e2e_ms_p50", "{:.0f}"), ("p90", "e2e_ms_p90", "{:.0f}"),
           ("p99", "e2e_ms_p99", "{:.0f}"), ("tok/s", "throughput_tok_s", "{:.1f}"),
           ("tok/round", "mean_accepted_tokens", "{:.2f}"), ("accept", "acceptance_rate", "{:.0%}"),
           ("speedup", "speedup", "{:.2f}x"), ("split p/d/v/r %", "time_split", "{}"), ("mism", "mismatches", "{}"),
           ("fail", "failures", "{}"))


def split_cell(split: dict | None) -> str:
    """A time split as `prefill/draft/verify/rest` percentages, or '-'."""
    if not split:
        return "-"
    share = split["share"]
    return "/".join(f"{100 * share[k]:.0f}" for k in ("prefill", "draft", "verify", "rest"))


def format_table(records: list[dict]) -> str:
    rows = [[h for h, _, _ in _FIELDS]]
    for rec in records:
        row = []
        for _, key, fmt in _FIELDS:
            value = rec.get(key)
            cell = split_cell(value) if key == "time_split" else ("-" if value is None else fmt.format(value))
            if key == "speedup" and value is not None and rec.get("repeats", 1) > 1:
                cell += f" [{rec['speedup_min']:.2f}-{rec['speedup_max']:.2f}]"
            row.append(cell)
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def write_report(path, report: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=float))
    os.replace(tmp, path)


def write_plots(out_dir, records: list[dict], title: str = "") -> list[str]:
    """PNG plots: speed-up vs concurrency, accepted tokens by draft position, TPOT distributions."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, marker in (("speculative", "o"), ("prompt_lookup", "s")):
        recs = [r for r in records if r["mode"] == mode and "speedup" in r]
        if not recs:
            continue
        xs = [r["concurrency"] for r in recs]
        ys = [r["speedup"] for r in recs]
        err = [[y - r["speedup_min"] for y, r in zip(ys, recs)], [r["speedup_max"] - y for y, r in zip(ys, recs)]]
        ax.errorbar(xs, ys, yerr=err, marker=marker, capsize=4, label=mode)
    ax.axhline(1.0, color="grey", lw=1, ls="--", label="plain decoding")
    ax.axhline(0.95, color="red", lw=0.8, ls=":", label="0.95x floor")
    ax.set_xscale("log", base=2)
    concs = sorted({r["concurrency"] for r in records})
    ax.set_xticks(concs, [str(c) for c in concs])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("throughput speed-up over plain (median, min-max)")
    ax.set_title(f"Speed-up vs concurrency {title}".strip())
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(str(out_dir / "speedup_vs_concurrency.png"))
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    spec = [r for r in records if r["mode"] == "speculative"]
    width = 0.8 / max(1, len(spec))
    for i, r in enumerate(spec):
        ys = r["accepted_by_position"][:16]
        ax.bar(np.arange(1, len(ys) + 1) + (i - (len(spec) - 1) / 2) * width, ys, width=width,
               label=f"concurrency {r['concurrency']}")
    ax.set_xlabel("draft position (depth)")
    ax.set_ylabel("fraction of rounds accepting a token there")
    ax.set_title(f"Accepted tokens by draft position {title}".strip())
    if spec:
        ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(str(out_dir / "accepted_by_position.png"))
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(records)), 4))
    data = [r["tpot_ms_all"] or [0.0] for r in records]
    labels = [f"{r['mode']}\nc={r['concurrency']}" for r in records]
    ax.boxplot(data, showfliers=True)
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
    ax.set_ylabel("TPOT per request (ms)")
    ax.set_title(f"Time per output token {title}".strip())
    fig.tight_layout()
    written.append(str(out_dir / "tpot_distribution.png"))
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written
