"""vLLM serving benchmark: plain decoding, vLLM's `ngram`, vLLM's `suffix` (SuffixDecoding from
arctic-inference, where installed) and suffixspec's `SuffixSpecProposer` (`custom_class`), without
and with a corpus, in the same real vLLM engine, on three workloads and a grid of batch sizes and
draft-length caps; and a clairvoyant drafter (`clairvoyant`, bench/_vllm_clairvoyant.py) that drafts
plain decoding's own outputs of the same cell and round: every draft accepted, so its accepted tokens
and throughput are the ceiling any drafter can reach at that cap in this engine.

Run it with the python of a venv that has vllm (and arctic-inference for `suffix`; `.ci/vllm.sh`
makes one at $VLLM_VENV, ../shared/BRIEF.md §4 says how to build arctic-inference into it):

    $VLLM_VENV/bin/python bench/bench_vllm.py [--workloads code-edit,spec-bench,multi-turn] \
        [--cells 8x8,1x8,32x8,8x24] [--methods plain,ngram,suffix,suffixspec,suffixspec+corpus,clairvoyant] \
        [--prompts 24] [--max-tokens 128] [--rounds 2] [--lock /tmp/suffixspec-bench.lock] [--record [PATH]]

Workloads (token prompts in ChatML, the template of the embedded SmolLM2 and of Qwen2.5-Coder; `--model GGUF` runs another model):
- `code-edit`: the 12 shipped code-edit prompts (corpora/copy_edit_prompts.jsonl), then the held-out
  ones (copy_edit_heldout.jsonl) up to `--prompts`;
- `spec-bench`: Spec-Bench dev prompts (--specbench PATH, $SUFFIXSPEC_SPECBENCH or ../shared/data/specbench-dev.jsonl),
  first turns, a third each of chat (MT-bench categories), `qa` and `summarization`, taken in file
  order;
- `multi-turn`: held-out code edits not used by `code-edit` (from the end of the file), each a
  conversation continued in a second turn that asks for the same function again with type hints
  (`followups` of tests_vllm/engine.py: the second turns run after the first in the same engine,
  so the answers are past responses by then). Throughput counts both turns.

Cells `SEQSxCAP`: vLLM's `max_num_seqs` and the draft-length cap (`num_speculative_tokens`, for
every method). Every (workload, cell, method) runs in an engine process of its own (one engine per
process), greedy, all prompts submitted at once; `--rounds` repeats the whole grid, interleaved
(each round runs every method of a cell one after the other, in an order rotated by round), so
ratios are taken between neighbouring runs; the table shows medians and the range over rounds.
Each engine first generates two short unrelated warm-up prompts (not timed, not counted). With
`--lock`, each engine process holds an exclusive flock on that file while it runs (so timed runs of
others on the host wait, and theirs are not overlapped by ours).

Plugins: arctic-inference registers a vLLM general plugin (`arctic_inference`) that patches vLLM when
ARCTIC_INFERENCE_ENABLED is set; every engine here runs with VLLM_PLUGINS naming every installed
general plugin except it (vLLM's `suffix` method imports arctic-inference's cache directly and needs
no plugin), so all methods run on unpatched vLLM; the output says so.

Per row: accepted tokens, drafted tokens, acceptance rate (vLLM's spec-decode counters), generated
tokens, throughput (generated tokens / generate() wall time, engine start excluded), the ratio to
plain and to `suffix` (median over rounds, with min-max), the drafter's `propose` time per call and
the engine's step time (timed in the engine process around vLLM's drafter and model runner, same
for every method), and whether the outputs equal plain decoding's in the same cell and round.
Prints a table, then one JSON line last (`--record`: also appended to bench/results/vllm.jsonl with
the date, host and git revision).
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import importlib.metadata
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import common

ROOT = common.ROOT
ENGINE = ROOT / "tests_vllm" / "engine.py"
METHODS = ("plain", "ngram", "suffix", "suffixspec", "suffixspec+corpus", "clairvoyant")
WORKLOADS = ("code-edit", "spec-bench", "multi-turn")
# $SUFFIXSPEC_SPECBENCH, else the shared data beside the checkout (../shared from the project's root)
SPECBENCH = Path(os.environ.get(common.SPECBENCH_ENV) or common.SPECBENCH_DEFAULT)
CHAT_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
FOLLOWUP = "Now also add type hints to every parameter and the return value. Return the full function again."
WARMUP = ["What is the capital of France?", "Write a haiku about the sea."]
PLUGIN_EXCLUDED = "arctic_inference"


def specbench_rows(path: Path, n: int) -> list[dict]:
    """`n` Spec-Bench rows, a third each of chat, qa and summarization (file order within each)."""
    rows = common.read_jsonl(path)
    groups = {"chat": [r for r in rows if r["category"] in CHAT_CATEGORIES],
              "qa": [r for r in rows if r["category"] == "qa"],
              "summarization": [r for r in rows if r["category"] == "summarization"]}
    out = []
    for i in range(n):
        group = groups[("chat", "qa", "summarization")[i % 3]]
        out.append(group[i // 3])
    return out


def workloads(tok, names: list[str], n: int, specbench: Path) -> dict:
    """name -> {"prompts": [[ids]...], "followups": [[ids]...] (multi-turn only), "source": str}."""
    from suffixspec.bench.workloads import chatml

    shipped = common.read_jsonl(common.CORPORA / "copy_edit_prompts.jsonl")
    heldout = common.read_jsonl(common.CORPORA / "copy_edit_heldout.jsonl")
    out = {}
    if "code-edit" in names:
        rows = (shipped + heldout)[:n]
        out["code-edit"] = {"prompts": [tok.encode(r["chatml"]) for r in rows],
                            "source": f"{len(rows)} code edits: copy_edit_prompts.jsonl + copy_edit_heldout.jsonl"}
    if "spec-bench" in names:
        if not specbench.is_file():
            raise SystemExit(f"bench_vllm: no Spec-Bench prompts at {specbench} (pass --specbench PATH)")
        rows = specbench_rows(specbench, n)
        out["spec-bench"] = {"prompts": [tok.encode(chatml(r["turns"][0])) for r in rows],
                             "source": f"{len(rows)} Spec-Bench dev prompts (chat, qa, summarization) from {specbench.name}"}
    if "multi-turn" in names:
        used = max(0, n - len(shipped))
        rows = heldout[used:][-n:] if len(heldout) - used >= 1 else heldout[-n:]
        tail = tok.encode(f"<|im_end|>\n<|im_start|>user\n{FOLLOWUP}<|im_end|>\n<|im_start|>assistant\n")
        out["multi-turn"] = {"prompts": [tok.encode(r["chatml"]) for r in rows], "followups": [tail] * len(rows),
                             "source": f"{len(rows)} held-out code edits, each continued by a second turn"}
    return out


def plugins_without_arctic() -> str:
    """VLLM_PLUGINS: every installed vLLM general plugin but arctic-inference's."""
    names = sorted({ep.name for ep in importlib.metadata.entry_points(group="vllm.general_plugins")} - {PLUGIN_EXCLUDED})
    return ",".join(names)


