"""llama.cpp's own server (`llama-server`) as a benchmark peer of bench/bench_llama_cpp.py: plain decoding
and its model-free drafting modes (`--spec-type ngram-simple | ngram-map-k | ngram-map-k4v | ngram-mod |
ngram-cache`, each at that build's defaults, and ngram-simple / ngram-map-k with 3-gram lookups and
drafts of at most 10 tokens, our cap: `MODES`), over its HTTP API on loopback.

One server process per mode, all with the same settings (threads, context, batch, one slot, no prompt
cache kept in RAM); each request is a `/completion` of the prompt's token ids (the same ids the
llama-cpp-python arms get), greedy (`top_k` 1, temperature 0), `cache_prompt` off (every request
prefills its whole prompt, as the llama-cpp-python arms do after `reset()`). The servers are started
afresh for each repeat (an n-gram mode's state then holds that repeat's earlier requests only, as
ours holds that repeat's earlier responses) and get one untimed warm-up request each.

Per request: generated tokens, wall time of the HTTP request (prefill included), the server's own
`timings` (`draft_n`, `draft_n_accepted` where it drafted) and the generated text.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
from pathlib import Path

import common

# mode -> its flags: the --spec-type values at that build's defaults (lookup 12-grams, drafts up to 48
# tokens; ngram-mod 24 / 48-64), and two at our draft cap (lookup 3-grams, drafts up to 10 tokens)
MODES = {"plain": [], **{m: ["--spec-type", m] for m in ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")},
         "ngram-simple-n3m10": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "10"],
         "ngram-map-k-n3m10": ["--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-n", "3", "--spec-ngram-map-k-size-m", "10"]}
ENV = "SUFFIXSPEC_LLAMA_SERVER"


def find(given: str | None) -> tuple[str | None, str]:
    """(the llama-server binary, '') or (None, why it is not used)."""
    path = common.given(given, ENV)
    if path is None:
        return None, f"llama-server arm skipped: no binary given (pass --llama-server PATH or set {ENV})"
    if not (Path(path).is_file() and os.access(path, os.X_OK)):
        return None, f"llama-server arm skipped: {path} is not an executable file"
    return path, ""


def command(binary: str, model: str, mode: str, port: int, args) -> list[str]:
    cmd = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads),
           "-tb", str(args.threads), "-c", str(args.n_ctx), "-b", str(args.n_batch), "-np", "1",
           "--cache-ram", "0", "--no-webui"]
    return cmd + MODES[mode]


class Servers:
    """One running llama-server per mode (context manager: every process is stopped on exit)."""

    def __init__(self, binary: str, model: str, modes, args, logs: Path):
        self.procs: dict[str, subprocess.Popen] = {}
        self.urls: dict[str, str] = {}
        self.args = (binary, model, tuple(modes), args, logs)

    def __enter__(self):
        binary, model, modes, args, logs = self.args
        try:
            for mode in modes:
                port = common.free_port()
                log = logs / f"llama-server-{mode}.log"
                self.procs[mode] = subprocess.Popen(command(binary, model, mode, port, args), stdout=subprocess.DEVNULL,
                                                    stderr=open(log, "wb"))
                self.urls[mode] = wait_healthy(self.procs[mode], port, log)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def wait_healthy(proc: subprocess.Popen, port: int, log: Path, timeout: float = 300) -> str:
    """The server's URL once its `/health` answers 200; exits naming `log` if it dies or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited ({proc.returncode}); see {log}")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return f"http://127.0.0.1:{port}"
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.3)
    raise SystemExit(f"llama-server was not healthy within {timeout:.0f} s; see {log}")


def complete(url: str, ids: list[int], max_new: int) -> dict:
    """One greedy `/completion` of `ids`: tokens, seconds (wall), evals, drafted, accepted, text."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": ids, "n_predict": max_new, "temperature": 0.0, "top_k": 1, "seed": 0,
                       "cache_prompt": False, "stream": False, "return_tokens": True})
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        seconds = time.perf_counter() - t0
    finally:
        conn.close()
    if resp.status != 200:
        raise SystemExit(f"llama-server at {url}: /completion answered {resp.status}: {data[:300]!r}")
    out = json.loads(data)
    timings = out.get("timings", {})
    n = int(out.get("tokens_predicted", timings.get("predicted_n", 0)))
    accepted = int(timings.get("draft_n_accepted", 0))
    # the prefill yields the first token; every later evaluation one token plus the drafts it accepts
    return {"tokens": n, "seconds": seconds, "evals": max(n - accepted, 1), "drafted": int(timings.get("draft_n", 0)),
            "accepted": accepted, "text": out.get("content", ""), "ids": list(out.get("tokens") or []),
            "prompt_n": int(timings.get("prompt_n", 0))}
