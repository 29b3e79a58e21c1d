"""Predicted outputs through `suffixspec serve`: code edits with the original code as the prediction
(what a code editor sends) against the same requests without one, and plain decoding (budget 0).

    python bench/bench_http.py                                  # spawns `suffixspec serve` (default model)
    python bench/bench_http.py --url http://127.0.0.1:8000      # an already running server
    python bench/bench_http.py --prompts 12 --max-new-tokens 96 --concurrency 1,4 --repeat 2

Workload: corpora/copy_edit_prompts.jsonl (edit instructions over a stdlib function, one chat turn);
the prediction is the function's code (the ```python fence of the prompt). Requests stream through
/v1/chat/completions at temperature 0, closed loop at each concurrency; per request TTFT (first
content chunk), TPOT ((last chunk - first chunk) / (tokens - 1)) and `usage.suffixspec`. Every mode's
text is compared with plain decoding's (greedy: they must be equal). Prints a table, then one JSON line
(`--record [PATH]`: also appended to bench/results/http.jsonl with the date, host and git revision).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

import httpx

import common

MODES = ("plain", "speculative", "predicted")


def load_prompts(n: int) -> list[dict]:
    rows = [json.loads(line) for line in (common.CORPORA / "copy_edit_prompts.jsonl").read_text().splitlines()]
    out = []
    for r in rows[:n]:
        m = re.search(r"```python\n(.*?)```", r["prompt"], re.S)
        out.append({"id": r["id"], "prompt": r["prompt"], "code": m.group(1) if m else ""})
    return out


def body(row: dict, mode: str, model: str, max_new: int) -> dict:
    b = {"model": model, "messages": [{"role": "user", "content": row["prompt"]}], "max_tokens": max_new,
         "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if mode == "plain":
        b["suffixspec"] = {"budget": 0}
    if mode == "predicted":
        b["prediction"] = {"type": "content", "content": row["code"]}
    return b


async def one(http: httpx.AsyncClient, payload: dict) -> dict:
    t0 = time.perf_counter()
    first = last = None
    texts, use = [], None
    async with http.stream("POST", "/v1/chat/completions", json=payload) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                use = chunk["usage"]
            for ch in chunk.get("choices", []):
                piece = ch["delta"].get("content")
                if piece:
                    now = time.perf_counter()
                    first = first if first is not None else now
                    last = now
                    texts.append(piece)
    n = use["completion_tokens"]
    return {"text": "".join(texts), "tokens": n, "ttft_s": (first or t0) - t0,
            "tpot_s": (last - first) / (n - 1) if n > 1 and first is not None else 0.0,
            "e2e_s": time.perf_counter() - t0, "suffixspec": use.get("suffixspec", {}),
            "accepted_prediction": use.get("completion_tokens_details", {}).get("accepted_prediction_tokens", 0)}


async def run_mode(url: str, key: str | None, rows, mode, model, max_new, concurrency) -> tuple[list[dict], float]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    queue = list(enumerate(rows))
    results: list[dict | None] = [None] * len(rows)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600) as http:
        async def worker():
            while queue:
                i, row = queue.pop(0)
                results[i] = await one(http, body(row, mode, model, max_new))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return results, wall


def spawn(args) -> tuple[subprocess.Popen, str]:
    return common.spawn_server(args.model, args.max_batch, args.server_log)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="a running server (default: spawn suffixspec serve)")
    p.add_argument("--api-key", default=os.environ.get("SUFFIXSPEC_API_KEY"))
    p.add_argument("--model", default=None, help="--model for the spawned server / the served name with --url")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--concurrency", default="1,4")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--server-log", default="bench_http_server.log")
    common.add_record_flag(p)
    args = p.parse_args(argv)
    proc = None
    url = args.url
    if url is None:
        proc, url = spawn(args)
    try:
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        model = httpx.get(url + "/v1/models", headers=headers).json()["data"][0]["id"]
        rows = load_prompts(args.prompts)
        asyncio.run(run_mode(url, args.api_key, rows[:2], "speculative", model, 16, 2))  # warm-up
        report = []
        for c in [int(x) for x in args.concurrency.split(",")]:
            per_mode = {m: [] for m in MODES}
            walls = {m: [] for m in MODES}
            for _ in range(args.repeat):
                for mode in MODES:  # interleaved repeat by repeat: load drift hits every mode alike
                    res, wall = asyncio.run(run_mode(url, args.api_key, rows, mode, model, args.max_new_tokens, c))
                    per_mode[mode].append(res)
                    walls[mode].append(wall)
            plain_texts = [r["text"] for r in per_mode["plain"][0]]
            for mode in MODES:
                res = [r for rep in per_mode[mode] for r in rep]
                tokens = sum(r["tokens"] for r in res)
                rounds = sum(r["suffixspec"].get("rounds", 0) for r in res)
                tput = tokens / sum(walls[mode])
                mismatches = sum(r["text"] != t for rep in per_mode[mode] for r, t in zip(rep, plain_texts))
                report.append({"concurrency": c, "mode": mode, "requests": len(res),
                               "tpot_ms": 1e3 * statistics.median(r["tpot_s"] for r in res),
                               "ttft_ms": 1e3 * statistics.median(r["ttft_s"] for r in res),
                               "tokens_per_round": tokens / rounds if rounds else 0.0,
                               "accepted_prediction_tokens": sum(r["accepted_prediction"] for r in res),
                               "throughput_tok_s": tput, "greedy_mismatches": mismatches})
            base = next(r for r in report if r["concurrency"] == c and r["mode"] == "plain")
            for r in report:
                if r["concurrency"] == c:
                    r["speedup_vs_plain"] = r["throughput_tok_s"] / base["throughput_tok_s"]
        print(f"{'conc':>4} {'mode':<12} {'TPOT ms':>8} {'TTFT ms':>8} {'tok/round':>9} {'tok/s':>7} {'speed-up':>8}"
              f" {'pred acc':>8} {'mismatch':>8}")
        for r in report:
            print(f"{r['concurrency']:>4} {r['mode']:<12} {r['tpot_ms']:>8.1f} {r['ttft_ms']:>8.1f} "
                  f"{r['tokens_per_round']:>9.2f} {r['throughput_tok_s']:>7.1f} {r['speedup_vs_plain']:>7.2f}x"
                  f" {r['accepted_prediction_tokens']:>8} {r['greedy_mismatches']:>8}")
        common.emit({"bench": "http_predicted_outputs", "url": url, "model": model, "prompts": len(rows),
                     "max_new_tokens": args.max_new_tokens, "repeat": args.repeat, "results": report}, args, "http")
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
