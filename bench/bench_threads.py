"""Decoding speed by torch thread setting, on a quiet host and with competing CPU-bound processes.

For each contention level (0, 1, 2 competing processes: ``python -c "while True: pass"``, started
here, bounded by ``timeout`` and killed at the end of the level) and each thread setting (``1`` ..
the cores: ``--threads N``, which leaves OpenMP's wait policy unset: ``--threads <cores>`` is what the
commands did before, torch's own count; ``N:POLICY``: the same with ``OMP_WAIT_POLICY=POLICY``
(``N:SPIN<k>``: with ``GOMP_SPINCOUNT=k``);
``default``: no flag, `suffixspec.threads` chooses at start-up), two cases:

- ``generate``: a fresh ``suffixspec generate --json`` per measurement (its start-up included, as a
  user runs it), tokens/s as it reports them (``tokens_per_s``: new tokens over the request's time);
- ``serve``: one ``suffixspec serve --no-response-cache`` per setting, started under the level's
  contention (the default decides then), one non-streaming completion at a time; tokens/s is the
  completion's tokens over the request's wall time seen by the client.

Both plain (budget 0) and speculative (budget auto), on a shipped code-edit prompt (chat-templated).
Settings and modes run interleaved (a shuffled order per repeat), so a change in the host's load
falls on every setting alike; medians and the min..max spread per cell, each cell's ratio to the
best setting of its (case, mode, level), the thread count the default chose, and /proc/loadavg
before and after each level. Take it under ``flock /tmp/suffixspec-bench.lock`` on a shared host.
A table, then one JSON line last (``--record`` appends it to ``bench/results/threads.jsonl``).

    flock /tmp/suffixspec-bench.lock python bench/bench_threads.py --reps 3 --record
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

CHOSEN = re.compile(r"torch threads: (\d+) \((.*?)\); OpenMP wait policy (\S+)")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "suffixspec.cli", *args]


def setting_args(setting: str, env: dict) -> tuple[list[str], dict]:
    """(extra CLI flags, environment) of a setting: ``default``, ``N`` or ``N:POLICY``."""
    env = {k: v for k, v in env.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if setting == "default":
        return [], env
    count, _, policy = setting.partition(":")
    if policy.startswith("SPIN"):  # libgomp's spins before a waiting thread sleeps (its default: 300000)
        env["GOMP_SPINCOUNT"] = policy[4:]
    elif policy:
        env["OMP_WAIT_POLICY"] = policy
    return ["--threads", count], env


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


class Hogs:
    """`n` CPU-bound processes, each bounded by `timeout limit_s`, stopped by `stop()` (by their ids)."""

    def __init__(self, n: int, limit_s: float):
        self.procs = [subprocess.Popen(["timeout", str(int(limit_s)), sys.executable, "-c", "while True: pass"],
                                       start_new_session=True) for _ in range(n)]
        time.sleep(1.0 if n else 0.0)  # let the scheduler see them before anything is measured

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def run_generate(setting: str, budget: str, prompt_file: Path, tokens: int, timeout_s: float) -> dict:
    flags, env = setting_args(setting, dict(os.environ, PYTHONUNBUFFERED="1"))
    cmd = cli("generate", "--prompt-file", str(prompt_file), "--max-new-tokens", str(tokens), "--budget", budget,
              "--json", *flags)
    t0 = time.monotonic()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"tokens_per_s": None, "timeout": True, "wall_s": time.monotonic() - t0}
    if out.returncode != 0:
        raise SystemExit(f"generate failed ({out.returncode}): {out.stderr[-2000:]}")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    row = {"tokens_per_s": report["tokens_per_s"], "new_tokens": report["new_tokens"],
           "wall_s": time.monotonic() - t0}
    m = CHOSEN.search(out.stderr)
    if m:
        row["threads"], row["why"] = int(m.group(1)), m.group(2)
    return row


class Servers:
    """One `suffixspec serve` per setting, started one after another (each alone while it decides)."""

    def __init__(self, settings, root: Path):
        self.servers, self.logs = {}, {}
        for s in settings:
            flags, env = setting_args(s, dict(os.environ, PYTHONUNBUFFERED="1"))
            log = root / f"serve-{s.replace(':', '_')}.log"
            self.servers[s] = self._spawn(flags + ["--no-response-cache", "--max-batch", "1"], env, log)
            self.logs[s] = log

    @staticmethod
    def _spawn(flags, env, log):
        port = common.free_port()
        return common.start_server(common.serve_command(port, *flags), port, log, env=env, timeout=600)

    def chosen(self, setting: str) -> dict:
        m = CHOSEN.search(self.logs[setting].read_text(errors="replace"))
        return {"threads": int(m.group(1)), "why": m.group(2)} if m else {}

    def stop(self) -> None:
        for proc, _ in self.servers.values():
            proc.send_signal(signal.SIGTERM)
        for proc, _ in self.servers.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_serve(url: str, budget: str, prompt: str, tokens: int, timeout_s: float) -> dict:
    import httpx

    body = {"model": "SmolLM2-135M-Instruct", "prompt": prompt, "max_tokens": tokens, "temperature": 0,
            "suffixspec": {"budget": 0 if budget == "0" else "auto"}}
    t0 = time.monotonic()
    try:
        r = httpx.post(url + "/v1/completions", json=body, timeout=timeout_s)
    except httpx.TimeoutException:
        return {"tokens_per_s": None, "timeout": True, "wall_s": time.monotonic() - t0}
    wall = time.monotonic() - t0
    r.raise_for_status()
    n = r.json()["usage"]["completion_tokens"]
    return {"tokens_per_s": n / wall, "new_tokens": n, "wall_s": wall}


def measure_level(level: int, args, prompt: str, prompt_file: Path, root: Path, rnd) -> list[dict]:
    """Every (case, setting, mode) `args.reps` times under `level` competing processes, interleaved."""
    hogs = Hogs(level, limit_s=args.level_limit_s)
    rows, before = [], loadavg()
    try:
        servers = Servers(args.settings, root) if "serve" in args.cases else None
        try:
            for rep in range(args.reps):
                plan = [(case, s, mode) for case in args.cases for s in args.settings for mode in ("plain", "spec")]
                rnd.shuffle(plan)
                for case, s, mode in plan:
                    budget = "0" if mode == "plain" else "auto"
                    if case == "generate":
                        row = run_generate(s, budget, prompt_file, args.tokens, args.timeout_s)
                    else:
                        row = run_serve(servers.servers[s][1], budget, prompt, args.tokens, args.timeout_s)
                        row.update(servers.chosen(s))
                    row.update(case=case, setting=s, mode=mode, level=level, rep=rep, loadavg=loadavg())
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr)
        finally:
            if servers is not None:
                servers.stop()
    finally:
        hogs.stop()
    after = loadavg()
    for row in rows:
        row["loadavg_before"], row["loadavg_after"] = before, after
    return rows


def earlier_rows(path: str, args) -> list[dict]:
    """The complete levels of an earlier run's rows (a level this run measures again is dropped)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.startswith("{")]
    measured = set(args.levels)
    for level in sorted({r["level"] for r in rows}):
        if level not in args.levels:
            args.levels.append(level)
    args.levels.sort()
    return [dict({"loadavg_before": "not recorded", "loadavg_after": "not recorded"}, **r) for r in rows
            if r["level"] not in measured]


