"""A soak of the HTTP server: thousands of requests at a fixed concurrency through a real
`suffixspec serve` process, then its memory, its error count and a sample of its outputs checked.

The requests (fixed by `--seed`) mix completions and chat, streams and non-streams, prompt lengths
(one to a dozen snippets: up to ~200 tokens) and output lengths (1 to 48 tokens), all greedy; every tenth request
is a stream the client drops after its first chunk (a cancellation: the engine must free the slot).
`--concurrency` clients take the requests in order. The first `--warmup` requests warm the server up;
its resident memory (VmRSS) is read then and again at the end. A sample of the completed requests is
sent again one at a time at the end: the outputs must be identical to those under load.

Checked: 0 errors (any status but 200, a stream without ``[DONE]``, a broken connection; a dropped
stream is a cancellation, not an error); the server's own count of cancelled requests equals the
drops; the sample identical; the server healthy and its log free of tracebacks. Bounded by
`--limit-s` (requests not started by then are skipped and reported). A table, then one JSON line
last (``--record``: ``bench/results/soak.jsonl``).

    python bench/bench_soak.py                      # 5,000 requests at concurrency 32, the tests' tiny model
    python bench/bench_soak.py --model DIR --requests 1000

The default model is the HTTP tests' tiny random Qwen2 (`tests/support/http.make_tiny_model_dir`),
built in a temporary folder: the soak tests the server, not a model's speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import common

TESTS = common.ROOT / "tests"
LINES = ("def total(values):\n    return sum(values)\n", "class Node:\n    def __init__(self, left, right):\n",
         "for i in range(10):\n    print(i * i)\n", "    if value is None:\n        return 0\n",
         "import os\nimport sys\n", "result = [x + 1 for x in items]\n")


@dataclass(frozen=True)
class Job:
    index: int
    chat: bool
    stream: bool
    cancel: bool  # a stream dropped after its first chunk
    prompt: str
    max_tokens: int

    def body(self, model: str) -> dict:
        body = {"model": model, "max_tokens": self.max_tokens, "temperature": 0, "stream": self.stream}
        if self.cancel:
            body["suffixspec"] = {"budget": 0}  # one token a round: surely still running when dropped
        if self.chat:
            body["messages"] = [{"role": "user", "content": self.prompt}]
        else:
            body["prompt"] = self.prompt
        return body

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.chat else "/v1/completions"


def make_jobs(n: int, seed: int) -> list[Job]:
    rnd = random.Random(seed)
    jobs = []
    for i in range(n):
        cancel = i % 10 == 9
        lines = rnd.choice((1, 2, 4, 8, 12))  # within the tiny model's 512 positions, with 200 new
        prompt = "".join(rnd.choice(LINES) for _ in range(lines))
        max_tokens = 200 if cancel else rnd.choice((1, 4, 8, 16, 32, 48))
        jobs.append(Job(i, chat=not cancel and rnd.random() < 0.3, stream=cancel or rnd.random() < 0.5,
                        cancel=cancel, prompt=prompt, max_tokens=max_tokens))
    return jobs


async def send(http, job: Job, model: str) -> dict:
    """One request: {"outcome": ok | cancelled | error, "text", "seconds", "error"}."""
    t0 = time.monotonic()
    try:
        if not job.stream:
            r = await http.post(job.path, json=job.body(model))
            if r.status_code != 200:
                return {"outcome": "error", "error": f"{r.status_code} {r.text[:200]}"}
            choice = r.json()["choices"][0]
            text = choice["message"]["content"] if job.chat else choice["text"]
            return {"outcome": "ok", "text": text, "seconds": time.monotonic() - t0}
        parts = []
        async with http.stream("POST", job.path, json=job.body(model)) as r:
            if r.status_code != 200:
                await r.aread()
                return {"outcome": "error", "error": f"{r.status_code} {r.text[:200]}"}
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    return {"outcome": "ok", "text": "".join(parts), "seconds": time.monotonic() - t0}
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return {"outcome": "error", "error": json.dumps(chunk)[:200]}
                if not chunk["choices"]:
                    continue  # a usage chunk
                c = chunk["choices"][0]
                parts.append((c.get("delta") or {}).get("content") or "" if job.chat else c["text"])
                if job.cancel:
                    return {"outcome": "cancelled", "seconds": time.monotonic() - t0}  # leaving closes the stream
        return {"outcome": "error", "error": "stream ended without [DONE]"}
    except Exception as exc:  # noqa: BLE001 - every failure is counted, none stops the soak
        return {"outcome": "error", "error": f"{type(exc).__name__}: {exc}"[:200]}


async def run_jobs(url: str, model: str, jobs: list[Job], concurrency: int, deadline: float,
                   headers: dict | None = None) -> list[dict | None]:
    """`concurrency` clients taking `jobs` in order; a job not started by `deadline` stays None."""
    import httpx

    results: list[dict | None] = [None] * len(jobs)
    queue = iter(range(len(jobs)))
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits, headers=headers or {}) as http:
        async def client():
            for i in queue:
                if time.monotonic() > deadline:
                    return
                results[i] = await send(http, jobs[i], model)

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return results


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS")).split()[1])


def _sample_rss(pid: int, out: list, done: threading.Event, t0: float, every_s: float = 5.0) -> None:
    """[seconds, MB] of the server's RSS every `every_s` seconds until `done`."""
    while not done.wait(every_s):
        out.append([round(time.monotonic() - t0, 1), round(rss_kb(pid) / 1024, 1)])


