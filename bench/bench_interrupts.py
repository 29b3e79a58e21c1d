"""Interrupting the corpus writers at random moments: `suffixspec index` (rebuilding an existing index),
`index --append`, `merge` (compacting an index in place) and `delete`, each sent SIGINT or SIGTERM,
either to the main process alone (as a supervisor sends it) or to its whole process group (as a
terminal's Ctrl-C does), at a moment drawn uniformly over the command's own run.

The moment is counted from when the command's handlers are in place (`/proc/PID/status` shows SIGTERM
caught), not from the process's start: before that the interpreter is still importing `suffixspec`
(numba), has written nothing, and a signal has Python's default effect.

Each run is checked: no hang (the process exits within `--hang-s`), no traceback, exit status 130
(SIGINT) or 143 (SIGTERM) with exactly one line on stderr, or 0 when the command finished first; no
process of its group left; no temporary file left; the index opens with full verification and holds
either its documents before or after the command. A table per (command, signal, target), then one JSON
line last.

    python bench/bench_interrupts.py --runs 20
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

COMMANDS = ("index", "append", "merge", "delete")
COMBOS = tuple((sig, target) for sig in (signal.SIGINT, signal.SIGTERM) for target in ("main", "group"))
SHARD_TOKENS = 6000
WORDS = ("alpha", "beta", "gamma", "delta", "value", "index", "token", "shard", "corpus", "merge", "return", "self")


def make_inputs(root: Path, files: int = 24, lines: int = 400) -> Path:
    """Python-like text files made from a fixed seed (a few shards' worth of tokens)."""
    rnd = random.Random(44)
    folder = root / "inputs"
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        body = [f"def {rnd.choice(WORDS)}_{f}_{i}(x):\n    return x * {rnd.randint(0, 999)} + {rnd.choice(WORDS)}\n"
                for i in range(lines)]
        (folder / f"m{f:03d}.py").write_text("".join(body))
    return folder


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "suffixspec.cli", *args]


def command(name: str, index: Path, inputs: Path) -> list[str]:
    common_args = ["--shard-tokens", str(SHARD_TOKENS), "--jobs", "2"]
    if name == "index":
        return cli("index", str(inputs), "-o", str(index), "--tokenizer", "default", "--tag", "kind=new", *common_args)
    if name == "append":
        return cli("index", str(inputs), "-o", str(index), "--tokenizer", "default", "--append", "--tag", "kind=more",
                   *common_args)
    if name == "merge":
        return cli("merge", str(index), "-o", str(index), *common_args)
    return cli("delete", str(index), "--filter", "kind=base")


def env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def make_base(root: Path, inputs: Path) -> Path:
    base = root / "base.idx"
    subprocess.run(cli("index", str(inputs), "-o", str(base), "--tokenizer", "default", "--tag", "kind=base",
                       "--shard-tokens", str(SHARD_TOKENS), "--jobs", "1"),
                   check=True, env=env(), capture_output=True)
    return base


