"""Response-cache upkeep: time per closed session against the tokens already cached.

For each size N (default 10k, 100k, 1M tokens): a proposer with the default cache
(`cache_tokens` 2**20 in 4 generations) is filled to N cached tokens of real text (standard
library modules through the default BPE tokenizer, `bench/_data.py`), added directly to the
cache in 4096-token documents; then `--sessions` sessions (a 64-token prompt, a 256-token output
taken further along the same text) are opened, extended and closed one after another and only
`close()` (where the output joins the cache) is timed, then one proposal of a bystander session
(what the next round of a server does while the upkeep may still run). Reports mean, p50 and max
ms per close and the bystander's p50 / max, per `--upkeep` mode: "inline" (`close` adds the output
itself) and "background" (`Proposer(cache_upkeep="background")`: `close` queues it for the upkeep
thread; the run ends with `wait_cache()`, timed as `drain_ms`). At 1M the cache is full and
rotating: the old cache's cost then depends on how full its live generation happens to be, so the
mean over the sessions is the figure to compare.

    python bench/bench_cache.py [--sizes 10000,100000,1000000] [--sessions 64] [--upkeep inline,background]
                                [--switch-interval MS] [--root DIR] [--record [PATH]]

`--switch-interval MS` sets the interpreter's thread switch interval (`sys.setswitchinterval`; 5 ms by
default): in the background mode, a bystander's proposal that needs the GIL while the upkeep thread
runs Python code waits at most about that interval.

`--root DIR` times the suffixspec of DIR instead (e.g. a worktree of an older commit), with the same
script: it runs again with DIR first on PYTHONPATH. Prints a table, then one JSON line last
(`--record`: also appended to bench/results/cache.jsonl with the date, host and the git revision of
the suffixspec timed).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import common


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--upkeep", default="inline,background", help="cache upkeep modes (an older --root: inline)")
    ap.add_argument("--switch-interval", type=float, default=None, help="ms (default: the interpreter's)")
    ap.add_argument("--root", default=None, help="time the suffixspec of this checkout (default: the one imported)")
    common.add_record_flag(ap)
    args = ap.parse_args(argv)
    if args.root is not None:
        return _rerun_from(Path(args.root).resolve(), sys.argv[1:] if argv is None else list(argv))
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval / 1e3)
    from _data import stdlib_token_stream

    import suffixspec
    from suffixspec import Proposer

    text = stdlib_token_stream()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for mode in args.upkeep.split(","):
        for n in sizes:
            prop = Proposer() if mode == "inline" else Proposer(cache_upkeep=mode)
            pos = 0
            while len(prop.cache) < n:
                take = min(4096, n - len(prop.cache))
                prop.cache.add(text[pos % len(text) : pos % len(text) + take])
                pos += take
            times, after = [], []
            warm = prop.start(text[:64])
            warm.propose(16)
            warm.close()
            bystander = prop.start(text[64:128])
            for _ in range(args.sessions):
                a = pos % (len(text) - 400)
                s = prop.start(text[a : a + 64])
                s.extend(text[a + 64 : a + 320])
                s.propose(16)
                t0 = time.perf_counter()
                s.close()
                t1 = time.perf_counter()
                bystander.propose(16)
                after.append(time.perf_counter() - t1)
                times.append(t1 - t0)
                pos += 320
            t0 = time.perf_counter()
            if mode != "inline":
                prop.wait_cache()
            drain = time.perf_counter() - t0
            ms, by = np.array(times) * 1e3, np.array(after) * 1e3
            rows.append({"upkeep": mode, "cached_tokens": n, "mean_ms": float(ms.mean()), "p50_ms": float(np.median(ms)),
                         "max_ms": float(ms.max()), "bystander_p50_ms": float(np.median(by)),
                         "bystander_max_ms": float(by.max()), "drain_ms": drain * 1e3, "cache_len": len(prop.cache)})
    print(f"suffixspec from {Path(suffixspec.__file__).parent}; thread switch interval {sys.getswitchinterval() * 1e3:g} ms")
    print(f"{'upkeep':>10} {'cached tokens':>14} {'mean ms/close':>14} {'p50':>8} {'max':>8} {'next proposal p50':>18} "
          f"{'max':>8} {'drain ms':>9}")
    for r in rows:
        print(f"{r['upkeep']:>10} {r['cached_tokens']:>14,} {r['mean_ms']:>14.3f} {r['p50_ms']:>8.3f} {r['max_ms']:>8.3f} "
              f"{r['bystander_p50_ms']:>18.3f} {r['bystander_max_ms']:>8.3f} {r['drain_ms']:>9.1f}")
    common.emit({"bench": "cache", "root": str(Path(suffixspec.__file__).resolve().parents[1]), "sessions": args.sessions,
                 "switch_interval_ms": sys.getswitchinterval() * 1e3, "rows": rows}, args, "cache")
    return 0


def _rerun_from(root: Path, argv: list[str]) -> int:
    """This script again, without `--root`, with `root` first on PYTHONPATH (so its suffixspec is imported)."""
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--root":
            skip = True
        elif not a.startswith("--root="):
            rest.append(a)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, __file__, *rest], env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main())
