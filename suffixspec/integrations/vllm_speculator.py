"""`SuffixSpecSpeculator`: suffixspec as vLLM >= 0.34's registered speculative method "suffixspec".

Installing suffixspec is all a user does: its `vllm.general_plugins` entry point (`suffixspec_vllm`,
a light module outside this package) registers the method in every vLLM process, and

    LLM(model=..., speculative_config={"method": "suffixspec", "num_speculative_tokens": 8,
                                       "speculator_options": {"corpus": ["code.idx"]}})

drafts from the same `DraftCore` as the <= 0.33 front end (`vllm.py`). vLLM imports this module in
the worker that runs the model, after its engine started; it imports torch and vllm.

Contract (vLLM 0.34.0's calling convention; docs/architecture.md, "vLLM", names its files):
- built as `cls(vllm_config, device, req_states=req_states)`; `propose(input_batch, ...,
  num_sampled, ..., num_speculative_tokens=None) -> Tensor` runs after the step's sampled tokens were
  written into `req_states`; row i's request-state slot is `input_batch.idx_mapping[i]`;
  `num_sampled[i]` is 0 for a partial prefill;
- hooks: `add_request(req_index)`, `on_requests_finished(req_ids)`, `reset_state()`,
  `update_max_model_len(n)`; a dummy run returns a tensor of the right shape and changes no state;
- the result is `[num_reqs, k]` token ids on the device, batch order, and every row verifies all k:
  a row takes its best path up to k and the slots beyond hold its last token (verified and rejected
  at no extra cost); per-slot confidences are the path's node scores (0 for filler), so adaptive
  verification, where enabled, cuts what does not pay."""

from __future__ import annotations

import numpy as np
import torch
from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator

from .. import BadInputTypeError
from .vllm import register_instance
from .vllm_core import DraftCore
from .vllm_options import read_vllm_config

# propose's parameters after input_batch, in vLLM 0.34's order (positional or keyword)
PROPOSE_PARAMETERS = ("attn_metadata", "slot_mappings", "last_hidden_states", "aux_hidden_states", "num_sampled",
                      "num_rejected", "last_sampled", "next_prefill_tokens", "temperature", "seeds", "dp_sync_state",
                      "dummy_run", "skip_attn_for_dummy_run", "mm_inputs", "is_profile", "num_speculative_tokens")


def _bind(args: tuple, kwargs: dict) -> dict:
    """propose's arguments by name (its signature is wider than this project's functions may be)."""
    if len(args) > len(PROPOSE_PARAMETERS):
        raise TypeError(f"propose: at most {len(PROPOSE_PARAMETERS) + 1} positional arguments, got {len(args) + 1}")
    bound = dict(zip(PROPOSE_PARAMETERS, args))
    for name, value in kwargs.items():
        if name not in PROPOSE_PARAMETERS:
            raise TypeError(f"propose: unexpected argument {name!r}")
        if name in bound:
            raise TypeError(f"propose: argument {name!r} given twice")
        bound[name] = value
    if "num_sampled" not in bound:
        raise TypeError("propose: missing argument 'num_sampled'")
    return bound


class SuffixSpecSpeculator(BaseSpeculator):
    """vLLM >= 0.34 speculator over a `DraftCore` (see the module docstring). `stats` and the other
    attributes not defined here are the core's."""

    def __init__(self, vllm_config, device, req_states=None):
        spec = getattr(vllm_config, "speculative_config", None)
        extra = getattr(spec, "speculator_options", None)
        if extra is not None and not isinstance(extra, dict):
            raise BadInputTypeError(f"speculative_config.speculator_options: expected a dict, got {type(extra).__name__}",
                                    param="speculator_options")
        self.core = DraftCore(read_vllm_config(vllm_config, extra))
        self.device = device
        self.req_states = req_states
        self.max_num_reqs = int(getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", 0) or 0) or 1
        self.max_model_len = self.core.max_model_len
        self.enable_adaptive_verification = bool(getattr(spec, "enable_adaptive_verification", False))
        k = self.core.k
        self.drafts = torch.zeros((self.max_num_reqs, k), dtype=torch.int64, device=device)  # [max_num_reqs, k], batch order
        self.draft_token_confidence_probs = torch.zeros((self.max_num_reqs, k), dtype=torch.float32, device=device)
        register_instance(self)

    def __getattr__(self, name):
        if name == "core":  # not yet set: a failed __init__
            raise AttributeError(name)
        return getattr(self.core, name)

    # -- vLLM's interface ----------------------------------------------------------------------
    def init_cudagraph_manager(self, cudagraph_mode) -> None:
        """No graphs: drafting runs on the host."""

    def capture(self) -> None:
        """No graphs to capture."""

    def add_request(self, req_index: int) -> None:
        self.core.forget(int(req_index))

    def on_requests_finished(self, finished_req_ids) -> None:
        index = getattr(self.req_states, "req_id_to_index", {})
        for req_id in sorted(finished_req_ids):
            slot = index.get(req_id)
            if slot is not None:
                self.core.finish(int(slot))

    def reset_state(self) -> None:
        """After vLLM's warm-up requests: their sessions and cached outputs are not the users'."""
        self.core.close()
        self.core.proposer = type(self.core.proposer)(self.core.corpora or None, config=self.core.config)

    def update_max_model_len(self, max_model_len: int) -> None:
        self.max_model_len = self.core.max_model_len = int(max_model_len)

    @torch.inference_mode()
    def propose(self, input_batch, *args, **kwargs) -> torch.Tensor:
        """[num_reqs, k] draft token ids, batch order (see the module docstring)."""
        a = _bind(args, kwargs)
        num_reqs = int(input_batch.num_reqs)
        out = self.drafts[:num_reqs]
        width = a.get("num_speculative_tokens")
        width = self.core.k if width is None else min(int(width), self.core.k)
        if a.get("dummy_run") or num_reqs == 0 or width <= 0:
            return out
        slots = np.asarray(getattr(input_batch, "idx_mapping_np", None)
                           if getattr(input_batch, "idx_mapping_np", None) is not None
                           else input_batch.idx_mapping.cpu().numpy())[:num_reqs].astype(np.int64)
        idx = input_batch.idx_mapping[:num_reqs]
        sampled = a["num_sampled"][:num_reqs].cpu().numpy()
        lengths = self.req_states.total_len.gpu[idx].cpu().numpy().astype(np.int64)
        width_all = int(lengths.max()) if lengths.size else 0
        table = self.req_states.all_token_ids.gpu[idx, :max(width_all, 1)].cpu().numpy()
        drafts = self.core.step(slots.tolist(), sampled, lengths, table, limit_len=self.max_model_len, k=width,
                                fixed_width=not self.enable_adaptive_verification)
        tokens = np.empty((num_reqs, self.core.k), np.int64)
        tokens[:] = table[np.arange(num_reqs), np.maximum(lengths - 1, 0)][:, None]  # filler: the row's last token
        confidence = np.zeros((num_reqs, self.core.k), np.float32)
        for r, (d, s) in enumerate(zip(drafts, self.core.scores)):
            tokens[r, : len(d)] = d
            confidence[r, : len(s)] = s
        out.copy_(torch.from_numpy(tokens), non_blocking=False)
        self.draft_token_confidence_probs[:num_reqs].copy_(torch.from_numpy(confidence))
        return out
