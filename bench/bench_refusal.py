"""An oversized prompt against a real `suffixspec serve`: how fast it is refused, what it does to the
server's memory, and what a normal request sent meanwhile sees.

    python bench/bench_refusal.py [--megabytes 20] [--repeats 3] [--threads 1] [--record [PATH]]

Two servers of the default model, one after the other: one with the default body limit (the prompt
is refused by size, 413) and one whose body limit admits it (`--max-body-bytes` above its size: it is
parsed, then refused before tokenizing because its characters cannot fit the context, 400). For each,
`--repeats` oversized requests: the time to the refusal (median and range), the server's resident
memory before and after (VmRSS), and the latency of a four-token completion sent while each
oversized request is in flight against the same request sent alone. Prints a table, then one JSON
line last (`--record`: also appended to bench/results/refusal.jsonl).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import common


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def small_request(client, url, model) -> float:
    t = time.perf_counter()
    r = client.post(url + "/v1/completions", json={"model": model, "prompt": "def add(a, b):", "max_tokens": 4,
                                                   "temperature": 0}, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - t


def measure(url, pid, body: bytes, repeats: int) -> dict:
    import httpx

    with httpx.Client() as client:
        model = client.get(url + "/v1/models").json()["data"][0]["id"]
        body = body.replace(b'"model": "m"', f'"model": "{model}"'.encode(), 1)
        alone = [small_request(client, url, model) for _ in range(repeats + 1)][1:]
        before = rss_mb(pid)
        refusals, statuses, beside = [], [], []
        for _ in range(repeats):
            result = {}

            def big():
                with httpx.Client() as c:
                    t = time.perf_counter()
                    r = c.post(url + "/v1/completions", content=body, timeout=600,
                               headers={"Content-Type": "application/json"})
                    result["s"], result["status"] = time.perf_counter() - t, r.status_code

            thread = threading.Thread(target=big)
            thread.start()
            beside.append(small_request(client, url, model))
            thread.join()
            refusals.append(result["s"])
            statuses.append(result["status"])
        after = rss_mb(pid)
    return {"status": sorted(set(statuses)), "refused_ms": 1e3 * statistics.median(refusals),
            "refused_ms_range": [1e3 * min(refusals), 1e3 * max(refusals)], "rss_before_mb": before,
            "rss_after_mb": after, "small_alone_ms": 1e3 * statistics.median(alone),
            "small_beside_ms": 1e3 * statistics.median(beside)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--megabytes", type=float, default=20.0, help="size of the oversized prompt (default 20)")
    p.add_argument("--repeats", type=int, default=3, help="oversized requests per server (default 3)")
    p.add_argument("--threads", type=int, default=1, help="the servers' torch threads (default 1)")
    common.add_record_flag(p)
    args = p.parse_args(argv)

    size = int(args.megabytes * 1e6)
    prompt = ("def f(x):\n    return x + 1\n" * (size // 27 + 1))[:size]
    body = ('{"model": "m", "max_tokens": 1, "prompt": "' + prompt.replace("\n", "\\n") + '"}').encode()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in (("default body limit", []), ("body limit above it", ["--max-body-bytes", str(2 * len(body))])):
            proc, url = common.spawn_server(None, 4, Path(tmp) / "server.log",
                                            extra=["--threads", str(args.threads), *extra])
            try:
                rows[name] = measure(url, proc.pid, body, args.repeats)
            finally:
                proc.terminate()
                proc.wait(timeout=120)
    print(f"a {len(body) / 1e6:.1f} MB completion request, {args.repeats} times per server")
    print(f"{'server':<22} {'status':>8} {'refused ms':>18} {'RSS MB before/after':>20} {'4-token request ms alone/beside':>32}")
    for name, r in rows.items():
        lo, hi = r["refused_ms_range"]
        print(f"{name:<22} {','.join(map(str, r['status'])):>8} {r['refused_ms']:>7.1f} [{lo:.1f}-{hi:.1f}] "
              f"{r['rss_before_mb']:>9.0f} / {r['rss_after_mb']:<8.0f} {r['small_alone_ms']:>14.0f} / {r['small_beside_ms']:<14.0f}")
    common.emit({"body_mb": len(body) / 1e6, "repeats": args.repeats, "servers": rows}, args, "refusal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
