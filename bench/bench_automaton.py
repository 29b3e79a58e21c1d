"""Benchmark of the suffix automaton: build throughput, memory, per-token online latency.

Run from the repository root::

    python bench/bench_automaton.py            # full run (the whole stdlib stream + degenerate streams)
    python bench/bench_automaton.py --quick    # short smoke run
    python bench/bench_automaton.py --repeats 5 --no-arctic
    python bench/bench_automaton.py --arctic-python PATH --record   # with the peer; the line kept

Measured on the stdlib token stream (`_data.stdlib_token_stream()`) and on each of
`_data.degenerate_streams()`, best of `--repeats` runs, after warming numba up:

- build: tokens/s of one bulk `SuffixAutomaton().extend(x)`; bytes per token live
  (`nbytes / len`) and after `freeze()` (`FrozenAutomaton.nbytes / len`);
- append+match: after a bulk prefix, the last `--latency-tokens` tokens one at a time:
  `sam.append(t)` then `cursor.advance([t])`, each pair timed with perf_counter_ns (p50/p99);
- append+match+counts: the same, plus `sam.continuations(sam.state_link(cursor.state))` per token
  (the longest suffix of the context with an earlier occurrence, the question a proposer asks),
  which needs exact counts and so runs the online link-cut-tree path; the ratio of the per-token
  cost on each degenerate stream to the one on real text (spec: within 3x);
- arctic-inference's suffix tree (`SuffixDecodingCache.start_request`) on the same arrays, via
  `_peers.arctic_build_bench`, with ours/arctic throughput and arctic/ours bytes per token (the
  python with arctic-inference: `--arctic-python PATH` or $SUFFIXSPEC_ARCTIC_PYTHON; neither: skipped,
  the JSON line's `arctic_note` says why).

Prints a table, then ONE JSON line (the last line of stdout) with every figure (`--record`: also
appended to bench/results/automaton.jsonl with the date, host and git revision).
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
import warnings

import _peers
import numpy as np
from _data import degenerate_streams, stdlib_token_stream

from suffixspec import SuffixAutomaton

import common

TARGETS = {
    "build_tokens_per_s_min": 2_000_000,
    "bytes_per_token_max": 100,
    "arctic_throughput_ratio_min": 3.0,
    "arctic_memory_ratio_min": 3.0,  # arctic bytes/token over ours
    "degenerate_cost_ratio_max": 3.0,
}


def warm_up() -> None:
    """Compile (or load from cache) every kernel the benchmark touches."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, 2000, dtype=np.int32)
    sam = SuffixAutomaton(x)
    cur = sam.cursor()
    for t in x[:50]:
        sam.append(int(t))
        cur.advance([int(t)])
    sam.continuations(sam.state_link(cur.state))
    for t in x[:50]:
        sam.append(int(t))
        cur.advance([int(t)])
        sam.continuations(sam.state_link(cur.state))
    sam.count(x[:3])
    sam.freeze()
    SuffixAutomaton(x).freeze()


def bench_build(x: np.ndarray, repeats: int) -> dict:
    secs = []
    live = frozen = None
    states = edges = None
    for r in range(repeats):
        gc.collect()
        sam = SuffixAutomaton()
        t0 = time.perf_counter()
        sam.extend(x)
        secs.append(time.perf_counter() - t0)
        if r == 0:
            live = sam.nbytes
            states, edges = sam.n_states, sam.n_edges
            t0 = time.perf_counter()
            fz = sam.freeze()
            freeze_s = time.perf_counter() - t0
            frozen = fz.nbytes
            del fz
        del sam
    n = len(x)
    best = min(secs)
    return {
        "n_tokens": n, "seconds": secs, "best_seconds": best, "tokens_per_s": n / best,
        "n_states": states, "n_edges": edges, "states_per_token": states / n, "edges_per_token": edges / n,
        "nbytes_live": live, "bytes_per_token_live": live / n,
        "nbytes_frozen": frozen, "bytes_per_token_frozen": frozen / n, "freeze_seconds": freeze_s,
    }


