"""The one prepared device check: `python bench/gpu_check.py --out DIR`.

On a CUDA device (else the CPU, with small shapes and shorter caps, so CI runs the same steps) it
writes ``DIR/gpu_check.json`` with exactly the top-level keys below, prints a table, then one JSON
line last (a summary; ``--record``: also appended to ``bench/results/gpu_check.jsonl``):

- ``device``: the machine (name, memory, torch / CUDA / transformers versions, whether TF32 is off,
  whether the memory-efficient SDPA kernel alone takes an explicit additive mask).
- ``exactness``: a tiny random-weight Llama-style model in float32, initialised sharply
  (``initializer_range`` 0.2; the smallest top-2 logit gap seen is reported), as drawn (``random``:
  drafts are rejected) and made to loop (``cycling``: drafts are accepted, see `_cycling`): the tree
  pass's logits against sequential passes (`check_tree_logits`, max abs diff), and greedy
  speculative output (fixed budget 8: a tree every round) against transformers' plain greedy
  decoding on 16 prompts with continuous batching at batch 1, 4, 16. ``passed``: both float32
  variants equal everywhere. The same model in half precision (bf16, and fp16 on CUDA) is not held to it (a
  tree pass rounds differently from a one-token step): its mismatch rate is measured and reported.
- ``cost_curve``: `KVState.forward` times ``t(tokens fed, batch)`` for random-weight models of the
  0.5B / 1.5B / 7B shapes (`_gpu_models.SHAPES`) in bf16 built on the device, over a 1,024-token
  past, batch 1-64 x tokens 1-256 (every row fed the same width) plus the one-token step at batch
  256; medians of 5 after 2 warm-ups, CUDA events (``gpu_ms``) and host clock (``wall_ms``); the peak
  CUDA memory per model and a 1,024-token prefill's time.
- ``replay``: the shipped SmolLM2 greedy traces (copy edits, chat) replayed through the real
  generator charged each measured curve, at concurrency 1, 4, 16: predicted speed-ups of suffixspec
  against plain decoding and against prompt lookup (`_gpu_replay`).
  Each model's one-row curve is also written as ``cost_curve_<model>.json`` beside the report, in
  the format `--cost-curve FILE` reads (tree size -> time relative to the one-token step).
- ``cpu_share``: the host time of a round (proposer, budget policy, acceptance, bookkeeping) at
  batch 64 and 256 against each model's measured one-token step at that batch: the share of the
  critical path our CPU work takes (``host / (host + step)``).

Each section has a time cap; what it could not reach is counted in its ``skipped``. The whole check
is sized for 4-5 minutes on one H100 (its numba kernels compile in a background process while the
cost curve is measured) and under 2 minutes on the CPU path with warm kernel caches.

It needs neither the embedded model's package nor pyroaring (the corpus filters are never used).
pyroaring is the one dependency of suffixspec missing on the lent GPU machines; to run the test
suite there too, carry its wheel (from the repository root, here):

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \\
        -d .whl pyroaring

and start the device command with ``python3 -m pip install -q --no-index --no-deps --target /tmp/site
.whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH;``. The device command (see docs/gpu.md):

    PYTHONUNBUFFERED=1 PYTHONPATH=$PWD python3 bench/gpu_check.py --out $OUT 2>&1 | tee $OUT/log.txt
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import _gpu_models as gm
import _gpu_replay as gr
import numpy as np

import common

KEYS = ("device", "exactness", "cost_curve", "replay", "cpu_share")
EXACT_SHAPE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=8,
                   num_key_value_heads=2, vocab_size=2048, tie_word_embeddings=False)
SETTINGS = {  # per device type: sizes and the time cap of each section (seconds)
    "cuda": dict(models=("0.5B", "1.5B", "7B"), past=1024, batches=(1, 4, 16, 64),
                 widths=(1, 2, 4, 8, 16, 32, 64, 128, 256), max_tokens=256, big_steps=(256,), warmup=2,
                 repeats=5, exact_tokens=64, exact_batches=(1, 4, 16), half=("bfloat16", "float16"),
                 traces=24, trace_tokens=128, concurrency=(1, 4, 16), share_batches=(64, 256), share_rounds=20,
                 caps=dict(cost_curve=110, exactness=50, replay=75, cpu_share=35)),
    "cpu": dict(models=("tiny-s", "tiny-m"), past=64, batches=(1, 4), widths=(1, 4, 16), max_tokens=64,
                big_steps=(64, 256), warmup=1, repeats=3, exact_tokens=40, exact_batches=(1, 4, 16),
                half=("bfloat16",), traces=6, trace_tokens=48, concurrency=(1, 4), share_batches=(64, 256),
                share_rounds=4, caps=dict(cost_curve=25, exactness=40, replay=25, cpu_share=15)),
}


# ---------------------------------------------------------------------------------------- device


def device_info(torch, device) -> dict:
    import transformers

    info = {"type": device.type, "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "cpus": os.cpu_count(), "threads": torch.get_num_threads()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, memory_gib=round(props.total_memory / 2**30, 1),
                    multiprocessors=props.multi_processor_count,
                    tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32),
                    sdpa_efficient_with_mask={str(dt).split(".")[-1]: _efficient_takes_mask(torch, dt)
                                              for dt in (torch.float32, torch.bfloat16)})
    else:
        info.update(name=platform.processor() or platform.machine(),
                    memory_gib=round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1))
    return info


def _efficient_takes_mask(torch, dtype) -> str:
    """"ok", or why the memory-efficient SDPA kernel alone refuses a tree pass's shapes (an additive
    mask [b, 1, q, k] with a width that is no multiple of 8)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(2, 4, 5, 64, device="cuda", dtype=dtype)
    k = torch.randn(2, 4, 37, 64, device="cuda", dtype=dtype)
    mask = torch.zeros(2, 1, 5, 37, device="cuda", dtype=dtype)
    mask[..., -3:] = torch.finfo(dtype).min
    try:
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=mask)
        torch.cuda.synchronize()
        return "ok"
    except RuntimeError as exc:
        return str(exc).strip().splitlines()[0][:200]


