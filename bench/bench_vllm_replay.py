"""The vLLM adapter replayed on bench_vllm's workloads without vLLM: its `DraftCore` (and vLLM's `suffix`
drafter, arctic-inference's `SuffixDecodingCache` driven as vLLM drives it, where installed) drafting
for a scripted target, the greedy outputs a real engine gave, on a simulated step clock.

    $VLLM_VENV/bin/python bench/bench_vllm_replay.py --generate /tmp/outs.json   # one vLLM run per workload
    $VLLM_VENV/bin/python bench/bench_vllm_replay.py --outputs /tmp/outs.json --rows 1,8 \\
        --arms suffix,suffixspec,'suffixspec:{"session_timeout_steps": 64}'

`--generate` runs bench_vllm's workloads (code-edit, spec-bench, multi-turn; `--prompts`, `--max-tokens`)
through one real engine each (tests_vllm/engine.py, vLLM's `suffix`: greedy, the same outputs as plain
decoding) and saves prompts, follow-ups and outputs. The replay runs each turn's requests `--rows` at a
time in order (joins fill free rows, the second turns after every first turn, as bench_vllm's engine
does): a step verifies every row's draft against the known output (the longest equal prefix, plus the
bonus token), then the drafter drafts for the next step. A step of b rows feeding T tokens advances
the clock by 1 + slope (T - b) (`--slope`; prefills are free, the same in every arm) and the adapter
reads that clock, so the cost it learns is that line. Reported per arm: decode steps, drafted and
accepted tokens, tokens per simulated step and the ratio to the first arm. Simulated time: no lock.
The counts track a real run's closely (the warm-up prompts are left out); the clock is a model.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np

import common


class SimClock:
    """Stands in for `time` in the adapter's module: `perf_counter` reads the simulated clock."""

    def __init__(self):
        self.t = 0.0

    def perf_counter(self) -> float:
        return self.t


class SuffixArm:
    """vLLM's `suffix` method: arctic-inference's cache, called as vLLM 0.32's proposer calls it."""

    def __init__(self, k: int, max_model_len: int):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=10000)
        self.k, self.max_model_len = k, max_model_len

    def step(self, batch) -> list[list[int]]:
        out = []
        for rid, tokens, sampled, n_prompt in batch:
            if rid not in self.cache.active_requests:
                if rid in self.cache.cached_requests:
                    self.cache.evict_cached_response(rid)
                self.cache.start_request(rid, np.asarray(tokens[:n_prompt], np.int32))
            self.cache.add_active_response(rid, list(sampled))
            pattern = np.asarray(tokens[max(0, len(tokens) - 24):], np.int32)
            draft = self.cache.speculate(rid, pattern, max_spec_tokens=min(self.k, self.max_model_len - len(tokens) - 1),
                                         max_spec_factor=1.0, min_token_prob=0.1)
            out.append(list(draft.token_ids))
        for rid in self.cache.active_requests - {b[0] for b in batch}:
            self.cache.stop_request(rid)
        return out


class CoreArm:
    """suffixspec's adapter: a `DraftCore` as the vLLM <= 0.33 front end calls it (rows by index)."""

    def __init__(self, k: int, rows: int, max_model_len: int, options: dict):
        from suffixspec.integrations.vllm_core import DraftCore
        from suffixspec.integrations.vllm_options import VllmSetup

        self.core = DraftCore(VllmSetup(k, max_model_len, 1 << 20, rows, dict(options)))
        self.max_model_len = max_model_len

    def step(self, batch) -> list[list[int]]:
        table = np.zeros((len(batch), self.max_model_len), np.int64)
        for r, (_, tokens, _, _) in enumerate(batch):
            table[r, : len(tokens)] = tokens
        lengths = np.array([len(b[1]) for b in batch], np.int64)
        return self.core.step(list(range(len(batch))), [len(b[2]) for b in batch], lengths, table)


def turns(data: dict) -> list[list[tuple]]:
    """[(request id, prompt, output)] per turn (a second turn: prompt + answer without stop + follow-up)."""
    n, outs = len(data["prompts"]), data["outputs"]
    first = [(i, list(data["prompts"][i]), outs[i]) for i in range(n)]
    if not data.get("followups"):
        return [first]
    stop = {data["eos"]}
    return [first, [(n + i, p + [t for t in outs[i] if t not in stop] + list(data["followups"][i]), outs[n + i])
                    for i, p, _ in first]]


def replay(data: dict, arm, rows: int, slope: float, clock: SimClock | None = None) -> dict:
    tot = collections.Counter()
    for turn in turns(data):
        queue = collections.deque(turn)
        live = []  # [rid, prompt, output, position, draft]
        while queue or live:
            fed, running = 0, []
            for rid, prompt, out, pos, draft in live:
                fed += 1 + len(draft)
                a = 0
                while a < len(draft) and pos + a < len(out) and draft[a] == out[pos + a]:
                    a += 1
                tot["drafted"] += len(draft)
                tot["accepted"] += a
                if pos + a + 1 < len(out):
                    running.append([rid, prompt, out, pos + a + 1, out[pos: pos + a + 1]])
            while len(running) < rows and queue:  # joins: the prefill samples the first token
                rid, prompt, out = queue.popleft()
                if len(out) > 1:
                    running.append([rid, prompt, out, 1, out[:1]])
            cost = 1.0 + slope * (fed - len(live)) if fed else 0.0
            tot["steps"] += bool(fed)
            tot["time"] += cost
            if clock is not None:
                clock.t += 0.05 * max(cost, 1.0)
            batch = [(r[0], r[1] + list(r[2][: r[3]]), r[4], len(r[1])) for r in running]
            drafts = arm.step(batch) if batch else []
            live = [[r[0], r[1], r[2], r[3], list(d)] for r, d in zip(running, drafts)]
    tot["tokens"] = sum(len(o) for o in data["outputs"])
    return dict(tot)