def run_engine(request: dict, tmp: Path, timeout: float, lock: str | None, plugins: str, threads: int = 0,
               extra_env: dict | None = None) -> dict:
    """One engine process (tests_vllm/engine.py) on `request`; its one result."""
    label = request["runs"][0]["label"]
    path = tmp / "request.json"
    path.write_text(json.dumps(request))
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_PLUGINS=plugins, **(extra_env or {}),
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("ARCTIC_INFERENCE_ENABLED", None)
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), VLLM_CPU_OMP_THREADS_BIND="nobind")
    env.setdefault("NUMBA_CACHE_DIR", str(Path(sys.prefix) / "numba-cache"))
    handle = open(lock, "a") if lock else None
    try:
        if handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
        proc = subprocess.run([sys.executable, str(ENGINE), str(path)], capture_output=True, text=True, env=env,
                              timeout=timeout, cwd=str(ROOT))
    finally:
        if handle:
            handle.close()
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise SystemExit(f"bench_vllm: the {label} engine failed (exit {proc.returncode}):\n{tail}")
    return json.loads(lines[-1][len("RESULT "):])[0]


def method_spec(method: str, k: int, corpus: Path | None) -> dict:
    if method == "suffixspec+corpus":
        return {"method": "suffixspec", "k": k, "suffixspec": {"corpus": [str(corpus)]}}
    return {"method": method, "k": k}


def parse_cells(text: str) -> list[tuple[int, int]]:
    cells = []
    for part in filter(None, text.split(",")):
        try:
            seqs, cap = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--cells: expected SEQSxCAP items such as 8x8, got {part!r}") from None
        if seqs < 1 or cap < 1:
            raise SystemExit(f"--cells: max_num_seqs and the cap must be positive, got {part!r}")
        cells.append((seqs, cap))
    return cells