# ---------------------------------------------------------------------------------------- exactness


def _prompts(vocab: int, n: int, rng) -> list[list[int]]:
    """Prompts that repeat a segment (so the proposer drafts from the prompt as well as the output)."""
    out = []
    for _ in range(n):
        seg = rng.integers(1, vocab, int(rng.integers(6, 14))).tolist()
        noise = lambda k: rng.integers(1, vocab, k).tolist()  # noqa: E731
        out.append(noise(int(rng.integers(2, 8))) + seg + noise(3) + seg + seg[: int(rng.integers(1, len(seg)))])
    return out


def _plain(torch, model, prompts, new_tokens) -> tuple[list[list[int]], float]:
    """transformers' greedy decoding of each prompt alone, and the smallest top-2 gap of its logits."""
    outs, gap = [], float("inf")
    dev = next(model.parameters()).device
    for p in prompts:
        ids = torch.tensor([p], device=dev)
        with torch.no_grad():
            g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                               pad_token_id=0, eos_token_id=None, output_scores=True, return_dict_in_generate=True)
        outs.append(g.sequences[0, len(p):].tolist())
        top2 = torch.stack(g.scores).float().topk(2, dim=-1).values  # [steps, 1, 2]
        gap = min(gap, float((top2[..., 0] - top2[..., 1]).min()))
    return outs, gap


def _speculative(model, prompts, new_tokens, batch) -> dict:
    from suffixspec.draft.proposer import Proposer
    from suffixspec.engine.budget import CostModel
    from suffixspec.generate import SpeculativeGenerator

    gen = SpeculativeGenerator(model, proposer=Proposer(global_cache=False),
                               cost_model=CostModel.measure(model, past=32, repeats=1), prefix_cache_bytes=0)
    res = gen.generate(prompts, max_new_tokens=new_tokens, max_batch=batch, budget=8)
    st = res.stats
    return {"sequences": res.sequences, "rounds": st.rounds, "drafted": st.drafted, "accepted": st.accepted,
            "tokens_per_round": round(st.tokens_per_round, 3), "peak_memory_mib": round(st.peak_memory_bytes / 2**20, 1),
            "fallback": gen.check_support()}


def _agreement(got, want) -> tuple[int, float]:
    """(sequences equal, mean fraction of each sequence before its first difference)."""
    equal, fractions = 0, []
    for g, w in zip(got, want):
        equal += g == w
        first = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
        fractions.append(first / max(len(w), 1))
    return equal, round(float(np.mean(fractions)), 4)