def cancelled_count(url: str, headers: dict | None = None) -> float:
    import httpx

    text = httpx.get(url + "/metrics", headers=headers or {}, timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("suffixspec_requests_finished_total{") and 'reason="cancelled"' in line)


def soak(url: str, pid: int, model: str, n: int = 5000, concurrency: int = 32, warmup: int = 500,
         sample: int = 50, limit_s: float = 600.0, seed: int = 0) -> dict:
    """Run the soak against a served `url` (server process `pid`); the figures as a dict."""
    jobs = make_jobs(n, seed)
    t0 = time.monotonic()
    deadline = t0 + limit_s
    cancelled_before = cancelled_count(url)
    first = asyncio.run(run_jobs(url, model, jobs[:warmup], concurrency, deadline))
    rss_start = rss_kb(pid)
    t1 = time.monotonic()
    timeline, done_event = [], threading.Event()
    sampler = threading.Thread(target=_sample_rss, args=(pid, timeline, done_event, t1), daemon=True)
    sampler.start()
    rest = asyncio.run(run_jobs(url, model, jobs[warmup:], concurrency, deadline))
    t2 = time.monotonic()
    done_event.set()
    sampler.join()
    results = first + rest
    drops = sum(r is not None and r["outcome"] == "cancelled" for r in results)
    server_cancelled = cancelled_count(url) - cancelled_before
    for _ in range(100):  # a drop reaches the engine a moment after the client left
        if server_cancelled >= drops:
            break
        time.sleep(0.05)
        server_cancelled = cancelled_count(url) - cancelled_before
    rss_end = rss_kb(pid)
    done = [i for i, r in enumerate(results) if r is not None and r["outcome"] == "ok"]
    picks = done[:: max(1, len(done) // sample)][:sample]
    again = asyncio.run(run_jobs(url, model, [jobs[i] for i in picks], 1, time.monotonic() + limit_s))
    mismatched = [i for i, r in zip(picks, again) if r is None or r.get("text") != results[i]["text"]]
    errors = [r["error"] for r in results if r is not None and r["outcome"] == "error"]
    seconds = [r["seconds"] for r in results if r is not None and r["outcome"] == "ok"]
    return {"requests": n, "concurrency": concurrency, "started": sum(r is not None for r in results),
            "completed": len(done), "cancelled": drops, "server_cancelled": int(server_cancelled),
            "errors": len(errors), "error_examples": errors[:5],
            "streams": sum(j.stream and not j.cancel for j in jobs), "chat": sum(j.chat for j in jobs),
            "rss_kb_after_warmup": rss_start, "rss_kb_end": rss_end,
            "rss_growth": round(rss_end / rss_start - 1, 4) if rss_start else None,
            "rss_mb_timeline": timeline,
            "sample": len(picks), "sample_mismatched": mismatched,
            "latency_s_p50": round(statistics.median(seconds), 4) if seconds else None,
            "latency_s_max": round(max(seconds), 4) if seconds else None,
            "warmup_s": round(t1 - t0, 1), "soak_s": round(t2 - t1, 1),
            "requests_per_s": round((len(results) - warmup) / (t2 - t1), 1) if t2 > t1 else None}


def start_server(model_dir: Path, log: Path, max_batch: int) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return common.spawn_server(model_dir, max_batch, log, env=env)


def tiny_model_dir(root: Path) -> Path:
    """The HTTP tests' tiny model."""
    return common.load_test_support("http").make_tiny_model_dir(root / "tiny")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model directory (default: the HTTP tests' tiny random model)")
    ap.add_argument("--requests", type=int, default=5000, help="requests in all (default 5000)")
    ap.add_argument("--concurrency", type=int, default=32, help="clients at once (default 32)")
    ap.add_argument("--warmup", type=int, default=500, help="requests before the first memory reading (default 500)")
    ap.add_argument("--sample", type=int, default=50, help="requests sent again one at a time (default 50)")
    ap.add_argument("--max-batch", type=int, default=8, help="the server's --max-batch (default 8)")
    ap.add_argument("--limit-s", type=float, default=600.0, help="no request starts after this (default 600)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the request mix (default 0)")
    common.add_record_flag(ap)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="suffixspec-soak-") as tmp:
        root = Path(tmp)
        model_dir = Path(args.model) if args.model else tiny_model_dir(root)
        log = root / "server.log"
        proc, url = start_server(model_dir, log, args.max_batch)
        try:
            model = __import__("httpx").get(url + "/v1/models").json()["data"][0]["id"]
            out = soak(url, proc.pid, model, args.requests, args.concurrency, args.warmup, args.sample,
                       args.limit_s, args.seed)
            out["healthy_after"] = __import__("httpx").get(url + "/health").status_code == 200
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
        text = log.read_text(errors="replace")
        out.update(exit_status=code, log_tracebacks=text.count("Traceback"), log_errors=text.count(" ERROR "),
                   model="tests' tiny random Qwen2" if not args.model else args.model, max_batch=args.max_batch,
                   loadavg=Path("/proc/loadavg").read_text().strip())
    for key in ("requests", "started", "completed", "cancelled", "server_cancelled", "errors", "streams", "chat",
                "rss_kb_after_warmup", "rss_kb_end", "rss_growth", "rss_mb_timeline", "sample", "sample_mismatched", "latency_s_p50",
                "latency_s_max", "warmup_s", "soak_s", "requests_per_s", "healthy_after", "exit_status",
                "log_tracebacks", "log_errors"):
        print(f"{key:22} {out[key]}")
    common.emit({"benchmark": "soak", **out}, args, "soak")


if __name__ == "__main__":
    main()