def summarize(rows: list[dict], args) -> list[dict]:
    cells = []
    for case in args.cases:
        for mode in ("plain", "spec"):
            for level in args.levels:
                group = []
                for s in args.settings:
                    got = [r for r in rows if (r["case"], r["mode"], r["level"], r["setting"]) == (case, mode, level, s)]
                    speeds = [r["tokens_per_s"] if r["tokens_per_s"] is not None else 0.0 for r in got]
                    threads = sorted({r["threads"] for r in got if "threads" in r})
                    group.append({"case": case, "mode": mode, "level": level, "setting": s, "n": len(speeds),
                                  "median": statistics.median(speeds), "min": min(speeds), "max": max(speeds),
                                  "timeouts": sum(bool(r.get("timeout")) for r in got), "threads": threads,
                                  "loadavg": got[0]["loadavg_before"] + " -> " + got[0]["loadavg_after"]})
                best = max(c["median"] for c in group) or 1.0
                for c in group:
                    c["of_best"] = c["median"] / best
                cells += group
    return cells


def verdict(cells: list[dict]) -> dict:
    """The issue's target for the default: >= 0.9x the best quiet, >= 0.7x the best under contention."""
    out = {}
    for c in cells:
        if c["setting"] == "default":
            need = 0.9 if c["level"] == 0 else 0.7
            out[f"{c['case']}/{c['mode']}/{c['level']}"] = {"of_best": round(c["of_best"], 3), "need": need,
                                                              "ok": c["of_best"] >= need}
    return out


