"""Records of the editor workload: completion latency, matches, cancellations, speed-up over plain.

Contract: `summarize_editor(runs, settings)` returns one record per (mode, users) over its repeats:
completion latency (`latency_ms_p50` / `_p90`: sending to the last token, over the keystrokes where
the user waits) and time to first token, tokens per round and acceptance (those requests), how often
the completion is what the user typed next (`match_rate`: the whole suggestion; `line_match_rate`: its
first line), the mid-line requests answered before the next keystroke and those cancelled, the time
split (`timesplit`), and against the baseline mode (plain) of the same repeat: `latency_ratio_p50`
(this mode's p50 over the baseline's; median over repeats, min-max alongside), `speedup` (its
inverse), the median of per-keystroke latency ratios, and under greedy decoding the completions that
differ from the baseline's (mismatches, counted as failures). `format_editor_table(records)` is the
text table.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .editor import first_line_matches, matches
from .editor_run import EditorRun
from .report import split_cell
from .runs import BenchSettings
from .timesplit import split_shares

__all__ = ["summarize_editor", "format_editor_table"]


def _pct(values, q) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _answered(run: EditorRun) -> list[int]:
    """Positions of the keystrokes the user waited on that were answered without an error."""
    return [i for i, r in enumerate(run.sent) if r.keystroke.waits and r.e2e_s is not None and r.finish_reason != "error"]


def _record(runs: list[EditorRun]) -> dict[str, Any]:
    waits = [(run, i) for run in runs for i in _answered(run)]
    lat = [1e3 * run.sent[i].e2e_s for run, i in waits]
    ttft = [1e3 * run.sent[i].ttft_s for run, i in waits]
    new = sum(run.requests[i]["new_tokens"] for run, i in waits)
    rounds = sum(run.requests[i]["rounds"] for run, i in waits)
    drafted = sum(run.requests[i]["drafted"] for run, i in waits)
    accepted = sum(run.requests[i]["accepted"] for run, i in waits)
    through = [r for run in runs for r in run.sent if not r.keystroke.waits]
    errors = [e for run in runs for e in run.errors]
    return {
        "mode": runs[0].mode, "concurrency": runs[0].users, "repeats": len(runs),
        "requests": sum(len(run.sent) for run in runs), "waited": len(waits), "mid_line": len(through),
        "latency_ms_p50": _pct(lat, 50), "latency_ms_p90": _pct(lat, 90),
        "ttft_ms": _pct(ttft, 50), "ttft_ms_p90": _pct(ttft, 90),
        "latency_ms_p50_runs": [_pct([1e3 * run.sent[i].e2e_s for i in _answered(run)], 50) for run in runs],
        "new_tokens": new, "mean_accepted_tokens": new / rounds if rounds else None,
        "acceptance_rate": accepted / drafted if drafted else (0.0 if rounds else None),
        "match_rate": (sum(matches(run.texts[i], run.sent[i].keystroke.expected) for run, i in waits) / len(waits)
                       if waits else None),
        "line_match_rate": (sum(first_line_matches(run.texts[i], run.sent[i].keystroke.expected) for run, i in waits)
                            / len(waits) if waits else None),
        "mid_line_answered": (sum(r.e2e_s is not None for r in through) / len(through)) if through else None,
        "cancelled": sum(r.cancelled_s is not None for r in through),
        "time_split": split_shares([run.time_split for run in runs]),
        "errors": errors, "mismatches": 0, "failures": len(errors),
    }


def summarize_editor(runs: list[EditorRun], settings: BenchSettings) -> list[dict[str, Any]]:
    groups: dict[tuple[str, int], list[EditorRun]] = {}
    for run in runs:
        groups.setdefault((run.mode, run.users), []).append(run)
    base = {(run.repeat, run.users): run for run in runs if run.mode == settings.baseline}
    records = []
    for (mode, users), group in groups.items():
        rec = _record(group)
        if mode != settings.baseline:
            ratios, paired, mismatched = [], [], []
            for run in group:
                b = base.get((run.repeat, users))
                if b is None:
                    continue
                mine = {(run.sent[i].keystroke.session, run.sent[i].keystroke.index): (run.texts[i], run.sent[i].e2e_s)
                        for i in _answered(run)}
                theirs = {(b.sent[i].keystroke.session, b.sent[i].keystroke.index): (b.texts[i], b.sent[i].e2e_s)
                          for i in _answered(b)}
                p_mine = _pct([1e3 * v[1] for v in mine.values()], 50)
                p_base = _pct([1e3 * v[1] for v in theirs.values()], 50)
                if p_mine is not None and p_base:
                    ratios.append(p_mine / p_base)
                for key in sorted(mine.keys() & theirs.keys()):
                    if theirs[key][1] > 0:
                        paired.append(mine[key][1] / theirs[key][1])
                    if not settings.do_sample and mine[key][0] != theirs[key][0]:
                        mismatched.append({"repeat": run.repeat, "session": key[0], "keystroke": key[1]})
            rec["mismatches"] = len(mismatched)
            rec["mismatched_requests"] = mismatched[:20]
            rec["failures"] += len(mismatched)
            if ratios:
                rec["latency_ratio_p50"] = float(np.median(ratios))
                rec["latency_ratio_min"], rec["latency_ratio_max"] = float(min(ratios)), float(max(ratios))
                rec["latency_ratio_runs"] = ratios
                rec["speedup"] = 1.0 / rec["latency_ratio_p50"] if rec["latency_ratio_p50"] > 0 else None
            if paired:
                rec["latency_ratio_paired_median"] = float(np.median(paired))
        records.append(rec)
    order = {m: i for i, m in enumerate(settings.modes)}
    records.sort(key=lambda r: (r["concurrency"], order.get(r["mode"], len(order))))
    return records


_FIELDS = (("mode", "mode", "{}"), ("users", "concurrency", "{}"), ("TTFT p50", "ttft_ms", "{:.0f}"),
           ("lat p50", "latency_ms_p50", "{:.0f}"), ("p90", "latency_ms_p90", "{:.0f}"),
           ("tok/round", "mean_accepted_tokens", "{:.2f}"), ("accept", "acceptance_rate", "{:.0%}"),
           ("match", "match_rate", "{:.0%}"), ("line", "line_match_rate", "{:.0%}"),
           ("mid-line ok", "mid_line_answered", "{:.0%}"), ("cancel", "cancelled", "{}"),
           ("lat/plain", "latency_ratio_p50", "{:.2f}x"), ("split p/d/v/r %", "time_split", "{}"),
           ("mism", "mismatches", "{}"), ("fail", "failures", "{}"))


def format_editor_table(records: list[dict]) -> str:
    rows = [[h for h, _, _ in _FIELDS]]
    for rec in records:
        row = []
        for _, key, fmt in _FIELDS:
            value = rec.get(key)
            cell = split_cell(value) if key == "time_split" else ("-" if value is None else fmt.format(value))
            if key == "latency_ratio_p50" and value is not None and rec.get("repeats", 1) > 1:
                cell += f" [{rec['latency_ratio_min']:.2f}-{rec['latency_ratio_max']:.2f}]"
            row.append(cell)
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
