"""Validate-before-rollout benchmark: plain vs speculative decoding on your prompts and load.

Terms (used throughout):

- *configuration*: (mode, concurrency[, qps]); *mode* is `plain` (this package's own decoding loop
  with no drafts, `budget=0`: the same runtime, cache code and sampler as `speculative`),
  `speculative` (`SpeculativeGenerator` with the requested budget) or `prompt_lookup`
  (transformers' `generate(prompt_lookup_num_tokens=...)`, batch size 1, so concurrency 1 only).
  Against an HTTP endpoint (`suffixspec.bench.remote`) the modes are named request-body extensions.
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
exactly predictable (`tests/test_bench.py`). In this process the modes of one concurrency run
together, their engines taking turns step by step, each on a clock that stops during the other's
turns (`runs.run_benchmark`): both see the same drift of a shared machine. Sampling draws are keyed
by (seed, request index in the workload, position) in every mode, so plain and speculative runs
use the same draws.

The speculative proposer is fresh for every run (its response cache learns within a run, as it
would in serving, but never from an earlier repeat of the same prompts).

Layout, in the order data flows: `workloads` (prompt sets) -> `schedule` (arrivals, the loop that
drives an engine and times requests) -> `runs` (settings, configurations x repeats, warm-ups) ->
`summary` (records over repeats, speed-ups, mismatches) -> `quality` (task gates) and `report`
(table, JSON, plots), `grid` (the rollout grid's verdicts and heat map); `backends` holds the
in-process engines, `remote` the client of an OpenAI-compatible endpoint (`suffixspec bench --url`).
`record` appends a benchmark's JSON line, with date, host and git revision, to a results file
(`--record`), `peers` holds the peers' n-gram rules re-implemented. This package re-exports the public
names of the modules up to `backends` (`grid`, `remote`, `record` and `peers` are imported by name); importing it imports neither torch nor a web stack (httpx only once an HTTP
engine is built).
"""

from __future__ import annotations

from .backends import OneAtATime, PromptLookupBackend, SpeculativeBackend, keep_freed_memory, reserve_memory
from .quality import CharsetConstraint, humaneval_passes, numeric_correct, quality_gate, wilson_interval
from .report import environment, format_table, write_plots, write_report
from .runs import MODES, BenchSettings, Run, interleaves, run_benchmark, run_order, takes_clock, warm_up, warm_up_all, warm_up_rows
from .schedule import Served, TurnClocks, poisson_arrivals, schedule_steps, serve_schedule
from .summary import summarize
from .workloads import (
    FIRST_TURN_TOKENS, SYSTEM, WORKLOADS, Request, Workload, chatml, chatml_followup, load_workload,
    prepare_followups, resolve_followups, user_turn,
)

__all__ = [
    "Request", "Workload", "load_workload", "prepare_followups", "resolve_followups", "WORKLOADS", "SYSTEM", "chatml",
    "user_turn", "chatml_followup",
    "FIRST_TURN_TOKENS", "MODES", "BenchSettings", "Run", "Served", "poisson_arrivals", "serve_schedule",
    "schedule_steps", "TurnClocks", "run_benchmark", "run_order", "interleaves", "takes_clock", "warm_up", "warm_up_all",
    "warm_up_rows", "summarize", "format_table", "write_report", "write_plots", "environment", "keep_freed_memory",
    "reserve_memory",     "CharsetConstraint", "wilson_interval", "humaneval_passes", "numeric_correct",
    "quality_gate", "SpeculativeBackend", "PromptLookupBackend", "OneAtATime",
]