def known_outputs(wl: dict, outputs: list[list[int]], stop: int) -> list[list[list[int]]]:
    """[[prompt ids, plain's output ids], ...] for every prompt the engine generates for workload
    `wl` (second turns by the engine's own `second_turn`), for the clairvoyant drafter."""
    spec = importlib.util.spec_from_file_location("suffixspec_bench_engine", ENGINE)
    engine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine)  # stdlib imports and the engine's env defaults only
    prompts = [list(p) for p in wl["prompts"]]
    pairs = [[p, o] for p, o in zip(prompts, outputs)]
    for p, o, f, o2 in zip(prompts, outputs, wl.get("followups") or [], outputs[len(prompts):]):
        pairs.append([engine.second_turn(p, o, f, {stop}), o2])
    return pairs


def rotated(methods: list[str], rnd: int) -> list[str]:
    """The round's method order: rotated by round, the clairvoyant drafter right after plain (it
    drafts plain's outputs of the same cell and round)."""
    order = [m for m in methods[rnd % len(methods):] + methods[: rnd % len(methods)] if m != "clairvoyant"]
    if "clairvoyant" in methods:
        order.insert(order.index("plain") + 1, "clairvoyant")
    return order


def run_grid(args, data: dict, cells, methods, corpus, tmp: Path, plugins: str) -> list[dict]:
    """Every run: {"workload", "seqs", "cap", "round", "method", **engine result}."""
    runs = []
    warm = None
    for rnd in range(args.rounds):
        for seqs, cap in cells:
            for name, wl in data.items():
                env = {}
                for m in rotated(methods, rnd):
                    if m == "clairvoyant":
                        known = tmp / "clairvoyant.json"
                        known.write_text(json.dumps(known_outputs(wl, runs[-1]["outputs"], args.eos)))
                        env = {"SUFFIXSPEC_CLAIRVOYANT": str(known)}
                    base = {"model": args.model, "prompts": wl["prompts"], "max_tokens": args.max_tokens,
                            "max_model_len": 2048, "max_num_seqs": seqs, "stop_token_ids": [args.eos], "repeats": 1,
                            "warmup_prompts": args.warmup}
                    if wl.get("followups"):
                        base["followups"] = wl["followups"]
                    t0 = time.perf_counter()
                    r = run_engine({**base, "runs": [{**method_spec(m, cap, corpus), "label": m}]}, tmp, args.timeout,
                                   args.lock, plugins, args.threads, env if m == "clairvoyant" else None)
                    runs.append({"workload": name, "seqs": seqs, "cap": cap, "round": rnd, **r})
                    warm = time.perf_counter() - t0
                    print(f"# round {rnd} {name} {seqs}x{cap} {m}: {r['tokens']} tokens in {r['seconds'][0]:.2f} s "
                          f"({warm:.0f} s with the engine's start and the lock); accepted {r['accepted']} of "
                          f"{r['draft_tokens']} drafted", file=sys.stderr, flush=True)
    return runs


