"""Validate-before-rollout benchmark: plain vs speculative decoding on your prompts and load.

Terms: a *configuration* is (mode, concurrency[, qps]), the *mode* `plain` (this package's loop with no
drafts, `budget=0`), `speculative` or `prompt_lookup` (transformers', concurrency 1 only); against an
HTTP endpoint (`remote`) the modes are request-body extensions. A *run* is one configuration over the
whole workload once; an *engine* is what a backend's `serve(max_batch=C, ...)` returns (continuous
batching, `suffixspec.engine.engine.Engine`).

Contract:
- arrivals (`arrivals.kind`): closed loop at concurrency C, or Poisson at rate R with up to C running
  (later requests queue, FIFO); TTFT and end-to-end latency include queueing;
- times are the engine's clock plus the idle gaps skipped while waiting for an arrival (nothing
  sleeps), so a fake engine with known costs makes every figure exactly predictable;
- the modes of one concurrency run together, their engines taking turns step by step, each on a
  clock that stops during the other's turns; sampling draws are keyed by (seed, request, position)
  in every mode, so plain and speculative runs use the same draws;
- the speculative proposer is fresh for every run (it never learns from an earlier repeat).

Layout, in the order data flows: `workloads` -> `schedule` (arrivals, the loop that drives an engine)
-> `runs` (configurations x repeats, warm-ups) -> `summary` -> `quality` and `report` (table, JSON,
plots), `grid` (the rollout grid); `backends` holds the in-process engines, `remote` the client of an
OpenAI-compatible endpoint, `record` the results file, `peers` the peers' n-gram rules, `timesplit`
where a run's time goes. The editor workload (sessions typed against an engine, superseded requests
cancelled) is `editor` (sessions) -> `editor_run` -> `editor_summary`. This package
re-exports the public names of the modules up to `backends`; importing it imports neither torch nor a
web stack."""

from __future__ import annotations

from .backends import OneAtATime, PromptLookupBackend, SpeculativeBackend, keep_freed_memory, reserve_memory
from .quality import CharsetConstraint, humaneval_passes, numeric_correct, quality_gate, wilson_interval
from .report import environment, format_table, write_plots, write_report
from .runs import (
    MODES,
    BenchSettings,
    Run,
    interleaves,
    run_benchmark,
    run_order,
    takes_clock,
    warm_up,
    warm_up_all,
    warm_up_rows,
)
from .schedule import Served, TurnClocks, poisson_arrivals, schedule_steps, serve_schedule
from .summary import summarize
from .workloads import (
    FIRST_TURN_TOKENS,
    SYSTEM,
    WORKLOADS,
    Request,
    Workload,
    chatml,
    chatml_followup,
    load_workload,
    prepare_followups,
    resolve_followups,
    user_turn,
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
