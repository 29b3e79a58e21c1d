"""The prefix (KV) cache's memory through `suffixspec serve`: resident memory over many distinct prompts.

    python bench/bench_prefix_memory.py                                   # bound 1 GiB, 20 then 50 prompts
    python bench/bench_prefix_memory.py --prefix-cache-bytes 268435456 --model MODEL.gguf --record

A server started with `--prefix-cache-bytes BOUND` hears, after a warm-up, 20 and then 50 more distinct
prompts of about 1,300 tokens (`/v1/completions`, greedy, 4 tokens each): windows of the shipped
standard-library code (`corpora/python_stdlib.jsonl`), each starting at a different piece, so that no
two share a prefix. After every prompt the server's resident memory (VmRSS of its process and its
children, from /proc) is read, and its `/metrics` (the prefix cache's series: pool bytes, evictions,
found by name). A second server with `--no-prefix-cache` hears the same prompts as a reference
(`--no-reference` leaves it out): what memory does without the cache. Targets (issue 53): growth over
the warmed-up server at most BOUND + 0.5 GiB after 20 and after 70 prompts; none once the pool is full
(the first prompt after which the pool has evicted), within `--flat-mib`. Needs a `suffixspec serve`
that takes `--prefix-cache-bytes` and `--no-prefix-cache`; without them the script stops before
measuring anything. Prints a table, then one JSON line (`--record [PATH]`:
bench/results/prefix_memory.jsonl). Run it alone (`flock LOCKFILE python bench/bench_prefix_memory.py`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

from bench_agent import require_serve_flags

import common

GIB = 1 << 30
MIB = 1 << 20
PHASES = (20, 50)  # prompts sent, then more: readings are reported after each phase (`--phases`)


def distinct_prompts(count: int, chars: int) -> list[str]:
    """`count` prompts of about `chars` characters: prompt i is the shipped stdlib code from piece i on,
    cut at a line end; they start at different pieces, so no two share a prefix."""
    pieces = [json.loads(line)["text"] for line in (common.CORPORA / "python_stdlib.jsonl").read_text().splitlines()]
    if count > len(pieces):
        raise SystemExit(f"--prompts: at most {len(pieces)} distinct prompts (one per shipped piece), got {count}")
    text = "\n\n\n".join(pieces + pieces)  # (a window may run past the last piece)
    starts, at = [], 0
    for piece in pieces[:count]:
        starts.append(at)
        at += len(piece) + 3
    out = []
    for s in starts:
        window = text[s: s + chars]
        out.append(window[: window.rfind("\n") + 1] or window)
    heads = {p[:200] for p in out}
    if len(heads) != len(out):
        raise SystemExit("the shipped pieces do not give distinct prompts (two begin alike)")
    return out


def parse_vmrss(status: str) -> int:
    """Bytes of VmRSS in a /proc/PID/status text."""
    m = re.search(r"^VmRSS:\s+(\d+)\s+kB", status, re.M)
    if m is None:
        raise ValueError("no VmRSS line (is the process gone?)")
    return int(m.group(1)) * 1024


def tree_rss(pid: int) -> int:
    """Resident bytes of process `pid` and its descendants."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += parse_vmrss(Path(f"/proc/{p}/status").read_text())
        except (OSError, ValueError):
            if p == pid:
                raise
            continue
        todo += children.get(p, [])
    return total


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as {series name: value summed over its labels}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m:
            try:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
            except ValueError:
                continue
    return out


def cache_series(metrics: dict[str, float]) -> dict:
    """The prefix cache's pool bytes and evictions among the series (by name: `prefix_cache` and `bytes`,
    not a counter; `prefix_cache` and `evict`); None where the server has no such series."""
    names = [n for n in metrics if "prefix_cache" in n]
    pool = next((n for n in names if n.endswith("bytes")), None)
    evict = next((n for n in names if "evict" in n and not n.endswith("_created")), None)
    return {"pool_bytes": metrics[pool] if pool else None, "evictions": metrics[evict] if evict else None}


def summarise(readings: list[dict], bound: int | None, flat_bytes: int, phases=PHASES) -> dict:
    """One arm's readings (`{"prompts", "rss", "pool_bytes", "evictions"}`, the first after the warm-up,
    prompts 0) against the targets: growth after each phase within BOUND + 0.5 GiB; after the pool is
    full (its first eviction), growth within `flat_bytes`."""
    base = readings[0]["rss"]
    marks, total = [], 0
    for n in phases:
        total += n
        at = next((r for r in readings if r["prompts"] == total), None)
        if at is not None:
            marks.append({"prompts": total, "rss": at["rss"], "growth": at["rss"] - base})
    peak = max(r["rss"] for r in readings) - base
    full = next((r for r in readings if r["evictions"]), None)
    after_full = None if full is None else readings[-1]["rss"] - full["rss"]
    allowed = None if bound is None else bound + GIB // 2
    return {"base_rss": base, "phases": marks, "peak_growth": peak, "allowed_growth": allowed,
            "bound_met": None if allowed is None else peak <= allowed,
            "full_at": None if full is None else full["prompts"], "growth_after_full": after_full,
            "flat_met": None if after_full is None else after_full <= flat_bytes}