def run_arm(spec: str, data: dict, rows: int, slope: float, k: int) -> dict:
    if spec == "suffix":
        return replay(data, SuffixArm(k, 2048), rows, slope)
    name, _, opts = spec.partition(":")
    if name != "suffixspec":
        raise SystemExit(f"--arms: expected suffix, suffixspec or suffixspec:{{options}}, got {spec!r}")
    try:
        options = json.loads(opts) if opts else {}
    except ValueError:
        raise SystemExit(f"--arms: {spec!r}: the options after 'suffixspec:' must be a JSON object") from None
    clock = SimClock()
    from suffixspec.integrations import vllm_core

    with mock.patch.object(vllm_core, "time", clock):
        return replay(data, CoreArm(k, rows, 2048, options), rows, slope, clock)


def generate(args) -> None:
    import bench_vllm as bv

    from suffixspec import load_tokenizer
    from suffixspec.models import default_model_dir

    tok = load_tokenizer(None)
    data = bv.workloads(tok, args.workloads.split(","), args.prompts, bv.SPECBENCH)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, wl in data.items():
            base = {"model": str(default_model_dir(None)), "prompts": wl["prompts"], "max_tokens": args.max_tokens,
                    "max_model_len": 2048, "max_num_seqs": 1, "stop_token_ids": [tok.eos_token_id], "repeats": 1}
            if wl.get("followups"):
                base["followups"] = wl["followups"]
            r = bv.run_engine({**base, "runs": [{"method": "suffix", "k": 8, "label": "suffix"}]}, Path(tmp), 1800,
                              args.lock, bv.plugins_without_arctic(), 1)
            out[name] = {"prompts": wl["prompts"], "followups": wl.get("followups"), "outputs": r["outputs"],
                         "eos": tok.eos_token_id}
            print(f"# {name}: {r['tokens']} tokens", flush=True)
    Path(args.generate).write_text(json.dumps(out))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--generate", metavar="PATH", help="run the engine once per workload and save its outputs here")
    p.add_argument("--outputs", metavar="PATH", help="outputs saved by --generate, to replay")
    p.add_argument("--workloads", default="multi-turn,spec-bench,code-edit")
    p.add_argument("--prompts", type=int, default=18)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--lock", default=None, help="flock this file around the engine (--generate)")
    p.add_argument("--rows", default="1,8", help="requests run together (comma list)")
    p.add_argument("--arms", default="suffix,suffixspec", help="comma list: suffix, suffixspec, suffixspec:{JSON options}")
    p.add_argument("--slope", type=float, default=0.03, help="a drafted token's cost, in steps of no draft")
    p.add_argument("--k", type=int, default=8, help="draft cap")
    common.add_record_flag(p)
    args = p.parse_args(argv)
    if args.generate:
        generate(args)
        return 0
    if not args.outputs:
        p.error("give --outputs PATH (saved by --generate PATH)")
    saved = _load_outputs(Path(args.outputs), args.workloads.split(","), p)
    arms = _split_arms(args.arms)
    try:
        row_counts = [int(r) for r in args.rows.split(",")]
    except ValueError:
        p.error(f"--rows: expected a comma list of positive integers, got {args.rows!r}")
    if any(r < 1 for r in row_counts):
        p.error(f"--rows: expected a comma list of positive integers, got {args.rows!r}")
    cells = []
    for rows in row_counts:
        for wl in args.workloads.split(","):
            res = {a: run_arm(a, saved[wl], rows, args.slope, args.k) for a in arms}
            base = res[arms[0]]["tokens"] / res[arms[0]]["time"]
            for a in arms:
                r = res[a]
                r["ratio"] = round(r["tokens"] / r["time"] / base, 4)
                print(f"{wl:<11} {rows:>2} rows  {a:<40} steps {r['steps']:>5}  drafted {r['drafted']:>5}  "
                      f"accepted {r['accepted']:>5}  x_first {r['ratio']:.3f}", flush=True)
            cells.append({"workload": wl, "rows": rows, "arms": res})
    common.emit({"benchmark": "vllm_replay", "slope": args.slope, "k": args.k, "cells": cells}, args, "vllm_replay")
    return 0


def _load_outputs(path: Path, workloads: list[str], p: argparse.ArgumentParser) -> dict:
    """The --outputs file: a JSON object holding every workload asked for (as --generate writes it)."""
    try:
        saved = json.loads(path.read_text())
    except OSError as exc:
        p.error(f"--outputs: cannot read {str(path)!r}: {exc.strerror or exc}")
    except ValueError:
        p.error(f"--outputs: {str(path)!r} is not JSON; expected the file --generate writes")
    if not isinstance(saved, dict):
        p.error(f"--outputs: expected a JSON object of workloads (as --generate writes), got {type(saved).__name__}")
    missing = [w for w in workloads if w not in saved]
    if missing:
        p.error(f"--outputs: {str(path)!r} holds no {', '.join(missing)} (it holds {', '.join(sorted(saved)) or 'none'})")
    return saved


def _split_arms(text: str) -> list[str]:
    """Split --arms on the commas outside JSON braces."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [a for a in [*out, cur.strip()] if a]


if __name__ == "__main__":
    sys.exit(main())