def _cycling(torch, model, period: int = 12, layer_scale: float = 0.1, seed: int = 1) -> None:
    """Make `model` (untied, unprepared) mostly a permutation of tokens with cycles of `period`: its
    embeddings dominate the residual stream (x10, each layer's output x`layer_scale`) and its head
    maps a token's embedding to the next token of its cycle. Greedy outputs then loop, drafts are
    accepted (accepted-node commits, cache compaction), and attention still shifts the logits."""
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    vocab = emb.shape[0]
    order = np.random.default_rng(seed).permutation(vocab)
    nxt = np.empty(vocab, np.int64)
    for s in range(0, vocab, period):
        nxt[order[s : s + period]] = np.roll(order[s : s + period], -1)
    prev = np.empty(vocab, np.int64)
    prev[nxt] = np.arange(vocab)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.mul_(layer_scale)
        emb.mul_(10.0)
        head.copy_(emb[torch.from_numpy(prev).to(emb.device)] * (4.0 / float(emb.norm(dim=1).mean())))


def _variant(torch, device, cfg, deadline, prompts, cycling: bool) -> dict:
    from suffixspec.models import prepare_model
    from suffixspec.verify.kv import check_tree_logits

    model = gm.build(EXACT_SHAPE, device, torch.float32, init_range=0.2, seed=0, prepare=False)
    if cycling:
        _cycling(torch, model)
    prepare_model(model)
    out = {"skipped": 0}
    try:
        out["tree_max_abs_diff"] = check_tree_logits(model, atol=1e-3)
    except Exception as exc:  # noqa: BLE001 - reported as a failed check
        out["tree_max_abs_diff"], out["tree_error"] = None, str(exc)
    plain, out["min_top2_gap"] = _plain(torch, model, prompts, cfg["exact_tokens"])
    for batch in cfg["exact_batches"]:
        if time.monotonic() > deadline:
            out["skipped"] += 1
            continue
        run = _speculative(model, prompts, cfg["exact_tokens"], batch)
        equal, _ = _agreement(run.pop("sequences"), plain)
        out[f"batch_{batch}"] = dict(run, equal=equal)
    runs = [v for k, v in out.items() if k.startswith("batch_")]
    out["passed"] = bool(out["tree_max_abs_diff"] is not None and runs
                         and all(r["equal"] == len(prompts) and r["fallback"] is None for r in runs))
    return out


def exactness(torch, device, cfg, deadline) -> dict:
    """float32 verdicts of a random and a cycling model (`_cycling`), and half precision's mismatch rate."""
    prompts = _prompts(EXACT_SHAPE["vocab_size"], 16, np.random.default_rng(0))
    out = {"model": dict(EXACT_SHAPE, dtype="float32", initializer_range=0.2), "prompts": len(prompts),
           "new_tokens": cfg["exact_tokens"], "budget": 8}
    out["float32"] = {name: _variant(torch, device, cfg, deadline, prompts, name == "cycling")
                      for name in ("random", "cycling")}
    out["skipped"] = sum(v.pop("skipped") for v in out["float32"].values())
    out["passed"] = all(v["passed"] for v in out["float32"].values())
    out["tree_max_abs_diff"] = max((v["tree_max_abs_diff"] for v in out["float32"].values()
                                    if v["tree_max_abs_diff"] is not None), default=None)
    out["half"] = {}
    for name in cfg["half"]:
        if time.monotonic() > deadline:
            out["skipped"] += 1
            continue
        half = gm.build(EXACT_SHAPE, device, torch.float32, init_range=0.2, seed=0, cast=getattr(torch, name))
        ref, gap = _plain(torch, half, prompts, cfg["exact_tokens"])
        run = _speculative(half, prompts, cfg["exact_tokens"], max(cfg["exact_batches"]))
        equal, before = _agreement(run.pop("sequences"), ref)
        out["half"][name] = dict(run, equal=equal, mismatch_rate=round(1 - equal / len(prompts), 4),
                                 agreeing_fraction=before, min_top2_gap=gap)
    return out


# ---------------------------------------------------------------------------------------- cost curve


