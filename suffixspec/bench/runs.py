"""Benchmark runs: every (mode, concurrency) configuration x repeat, served through a backend.

Contract: `run_benchmark(workload, prompts, backends, settings)` returns one `Run` per configuration
and repeat. `backends[mode].serve(max_batch=, max_new_tokens=, do_sample=, temperature=, top_k=,
top_p=, seed=, budget=)` returns an engine (see `suffixspec.bench.schedule`); a backend may also have
`fresh()` returning the instance to use for one run (a new proposer, so no run learns from an
earlier one). Mode `plain` runs at budget 0, every other mode at `settings.budget`; `prompt_lookup`
runs at concurrency 1 only. Repeats are the outer loop; inside a repeat, concurrencies in order, and
at each concurrency its modes in the given order on even repeats (0, 2, ...) and reversed on odd ones
(`run_order`), so neither mode always runs first: together, their engines taking turns step by step
on clocks that stop during the other engines' turns (`settings.interleave`, where every backend's
`serve` takes a `clock`), else back to back. A failing engine
makes its run's `errors`, never an exception. Warm-ups (`warm_up_all`) run outside the timed runs.
"""

from __future__ import annotations

import gc
import inspect
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

from ..draft.proposer import Proposer
from ..engine.warmup import warm_kernels
from .backends import reserve_memory
from .schedule import Served, TurnClocks, poisson_arrivals, schedule_steps, serve_schedule
from .timesplit import StepSplit
from .workloads import Workload

__all__ = ["MODES", "BenchSettings", "Run", "run_benchmark", "run_order", "takes_clock", "warm_up_all", "warm_up",
           "warm_up_rows", "warm_up_rows_together"]

MODES = ("plain", "speculative", "prompt_lookup")


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
    interleave: bool = True  # the modes of one concurrency take turns step by step (see `run_benchmark`)
    baseline: str = "plain"  # the mode every other one is compared with (speed-up, mismatches)

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
    time_split: dict | None = None  # prefill / draft / verify / rest seconds (`timesplit.StepSplit`)


def _length(prompt) -> int:
    """Tokens of a prompt given as token ids; 0 for a prompt the endpoint tokenizes itself."""
    return len(prompt) if isinstance(prompt, (list, tuple)) else 0


def open_engine(backend, mode: str, settings: BenchSettings, concurrency: int, repeat: int, clock=None):
    """`backend.serve(...)` for one run of `mode` at `concurrency` (on `clock` when given)."""
    extra = {} if clock is None else {"clock": clock}
    return backend.serve(max_batch=concurrency, max_new_tokens=settings.max_new_tokens,
                         do_sample=settings.do_sample,
                         temperature=settings.temperature if settings.do_sample else 1.0,
                         top_k=settings.top_k, top_p=settings.top_p, seed=settings.seed + repeat,
                         budget=0 if mode == "plain" else settings.budget, **extra)


def close_engine(engine) -> None:
    try:
        engine.close()
    except Exception:  # noqa: BLE001 - closing after a failure must not hide it
        pass


def _execute(backend, mode: str, workload: Workload, prompts: list[list[int]], settings: BenchSettings,
             concurrency: int, repeat: int, arrivals, tick: Callable[[], None]) -> Run:
    """One run of `mode` at `concurrency`: `backend.serve(...)` driven by `serve_schedule`."""
    errors: list[str] = []
    engine = open_engine(backend, mode, settings, concurrency, repeat)
    limits = [r.max_new_tokens for r in workload.requests]
    served: list[Served] = []
    makespan = 0.0
    split = StepSplit()
    try:
        served, makespan = serve_schedule(engine, prompts, concurrency, arrivals, limits, on_done=lambda q: tick(),
                                          split=split)
    except Exception as exc:  # a failing engine is a failure of the configuration, not a crash
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        close_engine(engine)
    return _record(engine, mode, workload, prompts, concurrency, repeat, served, makespan, errors, split)