def _latency_run(x: np.ndarray, n_lat: int, counts: bool) -> tuple[np.ndarray, float]:
    n_lat = min(n_lat, len(x) - 1)
    prefix, tail = x[: len(x) - n_lat], [int(t) for t in x[len(x) - n_lat:]]
    sam = SuffixAutomaton(prefix)
    cur = sam.cursor()
    cur.advance(prefix[-64:])
    if counts:
        sam.continuations(sam.state_link(cur.state))  # settles the bulk counts outside the timing
    times = np.empty(n_lat, np.int64)
    clock = time.perf_counter_ns
    append, advance, conts, link = sam.append, cur.advance, sam.continuations, sam.state_link
    gc.collect()
    gc.disable()
    try:
        t_all = time.perf_counter()
        if counts:
            for i, t in enumerate(tail):
                t0 = clock()
                append(t)
                advance((t,))
                conts(link(cur.state))
                times[i] = clock() - t0
        else:
            for i, t in enumerate(tail):
                t0 = clock()
                append(t)
                advance((t,))
                times[i] = clock() - t0
        total = time.perf_counter() - t_all
    finally:
        gc.enable()
    return times, total


def bench_latency(x: np.ndarray, n_lat: int, repeats: int, counts: bool) -> dict:
    best = None
    for _ in range(repeats):
        times, total = _latency_run(x, n_lat, counts)
        if best is None or total < best[1]:
            best = (times, total)
    times, total = best
    return {
        "n_tokens": int(times.shape[0]), "prefix_tokens": int(len(x) - times.shape[0]),
        "tokens_per_s": times.shape[0] / total, "mean_us": float(times.mean()) / 1e3,
        "p50_us": float(np.percentile(times, 50)) / 1e3, "p99_us": float(np.percentile(times, 99)) / 1e3,
        "max_us": float(times.max()) / 1e3,
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per measurement, best kept (default 3)")
    ap.add_argument("--quick", action="store_true", help="short smoke run (200k-token streams, 20k latency tokens)")
    ap.add_argument("--limit", type=int, default=None, help="stdlib tokens to use (default: all)")
    ap.add_argument("--latency-tokens", type=int, default=None, help="one-token appends timed (default 200000)")
    ap.add_argument("--no-arctic", action="store_true", help="skip the arctic-inference comparison")
    ap.add_argument("--streams", default=None, help="comma-separated subset of stream names")
    _peers.add_arctic_flag(ap)
    common.add_record_flag(ap)
    args = ap.parse_args(argv)

    limit = args.limit if args.limit is not None else (200_000 if args.quick else None)
    n_lat = args.latency_tokens if args.latency_tokens is not None else (20_000 if args.quick else 200_000)
    repeats = max(1, args.repeats if not args.quick else min(args.repeats, 2))

    real = stdlib_token_stream(limit=limit)
    streams = {"stdlib": real}
    streams.update(degenerate_streams(n=len(real)))
    if args.streams:
        keep = set(args.streams.split(","))
        streams = {k: v for k, v in streams.items() if k in keep or k == "stdlib"}

    t0 = time.perf_counter()
    warm_up()
    warm_s = time.perf_counter() - t0

    results = {}
    for name, x in streams.items():
        results[name] = {
            "build": bench_build(x, repeats),
            "append_match": bench_latency(x, n_lat, repeats, counts=False),
            "append_match_counts": bench_latency(x, n_lat, repeats, counts=True),
        }
        print(f"  measured {name}", file=sys.stderr, flush=True)

    arctic, arctic_note = None, None
    if args.no_arctic:
        arctic_note = "skipped (--no-arctic)"
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                arctic = _peers.arctic_build_bench(list(streams.values()), repeats=repeats,
                                                    python=args.arctic_python)
            except Exception as exc:  # noqa: BLE001 - report, never fail the whole benchmark
                arctic_note = f"arctic bench failed: {exc}"[:500]
        if arctic is None and arctic_note is None:
            arctic_note = "; ".join(str(w.message) for w in caught) or "arctic unavailable"
    if arctic is not None:
        for (name, _), a in zip(streams.items(), arctic["results"]):
            b = results[name]["build"]
            results[name]["arctic"] = {
                "tokens_per_s": a["tokens_per_s"], "bytes_per_token": a["bytes_per_token"],
                "estimate_memory_bytes": a["estimate_memory_bytes"], "rss_delta_bytes": a["rss_delta_bytes"],
                "throughput_ratio": b["tokens_per_s"] / a["tokens_per_s"] if a["tokens_per_s"] else None,
                "memory_ratio_live": a["bytes_per_token"] / b["bytes_per_token_live"],
                "memory_ratio_frozen": a["bytes_per_token"] / b["bytes_per_token_frozen"],
            }

    ref = results["stdlib"]["append_match_counts"]
    for name, r in results.items():
        c = r["append_match_counts"]
        r["counts_cost_ratio_vs_stdlib"] = {
            "mean": c["mean_us"] / ref["mean_us"], "p50": c["p50_us"] / ref["p50_us"], "p99": c["p99_us"] / ref["p99_us"],
        }

    # ---- table ----------------------------------------------------------------------
    print(f"suffixspec automaton benchmark  (python {platform.python_version()}, repeats={repeats}, "
          f"latency tokens={n_lat}, warm-up {warm_s:.1f}s)")
    hdr = (f"{'stream':<22}{'tokens':>9}{'build Mtok/s':>13}{'B/tok live':>11}{'B/tok frz':>10}"
           f"{'st/tok':>7}{'ed/tok':>7}  {'app+match p50/p99 us':>21}  {'+counts Ktok/s':>14}"
           f"{'p50/p99 us':>14}{'x stdlib':>9}")
    print(hdr)
    print("-" * len(hdr))
    for name, r in results.items():
        b, m, c = r["build"], r["append_match"], r["append_match_counts"]
        print(f"{name:<22}{b['n_tokens']:>9}{b['tokens_per_s'] / 1e6:>13.3f}{b['bytes_per_token_live']:>11.1f}"
              f"{b['bytes_per_token_frozen']:>10.1f}{b['states_per_token']:>7.2f}{b['edges_per_token']:>7.2f}  "
              f"{m['p50_us']:>10.2f}/{m['p99_us']:<10.2f}  {c['tokens_per_s'] / 1e3:>14.1f}"
              f"{c['p50_us']:>7.2f}/{c['p99_us']:<6.2f}{r['counts_cost_ratio_vs_stdlib']['mean']:>9.2f}")
    print()
    if arctic is not None:
        print(f"arctic-inference {arctic['version']} suffix tree (max_tree_depth={arctic['max_tree_depth']}), "
              f"start_request; estimate_memory() bytes/token")
        hdr2 = f"{'stream':<22}{'arctic Mtok/s':>14}{'arctic B/tok':>13}{'ours/arctic tput':>17}{'arctic/ours B (live)':>21}{'(frozen)':>9}"
        print(hdr2)
        print("-" * len(hdr2))
        for name, r in results.items():
            a = r["arctic"]
            print(f"{name:<22}{a['tokens_per_s'] / 1e6:>14.3f}{a['bytes_per_token']:>13.1f}"
                  f"{a['throughput_ratio']:>17.2f}{a['memory_ratio_live']:>21.2f}{a['memory_ratio_frozen']:>9.2f}")
        print()
    else:
        print(f"arctic-inference comparison: {arctic_note}")
        print()

    sb = results["stdlib"]["build"]
    checks = {
        "build_tokens_per_s": (sb["tokens_per_s"], sb["tokens_per_s"] >= TARGETS["build_tokens_per_s_min"]),
        "bytes_per_token_live": (sb["bytes_per_token_live"], sb["bytes_per_token_live"] <= TARGETS["bytes_per_token_max"]),
        "degenerate_counts_cost_ratio_max": (
            max(r["counts_cost_ratio_vs_stdlib"]["mean"] for n, r in results.items() if n != "stdlib") if len(results) > 1 else None,
            None),
    }
    d = checks["degenerate_counts_cost_ratio_max"][0]
    checks["degenerate_counts_cost_ratio_max"] = (d, None if d is None else d <= TARGETS["degenerate_cost_ratio_max"])
    if arctic is not None:
        a = results["stdlib"]["arctic"]
        checks["arctic_throughput_ratio"] = (a["throughput_ratio"], a["throughput_ratio"] >= TARGETS["arctic_throughput_ratio_min"])
        checks["arctic_memory_ratio_live"] = (a["memory_ratio_live"], a["memory_ratio_live"] >= TARGETS["arctic_memory_ratio_min"])
    print("targets (stdlib stream):")
    for k, (v, ok) in checks.items():
        flag = "n/a" if ok is None else ("MET" if ok else "MISSED")
        print(f"  {k:<36}{'-' if v is None else f'{v:,.2f}':>16}  {flag}")

    report = {
        "bench": "automaton", "python": platform.python_version(), "repeats": repeats, "quick": bool(args.quick),
        "latency_tokens": n_lat, "targets": TARGETS,
        "checks": {k: {"value": v, "met": ok} for k, (v, ok) in checks.items()},
        "arctic": None if arctic is None else {"version": arctic["version"], "max_tree_depth": arctic["max_tree_depth"]},
        "arctic_note": arctic_note, "streams": results,
    }
    common.emit(report, args, "automaton")
    return report


if __name__ == "__main__":
    main()