def cost_curve(torch, device, cfg, deadline) -> dict:
    """Pass times per model; each model gets an equal share of what is left of the section's time."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    points = [(b, w) for b in cfg["batches"] for w in cfg["widths"] if b * w <= cfg["max_tokens"]]
    points += [(b, 1) for b in cfg["big_steps"]]
    out = {"dtype": str(dtype).split(".")[-1], "past": cfg["past"], "repeats": cfg["repeats"],
           "warmup": cfg["warmup"], "models": {}, "skipped": 0}
    names = list(cfg["models"])
    for i, name in enumerate(names):
        now = time.monotonic()
        if now > deadline:
            out["skipped"] += len(points)
            continue
        share = now + (deadline - now) / (len(names) - i)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        t = time.perf_counter()
        model = gm.build(name, device, dtype)
        entry = {"parameters": gm.parameters(model), "build_s": round(time.perf_counter() - t, 2)}
        entry["prefill_ms"] = round(gm.prefill_ms(model, cfg["past"]), 3)
        entry["points"] = gm.pass_times(model, points, cfg["past"], cfg["warmup"], cfg["repeats"], share)
        out["skipped"] += len(points) - len(entry["points"])
        if device.type == "cuda":
            entry["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        out["models"][name] = entry
        del model
    return out


def grid_cost(entry: dict, past: int) -> gr.GridCost:
    pts = [{"batch": p["batch"], "tokens": p["tokens"], "seconds": p.get("gpu_ms", p["wall_ms"]) / 1e3}
           for p in entry["points"] if p["batch"] <= 64]
    return gr.GridCost(pts, entry["prefill_ms"] / 1e3 / past)


def pinned_curves(curve: dict) -> dict:
    """Per model, its one-row curve in the `--cost-curve FILE` format (`CostModel.from_relative`): tree
    size (tokens fed at one row) -> time relative to the one-token step, never falling as the size grows."""
    out = {}
    for name, entry in curve["models"].items():
        pts = sorted((p["width"], p.get("gpu_ms", p["wall_ms"])) for p in entry["points"] if p["batch"] == 1)
        if len(pts) < 2 or pts[0][0] != 1 or not pts[0][1] > 0:
            continue
        rel = np.maximum.accumulate(np.asarray([ms for _, ms in pts]) / pts[0][1])
        out[name] = {str(w): round(float(r), 4) for (w, _), r in zip(pts, rel)}
    return out


def usable(curve: dict) -> dict:
    """The models whose curve has a one-token step at batch 1 (enough to charge a replay)."""
    return {n: e for n, e in curve["models"].items() if any(p["batch"] == 1 and p["width"] == 1 for p in e["points"])}


# ---------------------------------------------------------------------------------------- replay, cpu share


def replay(curve: dict, cfg, deadline) -> dict:
    traces = gr.load_traces(common.CORPORA, cfg["traces"], cfg["trace_tokens"])
    out = {"records": {w: len(r) for w, r in traces.items()}, "max_new_tokens": cfg["trace_tokens"],
           "pld_tokens": 10, "runs": {}, "skipped": 0}
    models = usable(curve)
    for c in cfg["concurrency"]:
        for workload, records in traces.items():
            for name, entry in models.items():
                if time.monotonic() > deadline:
                    out["skipped"] += 1
                    continue
                run = gr.replay(records, grid_cost(entry, curve["past"]), c)
                out["runs"].setdefault(name, {}).setdefault(workload, {})[f"concurrency_{c}"] = run
    return out


def cpu_share(curve: dict, cfg, deadline) -> dict:
    traces = gr.load_traces(common.CORPORA, None, cfg["trace_tokens"])
    records = [r for recs in traces.values() for r in recs]
    models = usable(curve)
    out = {"records": len(records), "cost_of": next(iter(models), None), "batches": {}, "skipped": 0}
    for batch in cfg["share_batches"]:
        if not models or time.monotonic() > deadline:
            out["skipped"] += 1
            continue
        first = next(iter(models.values()))
        host = gr.cpu_share(records, grid_cost(first, curve["past"]), batch, cfg["share_rounds"])
        steps = {}
        for name, entry in models.items():
            step = next((p for p in entry["points"] if p["batch"] == batch and p["width"] == 1), None)
            if step is not None:
                ms = step.get("gpu_ms", step["wall_ms"])
                steps[name] = {"step_ms": ms, "share": round(host["host_ms_per_round"] / (host["host_ms_per_round"] + ms), 4)}
        out["batches"][str(batch)] = dict(host, models=steps)
    return out


# ---------------------------------------------------------------------------------------- report


def table(result: dict) -> str:
    d, ex, cc, rp, cs = (result[k] for k in KEYS)
    lines = [f"device     {d.get('name')} ({d['type']}, {d.get('memory_gib')} GiB), torch {d['torch']}, "
             f"CUDA {d['cuda']}, transformers {d['transformers']}"]
    lines.append(f"exactness  passed={ex['passed']}  (float32, {ex['prompts']} prompts x {ex['new_tokens']} tokens)")
    for variant, v in ex["float32"].items():
        runs = "  ".join(f"{k}: {r['equal']} equal, {r['accepted']}/{r['drafted']} accepted"
                         for k, r in v.items() if k.startswith("batch_"))
        lines.append(f"           {variant:<8} tree max|diff|={v['tree_max_abs_diff']:.3g}  min top-2 gap="
                     f"{v['min_top2_gap']:.3g}  {runs}")
    for name, v in ex["half"].items():
        lines.append(f"           {name}: mismatch rate {v['mismatch_rate']:.3f} "
                     f"({v['equal']}/{ex['prompts']} equal, {v['agreeing_fraction']:.3f} of tokens before a difference)")
    for name, e in cc["models"].items():
        pts = "  ".join(f"{p['batch']}x{p['width']}:{p.get('gpu_ms', p['wall_ms']):.2f}" for p in e["points"])
        lines.append(f"cost {name:<6} ({e['parameters'] / 1e6:.1f}M, prefill {e['prefill_ms']:.1f} ms) ms by batch x width: {pts}")
    for name, by_w in rp["runs"].items():
        for workload, by_c in by_w.items():
            cells = "  ".join(f"c{k.split('_')[-1]}: {v['ours_vs_plain']:.2f}x plain {v['ours_vs_pld']:.2f}x PLD"
                              for k, v in by_c.items())
            lines.append(f"replay {name:<6} {workload:<10} {cells}")
    for batch, v in cs["batches"].items():
        shares = "  ".join(f"{n}: step {m['step_ms']:.2f} ms, share {m['share']:.1%}" for n, m in v["models"].items())
        lines.append(f"cpu share batch {batch:>3}: host {v['host_ms_per_round']:.2f} ms/round (proposer "
                     f"{v['proposer_ms']:.2f}, policy {v['policy_ms']:.2f})  {shares}")
    skipped = {k: result[k].get("skipped", 0) for k in KEYS[1:] if result[k].get("skipped")}
    if skipped:
        lines.append(f"skipped (time caps): {skipped}")
    return "\n".join(lines)


def summary(result: dict, path: Path, wall_s: float) -> dict:
    d, ex, cc, rp, cs = (result[k] for k in KEYS)
    return {"device": d.get("name"), "type": d["type"], "wall_s": round(wall_s, 1), "out": str(path),
            "exactness_passed": ex["passed"], "tree_max_abs_diff": ex["tree_max_abs_diff"],
            "half_mismatch_rate": {k: v["mismatch_rate"] for k, v in ex["half"].items()},
            "step_ms": {n: {p["batch"]: p.get("gpu_ms", p["wall_ms"]) for p in e["points"] if p["width"] == 1}
                        for n, e in cc["models"].items()},
            "ours_vs_plain": {f"{n}/{w}/{c}": v["ours_vs_plain"] for n, ws in rp["runs"].items()
                              for w, cs_ in ws.items() for c, v in cs_.items()},
            "cpu_share": {b: {n: m["share"] for n, m in v["models"].items()} for b, v in cs["batches"].items()},
            "skipped": {k: result[k].get("skipped", 0) for k in KEYS[1:]}}


def _warm_kernels_in_background() -> subprocess.Popen:
    """Compile (or load) the numba kernels in another process while the GPU is timed."""
    code = "from suffixspec import warm_kernels; warm_kernels()"
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for gpu_check.json")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    common.add_record_flag(ap)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    warm = _warm_kernels_in_background()
    import torch

    dev = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu")
    cfg, caps = SETTINGS[dev.type], SETTINGS[dev.type]["caps"]
    result = {"device": device_info(torch, dev)}
    t = time.monotonic()
    result["cost_curve"] = cost_curve(torch, dev, cfg, t + caps["cost_curve"])
    result["cost_curve"]["seconds"] = round(time.monotonic() - t, 1)
    try:
        warm.wait(timeout=300)
    except subprocess.TimeoutExpired:
        warm.kill()
    from suffixspec import warm_kernels

    warm_kernels()  # loaded here too (from the cache the other process filled), before the sections' clocks
    for key, fn, arg in (("exactness", exactness, None), ("replay", replay, "curve"), ("cpu_share", cpu_share, "curve")):
        t = time.monotonic()
        deadline = t + caps[key]
        result[key] = fn(torch, dev, cfg, deadline) if arg is None else fn(result["cost_curve"], cfg, deadline)
        result[key]["seconds"] = round(time.monotonic() - t, 1)
    result = {k: result[k] for k in KEYS}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpu_check.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    for name, pinned in pinned_curves(result["cost_curve"]).items():  # `--cost-curve FILE` for each model
        (out / f"cost_curve_{name}.json").write_text(json.dumps(pinned) + "\n")
    print(table(result))
    common.emit(summary(result, path, time.monotonic() - t0), args, "gpu_check")
    return 0


if __name__ == "__main__":
    sys.exit(main())