def handlers_ready(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    except (OSError, StopIteration):
        return False
    return bool(int(caught, 16) >> (signal.SIGTERM - 1) & 1)


def group_members(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                pids.append(int(entry))
    return pids


def index_state(path: Path):
    """(documents, deleted) of the index, fully verified; None when it does not open."""
    from suffixspec import CorpusIndex

    try:
        ix = CorpusIndex.open(path, verify=True)
    except Exception:  # noqa: BLE001 - any failure to open is the damage being counted
        return None
    return ix.n_documents, len(ix.deleted)


def start(argv):
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(), start_new_session=True)


def wait_ready(proc, limit_s: float = 120.0) -> float:
    t0 = time.monotonic()
    while not handlers_ready(proc.pid) and proc.poll() is None and time.monotonic() - t0 < limit_s:
        time.sleep(0.002)
    return time.monotonic()


def wait_forked(proc, limit_s: float = 120.0) -> float:
    """The moment the command's first worker process shows in its group (or it exits)."""
    t0 = time.monotonic()
    while len(group_members(proc.pid)) < 2 and proc.poll() is None and time.monotonic() - t0 < limit_s:
        pass  # (no sleep: the workers fork within a few milliseconds of each other)
    return time.monotonic()


def duration(name: str, work: Path, base: Path, inputs: Path) -> tuple[float, tuple]:
    """Seconds an uninterrupted run takes once its handlers are in place, and the index state after it."""
    index = work / "measure.idx"
    shutil.rmtree(index, ignore_errors=True)
    shutil.copytree(base, index)
    proc = start(command(name, index, inputs))
    ready = wait_ready(proc)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: exit {proc.returncode}: {err.decode(errors='replace')}")
    seconds = time.monotonic() - ready
    after = index_state(index)
    shutil.rmtree(index)
    return seconds, after


def run_one(name: str, sig: int, target: str, delay: float, work: Path, base: Path, inputs: Path, after: tuple,
            hang_s: float, from_fork: bool = False) -> dict:
    """One interrupted run, `delay` seconds after the handlers are in place (or, `from_fork`, after the
    first worker process appears: the pool's start-up, where a signal once left a worker behind)."""
    index = work / "run.idx"
    shutil.rmtree(index, ignore_errors=True)
    shutil.copytree(base, index)
    before = index_state(index)
    proc = start(command(name, index, inputs))
    moment = wait_ready(proc)
    if from_fork:
        moment = wait_forked(proc)
    time.sleep(max(0.0, moment + delay - time.monotonic()))
    t0 = time.monotonic()
    try:
        (os.killpg if target == "group" else os.kill)(proc.pid, sig)
    except ProcessLookupError:
        pass
    try:
        _, err = proc.communicate(timeout=hang_s)
        hang = False
    except subprocess.TimeoutExpired:
        hang = True
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    exit_s = time.monotonic() - t0
    time.sleep(0.05)  # (a killed worker's exit reaches /proc)
    survivors = group_members(proc.pid)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    text = err.decode(errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    leftovers = [str(p.relative_to(work)) for p in work.rglob("*.tmp")]
    state = index_state(index)
    interrupted = proc.returncode == 128 + sig
    outcome = {"command": name, "signal": signal.Signals(sig).name, "target": target, "delay_s": round(delay, 3),
               "exit": proc.returncode, "exit_s": round(exit_s, 3), "interrupted": interrupted, "hang": hang,
               "traceback": "Traceback" in text, "stderr_lines": len(lines), "survivors": len(survivors),
               "leftovers": leftovers, "damaged": state not in (before, after)}
    outcome["ok"] = (not hang and not outcome["traceback"] and not survivors and not leftovers
                     and not outcome["damaged"]
                     and ((interrupted and len(lines) == 1) or proc.returncode == 0))
    if not outcome["ok"]:
        outcome["stderr"] = text[-2000:]
    return outcome


def runs(plan, root: Path, hang_s: float = 5.0, log=None, files: int = 24, from_fork: bool = False) -> list[dict]:
    """`plan`: (command, signal, target, fraction of the command's run) tuples; the outcome of each
    (`from_fork`: the fraction counts from the first worker's appearance, see `run_one`)."""
    inputs = make_inputs(root, files)
    base = make_base(root, inputs)
    work = root / "work"
    work.mkdir(exist_ok=True)
    measured = {name: duration(name, work, base, inputs) for name in sorted({p[0] for p in plan})}
    out = []
    for name, sig, target, fraction in plan:
        seconds, after = measured[name]
        result = run_one(name, sig, target, fraction * seconds, work, base, inputs, after, hang_s, from_fork)
        result["run_s"] = round(seconds, 3)
        if log is not None:
            log(result)
        out.append(result)
    return out


def make_plan(per_combo: int, seed: int, commands=COMMANDS) -> list[tuple]:
    rnd = random.Random(seed)
    return [(name, sig, target, rnd.random()) for name in commands for sig, target in COMBOS for _ in range(per_combo)]


def table(results: list[dict]) -> list[dict]:
    rows = []
    for name in COMMANDS:
        for sig, target in COMBOS:
            group = [r for r in results if r["command"] == name and r["signal"] == signal.Signals(sig).name
                     and r["target"] == target]
            if not group:
                continue
            rows.append({"command": name, "signal": signal.Signals(sig).name, "target": target, "runs": len(group),
                         "interrupted": sum(r["interrupted"] for r in group),
                         "finished_first": sum(r["exit"] == 0 for r in group),
                         "hangs": sum(r["hang"] for r in group), "tracebacks": sum(r["traceback"] for r in group),
                         "extra_stderr": sum(r["interrupted"] and r["stderr_lines"] != 1 for r in group),
                         "survivors": sum(r["survivors"] for r in group),
                         "leftovers": sum(bool(r["leftovers"]) for r in group),
                         "damaged": sum(r["damaged"] for r in group),
                         "max_exit_s": max(r["exit_s"] for r in group), "run_s": group[0]["run_s"]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="runs per (command, signal, target) (default 20)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the moments drawn (default 0)")
    ap.add_argument("--hang-s", type=float, default=5.0, help="seconds after the signal that count as a hang (default 5)")
    common.add_record_flag(ap)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="suffixspec-interrupts-") as tmp:
        results = runs(make_plan(args.runs, args.seed), Path(tmp), args.hang_s,
                       log=lambda r: None if r["ok"] else print("FAILED:", json.dumps(r), file=sys.stderr))
    rows = table(results)
    cols = list(rows[0])
    print(" ".join(f"{c:>12}" for c in cols))
    for row in rows:
        print(" ".join(f"{row[c]!s:>12}" for c in cols))
    failed = sum(not r["ok"] for r in results)
    common.emit({"benchmark": "interrupts", "runs": len(results), "failed": failed, "rows": rows,
                 "failures": [r for r in results if not r["ok"]][:10]}, args, "interrupts")


if __name__ == "__main__":
    main()