def _execute_together(lanes: list[tuple[str, Any]], workload: Workload, prompts: list[list[int]],
                      settings: BenchSettings, concurrency: int, repeat: int, arrivals,
                      tick: Callable[[], None], clock: Callable[[], float] = time.perf_counter) -> list[Run]:
    """One run of every (mode, backend) of `lanes` at `concurrency`, their engines taking turns step
    by step in the given order, each timed on its own `TurnClocks` clock over `clock` (see
    `run_benchmark`). A lane that is ahead (has added more requests to its engine) skips its turns
    until the others have added as many: its clock is held meanwhile, so waiting costs it nothing,
    not even the time between the others' turns."""
    clocks = TurnClocks(len(lanes), clock=clock)
    limits = [r.max_new_tokens for r in workload.requests]
    engines, schedules, errors = [], [], [[] for _ in lanes]
    splits = [StepSplit() for _ in lanes]
    outcome: list[tuple[list[Served], float]] = [([], 0.0) for _ in lanes]
    for i, (mode, backend) in enumerate(lanes):
        with clocks.turn(i):
            engines.append(open_engine(backend, mode, settings, concurrency, repeat, clock=clocks.clock(i)))
            schedules.append(schedule_steps(engines[i], prompts, concurrency, arrivals, limits,
                                            on_done=lambda q: tick(), split=splits[i]))
    live = list(range(len(lanes)))
    added = [0] * len(lanes)  # requests each lane's schedule has added to its engine
    while live:
        # a lane that has added more requests than another waits for it, so that both admit request
        # q in consecutive turns: their prefills (a request's time to first token) meet the host alike
        low = min(added[i] for i in live)
        for i in live:  # waiting costs a lane nothing, not even the time between the others' turns
            if added[i] > low:
                clocks.hold(i)
        for i in [i for i in live if added[i] == low]:
            clocks.release(i)
            with clocks.turn(i):
                try:
                    added[i] = next(schedules[i])
                    continue
                except StopIteration as end:
                    outcome[i] = end.value
                except Exception as exc:  # noqa: BLE001 - as in `_execute`: this lane's run fails alone
                    errors[i].append(f"{type(exc).__name__}: {exc}")
                live.remove(i)
                close_engine(engines[i])
    runs = []
    for i, (mode, _) in enumerate(lanes):
        with clocks.turn(i):
            served, makespan = outcome[i]
            runs.append(_record(engines[i], mode, workload, prompts, concurrency, repeat, served, makespan, errors[i],
                                splits[i]))
    return runs


def _record(engine, mode: str, workload: Workload, prompts: list[list[int]], concurrency: int, repeat: int,
            served: list[Served], makespan: float, errors: list[str], split: StepSplit | None = None) -> Run:
    """The `Run` of a finished (or failed) engine: per-request figures from its statistics."""
    result = engine.result()
    stats = result.stats
    by_q = {s.index: s for s in served}
    outputs: list[list[int]] = [[] for _ in prompts]
    reqs = []
    for q in range(len(prompts)):
        s = by_q.get(q)
        if s is None:
            reqs.append({"id": workload.requests[q].id, "prompt_tokens": _length(prompts[q]), "new_tokens": 0,
                         "rounds": 0, "drafted": 0, "accepted": 0, "accepted_by_position": [], "tpot_s": 0.0,
                         "finish_reason": "error", "arrival_s": 0.0, "start_s": 0.0, "ttft_s": 0.0, "e2e_s": 0.0,
                         "queue_s": 0.0})
            continue
        rs, seq = stats.requests[s.engine_index], result.sequences[s.engine_index]
        # token ids, or text from an HTTP endpoint (whose token count is its own `new_tokens`)
        outputs[q] = seq if isinstance(seq, str) else list(seq)
        n_new = rs.new_tokens if isinstance(seq, str) else len(seq)
        if rs.finish_reason == "error":  # a request that failed alone fails its configuration
            errors.append(f"request {workload.requests[q].id}: {rs.error or 'failed'}")
        reqs.append({"id": workload.requests[q].id, "prompt_tokens": rs.prompt_tokens or _length(prompts[q]),
                     "new_tokens": n_new,
                     "rounds": rs.rounds, "drafted": rs.drafted, "accepted": rs.accepted,
                     "accepted_by_position": list(rs.accepted_by_position),
                     "tpot_s": (s.e2e - s.ttft) / (n_new - 1) if n_new > 1 else 0.0,
                     "finish_reason": rs.finish_reason, "arrival_s": s.arrival, "start_s": s.start,
                     "ttft_s": s.ttft, "e2e_s": s.e2e, "queue_s": s.start - s.arrival})
    return Run(mode, concurrency, repeat, reqs, makespan, stats.proposer_s, stats.verifier_s, stats.peak_memory_bytes,
               stats.mean_budget, stats.fallback, outputs, errors,
               split.result(engine) if split is not None else None)