def _ratio_stats(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def _profile(rs: list[dict]) -> dict:
    """Mean forward-pass ms by tokens scheduled (buckets of powers of two), over the runs' steps of the
    most common row count."""
    cells = {}
    for run in rs:
        for key, (n, sec) in run.get("step_profile", {}).items():
            rows, tokens = (int(v) for v in key.split(":"))
            cells.setdefault(rows, {}).setdefault(1 << max(0, tokens - 1).bit_length(), []).append((n, sec))
    if not cells:
        return {}
    rows = max(cells, key=lambda b: sum(n for v in cells[b].values() for n, _ in v))
    return {"rows": rows, **{f"<={t}": round(1e3 * sum(sec for _, sec in v) / sum(n for n, _ in v), 1)
                             for t, v in sorted(cells[rows].items())}}


def summarize(runs: list[dict]) -> list[dict]:
    """One row per (workload, cell, method): medians over rounds, ratios to plain and suffix per round."""
    by = {}
    for r in runs:
        by.setdefault((r["workload"], r["seqs"], r["cap"]), {}).setdefault(r["label"], []).append(r)
    rows = []
    for (wl, seqs, cap), per in by.items():
        def tps(run):
            return run["tokens"] / sum(run["seconds"])

        ref = {name: {x["round"]: x for x in per.get(name, [])} for name in ("plain", "suffix", "ngram")}
        for m, rs in per.items():
            row = {"workload": wl, "seqs": seqs, "cap": cap, "method": m, "rounds": len(rs), "tokens": rs[0]["tokens"],
                   "tok_per_s": round(statistics.median(tps(x) for x in rs), 1),
                   "tok_per_s_runs": [round(tps(x), 1) for x in rs],
                   "accepted": rs[0]["accepted"], "draft_tokens": rs[0]["draft_tokens"], "drafts": rs[0]["drafts"],
                   "acceptance_rate": round(rs[0]["accepted"] / rs[0]["draft_tokens"], 3) if rs[0]["draft_tokens"] else 0.0,
                   "propose_ms": round(1e3 * sum(x["propose_seconds"] for x in rs) / max(1, sum(x["propose_calls"] for x in rs)), 3)
                   if any(x["propose_calls"] for x in rs) else None,
                   "step_ms": round(1e3 * sum(sum(x["seconds"]) for x in rs) / max(1, sum(x["steps"] for x in rs)), 2),
                   "identical_to_plain": all(x["outputs"] == ref["plain"][x["round"]]["outputs"] for x in rs
                                             if x["round"] in ref["plain"]) if ref["plain"] else None,
                   "counts_vary": len({(x["accepted"], x["draft_tokens"]) for x in rs}) > 1}
            st = rs[0].get("proposer_stats") or {}
            if "expected_accepted" in st:  # what the drafts' scores promised, against what vLLM accepted
                row["expected_accepted"] = round(st["expected_accepted"], 1)
            if rs[-1].get("step_profile"):
                row["step_profile_ms"] = _profile(rs)
            if rs[-1].get("step_trace") and len(rs[-1]["step_trace"]) >= 5:  # the engine's step line (bench_vllm_replay)
                from bench_vllm_replay import fit_step_clock

                line = fit_step_clock([s for x in rs for s in x.get("step_trace") or []])
                row["step_line"] = {k: float(f"{v:.4g}") for k, v in dataclasses.asdict(line).items()}
            if rs[-1].get("step_cost"):
                row["learned_step_cost"] = rs[-1]["step_cost"].get("relative_by_batch")
            for name in ("plain", "suffix", "ngram"):
                ratios = [tps(x) / tps(ref[name][x["round"]]) for x in rs if x["round"] in ref[name]]
                if ratios:
                    row[f"x_{name}"] = _ratio_stats(ratios)
            if ref["suffix"] and rs[0]["round"] in ref["suffix"]:
                acc = ref["suffix"][rs[0]["round"]]["accepted"]
                row["accepted_x_suffix"] = round(rs[0]["accepted"] / acc, 3) if acc else None
            rows.append(row)
    return rows


def targets(rows: list[dict]) -> dict:
    """The issue's targets at max_num_seqs 8, cap 8, from the medians over rounds (None: not measured)."""
    def get(wl, m, seqs=8, cap=8):
        return next((r for r in rows if (r["workload"], r["method"], r["seqs"], r["cap"]) == (wl, m, seqs, cap)), None)

    out = {}
    for wl, need in (("code-edit", 1.1), ("spec-bench", 1.0)):
        r = get(wl, "suffixspec")
        if r and "x_suffix" in r:
            out[f"{wl} throughput x suffix >= {need}"] = {"value": r["x_suffix"]["median"], "met": r["x_suffix"]["median"] >= need}
    r = get("code-edit", "suffixspec")
    if r and r.get("accepted_x_suffix") is not None:
        out["code-edit accepted x suffix >= 1.15"] = {"value": r["accepted_x_suffix"], "met": r["accepted_x_suffix"] >= 1.15}
    for r in rows:
        if r["method"] != "suffixspec":
            continue
        peers = [r[f"x_{p}"] for p in ("ngram", "suffix") if f"x_{p}" in r]
        if peers:
            worst = min(p["median"] for p in peers)
            out[f"{r['workload']} {r['seqs']}x{r['cap']} x better peer"] = {"value": round(worst, 3)}
    for wl in ("code-edit", "spec-bench", "multi-turn"):
        r = get(wl, "clairvoyant")
        if r and "x_suffix" in r:  # what perfect drafts reach at this cap: the ceiling of the two targets above
            out[f"{wl} ceiling (clairvoyant) x suffix"] = {"throughput": r["x_suffix"]["median"],
                                                            "accepted": r.get("accepted_x_suffix")}
    out["identical to plain"] = all(r["identical_to_plain"] in (True, None) for r in rows)
    return out


COLUMNS = ["workload", "seqs", "cap", "method", "accepted", "draft_tokens", "acceptance_rate", "tokens", "tok_per_s",
           "x_plain", "x_suffix", "x_ngram", "propose_ms", "step_ms", "identical_to_plain"]


def _cell(row: dict, col: str) -> str:
    v = row.get(col)
    if isinstance(v, dict):
        return f"{v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})" if v["min"] != v["max"] else f"{v['median']:.2f}"
    return "-" if v is None else str(v)


def print_table(rows: list[dict]) -> None:
    cells = [[_cell(r, c) for c in COLUMNS] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) if cells else len(c) for i, c in enumerate(COLUMNS)]
    print("  ".join(c.rjust(w) for c, w in zip(COLUMNS, widths)))
    for x in cells:
        print("  ".join(v.rjust(w) for v, w in zip(x, widths)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--cells", default="8x8,1x8,32x8,8x24", help="SEQSxCAP items: max_num_seqs x draft cap")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--prompts", type=int, default=24, help="prompts (conversations) per workload")
    ap.add_argument("--max-tokens", type=int, default=128, help="per turn")
    ap.add_argument("--rounds", type=int, default=2, help="repeats of the whole grid, interleaved")
    ap.add_argument("--specbench", type=Path, default=SPECBENCH)
    ap.add_argument("--model", type=Path, default=None, metavar="GGUF",
                    help="a .gguf file (e.g. the code model: bench/code_model.py --check prints its path); vLLM loads "
                         "the transformers directory suffixspec converts it into (default: the embedded SmolLM2-135M)")
    ap.add_argument("--threads", type=int, default=0, help="engine threads (OMP_NUM_THREADS, no binding); 0: vLLM's default")
    ap.add_argument("--lock", default=None, help="flock this file around each engine process")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per engine process")
    common.add_record_flag(ap)
    args = ap.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    names = [w for w in args.workloads.split(",") if w]
    bad = [m for m in methods if m not in METHODS] + [w for w in names if w not in WORKLOADS]
    if bad:
        raise SystemExit(f"unknown {bad}: --methods takes some of {list(METHODS)}, --workloads some of {list(WORKLOADS)}")
    if "clairvoyant" in methods and "plain" not in methods:
        raise SystemExit("--methods: clairvoyant drafts plain decoding's outputs, so it needs plain too")
    if args.prompts < 1 or args.max_tokens < 1 or args.rounds < 1:
        raise SystemExit("--prompts, --max-tokens and --rounds must be positive")
    cells = parse_cells(args.cells)
    if importlib.util.find_spec("vllm") is None:
        raise SystemExit(f"bench_vllm: vllm is not installed in {sys.executable} (make a venv with .ci/vllm.sh)")
    skipped = {}
    if "suffix" in methods and importlib.util.find_spec("arctic_inference") is None:
        skipped["suffix"] = "arctic-inference is not installed in this venv (vLLM's suffix method needs it)"
        methods.remove("suffix")

    from suffixspec import Document, build_index, load_tokenizer
    from suffixspec.bench.workloads import chatml
    from suffixspec.models import default_model_dir

    if args.model is not None and not (args.model.is_file() and args.model.suffix == ".gguf"):
        raise SystemExit(f"--model: expected a .gguf file, got {str(args.model)!r}")
    tok = load_tokenizer(args.model)
    args.model_name = args.model.name if args.model is not None else "SmolLM2-135M-Instruct (embedded)"
    args.model, args.eos = str(default_model_dir(args.model)), tok.eos_token_id
    args.warmup = [tok.encode(chatml(q)) for q in WARMUP]
    data = workloads(tok, names, args.prompts, args.specbench)
    plugins = plugins_without_arctic()
    print(f"# every engine runs with VLLM_PLUGINS={plugins!r} (arctic-inference's vLLM plugin excluded: no vLLM "
          "patches; vLLM's suffix method uses arctic-inference's cache directly)", flush=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        corpus = None
        if "suffixspec+corpus" in methods:
            docs = common.read_jsonl(common.CORPORA / "python_stdlib.jsonl")
            corpus = tmp / "stdlib.idx"
            build_index([Document(np.array(tok.encode(d["text"]), np.int32), id=d["id"]) for d in docs], corpus, tokenizer=tok)
        runs = run_grid(args, data, cells, methods, corpus, tmp, plugins)
    rows = summarize(runs)
    print_table(rows)
    goal = targets(rows)
    for name, v in goal.items():
        print(f"target {name}: {v}")
    for m, why in skipped.items():
        print(f"{m}: skipped, {why}")
    common.emit({"bench": "vllm", "model": args.model_name, "workloads": {k: v["source"] for k, v in data.items()}, "max_tokens": args.max_tokens,
                 "cells": [f"{s}x{c}" for s, c in cells], "rounds": args.rounds, "vllm_plugins": plugins,
                 "plugin_note": "arctic-inference's vLLM plugin excluded from every engine (VLLM_PLUGINS)",
                 "results": rows, "targets": goal, "skipped": skipped}, args, "vllm")


if __name__ == "__main__":
    main()