def run_arm(args, arm: str, prompts: list[str], log_dir: Path) -> list[dict]:
    import httpx

    flags = (["--threads", str(args.threads)] if args.threads else []) + (
        ["--prefix-cache-bytes", str(args.prefix_cache_bytes)] if arm == "on" else ["--no-prefix-cache"])
    proc, url = common.spawn_server(args.model, 4, log_dir / f"{arm}.log", flags)
    readings = []
    try:
        with httpx.Client(base_url=url, timeout=900) as http:
            model = http.get("/v1/models").json()["data"][0]["id"]

            def read(n: int, tokens: int | None) -> None:
                series = cache_series(parse_metrics(http.get("/metrics").text))
                readings.append({"prompts": n, "prompt_tokens": tokens, "rss": tree_rss(proc.pid), **series})

            for text in ("Count to five.", "def f(x):\n    return"):  # warm-up
                http.post("/v1/completions", json={"model": model, "prompt": text, "max_tokens": 4, "temperature": 0})
            read(0, None)
            for i, prompt in enumerate(prompts, 1):
                r = http.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 4,
                                                       "temperature": 0})
                if r.status_code != 200:
                    raise SystemExit(f"{arm}: prompt {i} answered {r.status_code}: {r.text[:300]}")
                read(i, r.json()["usage"]["prompt_tokens"])
    finally:
        proc.terminate()
        proc.wait(60)
    return readings


def _mib(value) -> str:
    return "-" if value is None else f"{value / MIB:.0f}"


def table(arms: dict, phases=PHASES) -> list[str]:
    lines = [f"{'arm':>4} {'prompts':>7} {'rss MiB':>8} {'growth MiB':>10} {'pool MiB':>8} {'evictions':>9}"]
    for arm, readings in arms.items():
        base = readings[0]["rss"]
        marks = {0} | {sum(phases[: k + 1]) for k in range(len(phases))}
        for r in readings:
            if r["prompts"] in marks:
                ev = "-" if r["evictions"] is None else f"{r['evictions']:.0f}"
                lines.append(f"{arm:>4} {r['prompts']:>7} {_mib(r['rss']):>8} {_mib(r['rss'] - base):>10} "
                             f"{_mib(r['pool_bytes']):>8} {ev:>9}")
    return lines


def verdicts(summary: dict) -> list[str]:
    s = summary["on"]
    word = {True: "met", False: "NOT met", None: "-"}
    full = ("the pool never filled (no eviction): send more prompts or lower --prefix-cache-bytes"
            if s["full_at"] is None else
            f"after the pool filled (prompt {s['full_at']}): {_mib(s['growth_after_full'])} MiB "
            f"[target <= {_mib(summary['flat_bytes'])} MiB: {word[s['flat_met']]}]")
    return [f"cache on: peak growth {_mib(s['peak_growth'])} MiB [target <= bound + 512 = "
            f"{_mib(s['allowed_growth'])} MiB: {word[s['bound_met']]}]; {full}"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="the served model (default: the embedded default)")
    p.add_argument("--prefix-cache-bytes", type=int, default=GIB, help="the pool's bound (default 1 GiB)")
    p.add_argument("--prompt-chars", type=int, default=4800, help="characters per prompt (about 1,300 tokens)")
    p.add_argument("--phases", type=lambda v: tuple(int(x) for x in v.split(",")), default=PHASES,
                   help="prompts per phase, comma-separated (default 20,50)")
    p.add_argument("--flat-mib", type=float, default=64.0, help="growth allowed once the pool is full")
    p.add_argument("--no-reference", dest="reference", action="store_false",
                   help="leave out the --no-prefix-cache server")
    p.add_argument("--threads", type=int, default=None, help="the server's torch CPU threads (default: its own)")
    common.add_record_flag(p)
    args = p.parse_args(argv)
    if not args.phases or min(args.phases) < 1:
        p.error(f"--phases: expected positive counts such as 20,50, got {args.phases}")
    if args.prefix_cache_bytes <= 0:
        p.error("--prefix-cache-bytes: expected a positive bound (the reference arm is the cache off)")
    require_serve_flags(("--prefix-cache-bytes", "--no-prefix-cache"))
    prompts = distinct_prompts(sum(args.phases), args.prompt_chars)
    arms = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arm in ("on", "off") if args.reference else ("on",):
            arms[arm] = run_arm(args, arm, prompts, Path(tmp))
    flat = int(args.flat_mib * MIB)
    summary = {arm: summarise(readings, args.prefix_cache_bytes if arm == "on" else None, flat, args.phases)
               for arm, readings in arms.items()}
    summary["flat_bytes"] = flat
    for line in table(arms, args.phases) + verdicts(summary):
        print(line)
    tokens = sorted(r["prompt_tokens"] for r in arms["on"] if r["prompt_tokens"])
    common.emit({"model": args.model or "default", "prefix_cache_bytes": args.prefix_cache_bytes,
                 "phases": args.phases, "prompt_tokens_median": tokens[len(tokens) // 2], "threads": args.threads,
                 "summary": summary, "readings": arms}, args, "prefix_memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