def run_benchmark(workload: Workload, prompts: list[list[int]], backends: dict[str, Any], settings: BenchSettings,
                  progress: bool = True, clock: Callable[[], float] = time.perf_counter) -> list[Run]:
    """Every configuration × repeat. `backends[mode].serve(max_batch, max_new_tokens, do_sample,
    temperature, top_k, top_p, seed, budget)` returns an engine (see `serve_schedule`); a backend may
    also have `fresh()` returning the instance to use for one run. Repeats are the outer loop; inside
    one, each concurrency's modes run in `run_order` (reversed every other repeat).

    With `settings.interleave` (the default), the modes of one concurrency run together when every
    one's `serve` takes a `clock`: their engines take turns, one step each, in that order, and each is
    timed on its own clock, which stops while another engine has its turn (`TurnClocks`). Every figure
    of a run is still that engine's alone, but a drift of a shared machine (its memory bandwidth can
    move within seconds) falls on both modes' steps alike instead of on whichever run it happens to
    meet. Otherwise (an HTTP endpoint, or `interleave` off) the modes run back to back.
    `clock`: the machine's seconds, under the interleaved runs' clocks."""
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
            for c, modes in _by_concurrency(run_order(configs, r)):
                lanes = [(mode, backends[mode].fresh() if hasattr(backends[mode], "fresh") else backends[mode])
                         for mode in modes]
                with settled():
                    if len(lanes) > 1 and interleaves(settings, [b for _, b in lanes]):
                        bar.set_description(f"repeat {r + 1}/{settings.repeat} {'+'.join(modes)} c={c}")
                        runs.extend(_execute_together(lanes, workload, prompts, settings, c, r, arrivals,
                                                      lambda: bar.update(1), clock=clock))
                        continue
                    for mode, backend in lanes:
                        bar.set_description(f"repeat {r + 1}/{settings.repeat} {mode} c={c}")
                        runs.append(_execute(backend, mode, workload, prompts, settings, c, r, arrivals,
                                             lambda: bar.update(1)))
    finally:
        bar.close()
    return runs


@contextmanager
def settled():
    """Around a concurrency's timed runs: what is alive before them is collected and frozen out of the
    garbage collector's reach (as `suffixspec serve` freezes after its warm-up: a full collection
    walks every tracked object, and the benchmark's own records grow run by run), and room is faulted
    in on top of a kept heap (`reserve_memory`). Unfrozen after them."""
    gc.collect()
    reserve_memory()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def interleaves(settings: BenchSettings, backends) -> bool:
    """Whether the modes of one concurrency run together (every backend takes a clock, and
    `settings.interleave`), as `run_benchmark`, `warm_up_all` and the report decide alike."""
    return settings.interleave and all(takes_clock(b) for b in backends)


def takes_clock(backend) -> bool:
    """Whether `backend.serve` takes a `clock` (the engines it returns can take turns)."""
    try:
        return "clock" in inspect.signature(backend.serve).parameters
    except (TypeError, ValueError):
        return False


def _by_concurrency(order: list[tuple[str, int]]) -> list[tuple[int, list[str]]]:
    """Consecutive (mode, concurrency) entries grouped by concurrency, in order."""
    groups: list[tuple[int, list[str]]] = []
    for mode, c in order:
        if groups and groups[-1][0] == c:
            groups[-1][1].append(mode)
        else:
            groups.append((c, [mode]))
    return groups


