"""vLLM serving benchmark: plain decoding, vLLM's `ngram`, vLLM's `suffix` (arctic-inference, where
installed) and suffixspec's `SuffixSpecProposer`, on the shipped copy-heavy code-edit prompts.

Run it with the python of a venv that has vllm and suffixspec (`.ci/vllm.sh` makes one, at
$VLLM_VENV):

    $VLLM_VENV/bin/python bench/bench_vllm.py [--prompts 4] [--max-tokens 96] [--k 8] \
        [--methods plain,ngram,suffix,suffixspec,suffixspec+corpus] [--repeats 2] [--record [PATH]]

Each method runs in an engine process of its own (tests_vllm/engine.py), one after the other,
greedy, all prompts in one batch (`--max-num-seqs`, default the prompt count); the corpus variant
indexes corpora/python_stdlib.jsonl. Per method: generated tokens, generate() wall time (the best
of `--repeats`, engine start excluded), throughput, vLLM's spec-decode counters (drafts, draft
tokens, accepted tokens; accepted per draft = mean accepted length - 1), whether the outputs equal
plain decoding's, and for suffixspec its proposer's time per step. Prints a table, then one JSON
line last (`--record`: also appended to bench/results/vllm.jsonl with the date, host and git revision).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import common
import numpy as np

ROOT = common.ROOT
ENGINE = ROOT / "tests_vllm" / "engine.py"
METHODS = ("plain", "ngram", "suffix", "suffixspec", "suffixspec+corpus")


def run(request: dict, tmp: Path, timeout: float) -> dict:
    path = tmp / f"{request['runs'][0]['label']}.json"
    path.write_text(json.dumps(request))
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    env.setdefault("NUMBA_CACHE_DIR", str(Path(sys.prefix) / "numba-cache"))
    proc = subprocess.run([sys.executable, str(ENGINE), str(path)], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=str(ROOT))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise SystemExit(f"bench_vllm: the {request['runs'][0]['label']} engine failed (exit {proc.returncode}):\n{tail}")
    return json.loads(lines[-1][len("RESULT "):])[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-num-seqs", type=int, default=0, help="default: the prompt count")
    ap.add_argument("--timeout", type=float, default=900)
    common.add_record_flag(ap)
    args = ap.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise SystemExit(f"--methods: unknown {bad}; expected some of {list(METHODS)}")
    if importlib.util.find_spec("vllm") is None:
        raise SystemExit(f"bench_vllm: vllm is not installed in {sys.executable} (make a venv with .ci/vllm.sh)")

    from suffixspec import Document, build_index, load_tokenizer
    from suffixspec.models import default_model_dir

    tok = load_tokenizer()
    rows = [json.loads(line) for line in (common.CORPORA / "copy_edit_prompts.jsonl").read_text().splitlines() if line.strip()]
    prompts = [tok.encode(r["chatml"]) for r in rows[: args.prompts]]
    base = {"model": str(default_model_dir()), "prompts": prompts, "max_tokens": args.max_tokens, "max_model_len": 2048,
            "max_num_seqs": args.max_num_seqs or len(prompts), "stop_token_ids": [tok.eos_token_id], "repeats": args.repeats}
    results, skipped = {}, {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        corpus = None
        if "suffixspec+corpus" in methods:
            docs = [json.loads(line) for line in (common.CORPORA / "python_stdlib.jsonl").read_text().splitlines() if line.strip()]
            corpus = tmp / "stdlib.idx"
            build_index([Document(np.array(tok.encode(d["text"]), np.int32), id=d["id"]) for d in docs], corpus, tokenizer=tok)
        for m in methods:
            if m == "suffix" and importlib.util.find_spec("arctic_inference") is None:
                skipped[m] = "arctic-inference is not installed in this venv (vLLM's suffix method needs it)"
                continue
            spec = {"plain": {"method": "plain"}, "ngram": {"method": "ngram", "k": args.k},
                    "suffix": {"method": "suffix", "k": args.k}, "suffixspec": {"method": "suffixspec", "k": args.k},
                    "suffixspec+corpus": {"method": "suffixspec", "k": args.k, "suffixspec": {"corpus": [str(corpus)]}}}[m]
            results[m] = run({**base, "runs": [{**spec, "label": m}]}, tmp, args.timeout)
            print(f"# {m}: done", file=sys.stderr, flush=True)

    plain = results.get("plain")
    table = []
    for m, r in results.items():
        best = min(r["seconds"])
        st = r.get("proposer_stats") or {}
        row = {"method": m, "tokens": r["tokens"], "seconds": round(best, 3), "tok_per_s": round(r["tokens"] / best, 1),
               "speedup": round((plain and min(plain["seconds"]) / best) or 0.0, 3) if plain else None,
               "drafts": r["drafts"], "draft_tokens": r["draft_tokens"], "accepted": r["accepted"],
               "accepted_per_draft": round(r["accepted"] / r["drafts"], 3) if r["drafts"] else 0.0,
               "acceptance_rate": round(r["accepted"] / r["draft_tokens"], 3) if r["draft_tokens"] else 0.0,
               "identical_to_plain": (r["outputs"] == plain["outputs"]) if plain else None,
               "proposer_ms_per_step": round(1e3 * st["propose_seconds"] / st["steps"], 3) if st.get("steps") else None}
        table.append(row)
    head = ["method", "tokens", "seconds", "tok_per_s", "speedup", "drafts", "draft_tokens", "accepted",
            "accepted_per_draft", "acceptance_rate", "identical_to_plain", "proposer_ms_per_step"]
    widths = [max(len(h), *(len(str(r[h])) for r in table)) if table else len(h) for h in head]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for r in table:
        print("  ".join(str(r[h]).rjust(w) for h, w in zip(head, widths)))
    for m, why in skipped.items():
        print(f"{m}: skipped, {why}")
    common.emit({"bench": "vllm", "prompts": len(prompts), "max_tokens": args.max_tokens, "k": args.k,
                 "repeats": args.repeats, "results": table, "skipped": skipped}, args, "vllm")


if __name__ == "__main__":
    main()
