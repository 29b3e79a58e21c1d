"""SIGINT and SIGTERM during `suffixspec index`, `index --append`, `merge` and `delete`, sent to the main
process alone or to its whole process group, at seeded random moments of each command's run (real
subprocesses; `bench/bench_interrupts.py` is the harness, and runs more of them): no hang, no
traceback, one line on stderr and exit status 130 / 143 (or 0 when the command finished first), no
worker left, no temporary file left, the index intact (its documents before or after the command)."""

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_harness():
    import sys

    sys.path.insert(0, str(BENCH))  # the harness imports its sibling `common`
    try:
        spec = importlib.util.spec_from_file_location("bench_interrupts", BENCH / "bench_interrupts.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_interrupted_writers_stop_cleanly(tmp_path):
    harness = load_harness()
    import random

    rnd = random.Random(2026)
    combos = harness.COMBOS
    # every command meets two of the four (signal, target) pairs, each pair twice in all
    plan = [(name, *combos[(i + k) % 4], rnd.random()) for i, name in enumerate(harness.COMMANDS) for k in (0, 2)]
    results = harness.runs(plan, tmp_path, hang_s=30.0, files=10)
    failures = [r for r in results if not r["ok"]]
    assert not failures, failures
    assert sum(r["interrupted"] for r in results if r["command"] != "delete") >= 4, results