def run_order(configs: list[tuple[str, int]], repeat: int) -> list[tuple[str, int]]:
    """`configs` (concurrency-major) in the order repeat `repeat` runs them: each concurrency's modes
    as given on even repeats, reversed on odd ones."""
    if repeat % 2 == 0:
        return list(configs)
    by_c: dict[int, list[tuple[str, int]]] = {}
    for mode, c in configs:
        by_c.setdefault(c, []).append((mode, c))
    return [mc for group in by_c.values() for mc in reversed(group)]


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
    the speculative backends), then one batch at the largest concurrency of every mode, at that
    mode's budget, every mode's batch alive at once when the timed runs interleave
    (`warm_up_rows_together`, for the whole output): a mode's first run at a concurrency would
    otherwise pay what only its own passes at that many rows pay once (with two engines alive, the
    second one's first prefill would fault in fresh pages for its whole batch)."""
    configs = _configs(settings, backends)
    if not configs or not prompts:
        return
    first = prompts[0]
    if prompt_tokens is not None and isinstance(first, (list, tuple)):  # token ids (an endpoint's text: all of it)
        first = first[:prompt_tokens]
    for mode in sorted({m for m, _ in configs}):
        try:
            warm_up(backends[mode], first, budget=0 if mode == "plain" else settings.budget, seed=settings.seed)
        except Exception:  # noqa: BLE001 - a broken backend is reported by the timed runs
            pass
    widest: dict[str, int] = {}
    for mode, c in configs:
        widest[mode] = max(widest.get(mode, 0), c)
    together = interleaves(settings, [backends[mode] for mode in widest])
    # back to back, plain: two tokens (its passes have one shape); a drafting mode: enough tokens that
    # its tree passes at that many rows run too. Interleaved: the whole output, as the timed runs do
    # (the pages of both modes' caches, grown to their full length, stay with the process)
    lanes = [(backends[mode], prompts[: widest[mode]], 0 if mode == "plain" else settings.budget,
              settings.max_new_tokens if together else (2 if mode == "plain" else 8)) for mode in sorted(widest)]
    for group in ([lanes] if together else [[lane] for lane in lanes]):
        try:
            warm_up_rows_together(group, seed=settings.seed)
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
    proposer = getattr(backend, "proposer", None) if budget != 0 else None
    if isinstance(proposer, Proposer):  # the paths short requests never reach (a thawed cache level)
        warm_kernels(proposer.corpora or None, threads=proposer.threads)


def warm_up_rows(backend, prompts: list[list[int]], budget=0, seed: int = 0, max_new_tokens: int = 2) -> None:
    """One batch of `prompts` in full, decoded together for `max_new_tokens` tokens through `backend.serve`: the
    first pass of a process over that many rows pays for its memory (a first prefill of a large batch
    is markedly slower than later ones), which would otherwise fall on whichever mode runs first at
    that concurrency."""
    warm_up_rows_together([(backend, prompts, budget, max_new_tokens)], seed=seed)


def warm_up_rows_together(lanes: list[tuple[Any, list[list[int]], Any, int]], seed: int = 0) -> None:
    """`warm_up_rows` of every (backend, prompts, budget, max_new_tokens) lane, their engines taking
    turns step by step as interleaved runs do: the memory of every lane's batch is alive at once, so
    the process holds the pages that interleaved runs need together (the lane whose prefill came
    second would otherwise fault in fresh pages inside its timed run). Lanes of at
    most two prompts are skipped (`warm_up` has served two rows together already)."""
    engines = []
    for backend, prompts, budget, max_new_tokens in lanes:
        if len(prompts) <= 2:
            continue
        backend = backend.fresh() if hasattr(backend, "fresh") else backend
        engine = backend.serve(max_batch=len(prompts), max_new_tokens=max_new_tokens, do_sample=False,
                               temperature=1.0, top_k=None, top_p=None, seed=seed, budget=budget)
        for key, prompt in enumerate(prompts):
            engine.add(prompt, key=key)
        engines.append(engine)
    try:
        while any(not e.idle for e in engines):
            for engine in engines:
                if not engine.idle:
                    engine.step()
    finally:
        for engine in engines:
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