def main() -> None:
    cores = len(os.sched_getaffinity(0))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", default=",".join([str(n) for n in range(1, cores + 1)] + ["default"]),
                    help="thread settings: N, N:POLICY, N:SPIN<k> or default (default: 1..cores and default)")
    ap.add_argument("--levels", default="0,1,2", help="competing CPU-bound processes per level (default 0,1,2)")
    ap.add_argument("--cases", default="generate,serve", help="generate and/or serve (default both)")
    ap.add_argument("--reps", type=int, default=3, help="measurements per cell (default 3)")
    ap.add_argument("--tokens", type=int, default=24, help="tokens generated per measurement (default 24)")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="one measurement's limit (default 120)")
    ap.add_argument("--level-limit-s", type=float, default=1800.0,
                    help="the competing processes' own time limit (default 1800; they are killed after the level)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the interleaved order (default 0)")
    ap.add_argument("--rows-from", default=None, metavar="FILE",
                    help="also summarise the rows of an earlier run (its stderr, one JSON row a line), e.g. levels "
                         "measured before it was stopped (default: none)")
    common.add_record_flag(ap)
    args = ap.parse_args()
    args.settings = args.settings.split(",")
    args.levels = [int(x) for x in args.levels.split(",")]
    args.cases = args.cases.split(",")
    rec = json.loads((common.CORPORA / "copy_edit_prompts.jsonl").read_text().splitlines()[0])
    rnd = random.Random(args.seed)
    measure = list(args.levels)
    rows = earlier_rows(args.rows_from, args) if args.rows_from else []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="suffixspec-threads-") as tmp:
        prompt_file = Path(tmp) / "prompt.txt"
        prompt_file.write_text(rec["chatml"])
        for level in measure:
            rows += measure_level(level, args, rec["chatml"], prompt_file, Path(tmp), rnd)
    cells = summarize(rows, args)
    print(f"{'case':9} {'mode':5} {'procs':>5} {'setting':>10} {'threads':>7} {'median':>7} {'min..max':>13} "
          f"{'of best':>7}  loadavg")
    for c in cells:
        print(f"{c['case']:9} {c['mode']:5} {c['level']:>5} {c['setting']:>10} {','.join(map(str, c['threads'])):>7} "
              f"{c['median']:7.2f} {c['min']:6.2f}..{c['max']:<6.2f} {c['of_best']:7.2f}  {c['loadavg']}")
    common.emit({"benchmark": "threads", "cores": cores, "tokens": args.tokens, "reps": args.reps,
                 "prompt": rec["id"], "cells": cells, "default_target": verdict(cells),
                 "seconds": round(time.monotonic() - t0, 1), "runs": rows}, args, "threads")


if __name__ == "__main__":
    main()
