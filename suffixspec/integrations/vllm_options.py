"""The vLLM adapters' options and what they read of vLLM's config (both front ends: `vllm.py` for
vLLM <= 0.33's `custom_class`, `vllm_speculator.py` for vLLM >= 0.34's registered speculator).

Options (all optional) come from `vllm_config.additional_config["suffixspec"]`, and on vLLM >= 0.34
also from `speculative_config.speculator_options` (an option given in both is refused by name); see
`OPTIONS`: every knob of `ProposerConfig` (its fields, types and defaults; `KNOB_DEFAULTS` lists the
defaults that differ here, `KNOBS_NOT_TAKEN` the knobs the adapter does not take) and the adapter's
own (`ADAPTER_OPTIONS`). A value of the wrong type is a BadInputTypeError, one out of range the
config's BadInputError naming the knob. vLLM's `suffix_decoding_max_tree_depth` and
`suffix_decoding_min_token_prob`, when set to other than their defaults, become `max_depth` and
`min_prob` unless those are given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import BadInputError, BadInputTypeError
from ..draft.config import KNOBS


@dataclass(frozen=True)
class Option:
    """An option of `additional_config["suffixspec"]`: the Python types its value may have, what it
    does, and its default here (a value, or in words how the adapter computes it)."""

    types: tuple[type, ...]
    doc: str
    default: Any


# the adapter's own options (the proposer's knobs come from `ProposerConfig`, below)
ADAPTER_OPTIONS = {
    "corpus": Option((str, list, tuple), "corpus index path(s), opened memory-mapped", None),
    "filter": Option((dict,), "document tags every session's corpus queries are restricted to", None),
    "max_sessions": Option((int,), "live sessions kept", "max(256, 4 * max_num_seqs)"),
    "session_timeout_steps": Option((int,), "close a session not seen for this many steps (>= 2)",
                                    "2, raised to twice the longest absence a request came back from (at most 64)"),
    "step_cost": Option((list, tuple), "[[tokens, cost], ...] relative cost of a step verifying that many tokens "
                        "(overrides the cost measured online)", "measured online per batch size, from a conservative prior"),
    "close_in_background": Option((bool,), "close sessions (their output joins the cache) on a worker thread", True),
}
# proposer knobs whose default differs here
KNOB_DEFAULTS = {
    "max_nodes": "max(16, 4 * num_speculative_tokens)",
    "max_depth": "num_speculative_tokens (a larger value is cut to it)",
    "recency": 0.0,  # linear drafts: frequency alone (fewer steps on code-edit traces than 0.5)
}
# proposer knobs the adapter does not take, and why
KNOBS_NOT_TAKEN = {"vocab_size": "drafts are cut at the model's vocabulary (`best_paths`); rows are never refused"}
# every option: the proposer's knobs (`ProposerConfig`'s fields) and the adapter's own
OPTIONS = {
    **{name: Option(spec.types, spec.doc, KNOB_DEFAULTS.get(name, spec.default))
       for name, spec in KNOBS.items() if name not in KNOBS_NOT_TAKEN},
    **ADAPTER_OPTIONS,
}


def _config_options(vllm_config) -> dict:
    extra = getattr(vllm_config, "additional_config", None) or {}
    if not isinstance(extra, dict):
        raise BadInputTypeError(f"additional_config: expected a dict, got {type(extra).__name__}", param="additional_config")
    return _checked_options(extra.get("suffixspec") or {}, 'additional_config["suffixspec"]')


def _checked_options(opts, where: str) -> dict:
    """`opts` (a dict of options named in `OPTIONS`, each of its types), copied."""
    if not isinstance(opts, dict):
        raise BadInputTypeError(f"{where}: expected a dict, got {type(opts).__name__}")
    for key, value in opts.items():
        if key not in OPTIONS:
            raise BadInputError(f"{where}: unknown option {key!r}; expected one of {sorted(OPTIONS)}")
        types = OPTIONS[key].types
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join("None" if t is type(None) else t.__name__ for t in types)
            raise BadInputTypeError(f'{where}["{key}"] ({OPTIONS[key].doc}): expected {names}, got {value!r}')
    return dict(opts)


def _changed_field(spec, name: str):
    """`spec.name` when it differs from the field's declared default (None when unset or absent)."""
    value = getattr(spec, name, None)
    if value is None:
        return None
    fields = getattr(type(spec), "__dataclass_fields__", None) or getattr(type(spec), "model_fields", None) or {}
    field = fields.get(name)
    default = getattr(field, "default", None)
    return None if default is not None and value == default else value


def _knobs(opts: dict, k: int) -> dict:
    """The proposer's knobs among `opts`, with the adapter's defaults (`KNOB_DEFAULTS`) where absent."""
    knobs = {name: opts[name] for name in KNOBS if name in opts}
    knobs["max_nodes"] = opts.get("max_nodes", max(16, 4 * k))
    knobs["max_depth"] = min(int(opts.get("max_depth", k) or k), k)
    knobs["min_prob"] = opts.get("min_prob", 0.0)
    knobs.setdefault("recency", KNOB_DEFAULTS["recency"])
    return knobs



@dataclass(frozen=True)
class VllmSetup:
    """What the adapter takes from vLLM's config: the draft length cap `k`, the model's length and
    vocabulary, the scheduler's batch cap, and the options (validated, vLLM's suffix fields mapped)."""

    k: int
    max_model_len: int | None
    vocab_size: int
    max_num_seqs: int
    options: dict


def read_vllm_config(vllm_config, extra: dict | None = None) -> VllmSetup:
    """The `VllmSetup` of `vllm_config` (duck-typed: vLLM's objects are read, never imported);
    `extra` holds options given elsewhere (vLLM >= 0.34's `speculator_options`)."""
    spec = getattr(vllm_config, "speculative_config", None)
    k = getattr(spec, "num_speculative_tokens", None)
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
        raise BadInputError(f"speculative_config.num_speculative_tokens: expected a positive int, got {k!r}", param="speculative_config.num_speculative_tokens")
    model_config = getattr(vllm_config, "model_config", None)
    max_model_len = int(getattr(model_config, "max_model_len", 0) or 0) or None
    vocab = None
    get_vocab = getattr(model_config, "get_vocab_size", None)
    if callable(get_vocab):
        vocab = get_vocab()
    if vocab is None:
        vocab = getattr(getattr(model_config, "hf_config", None), "vocab_size", None)
    max_num_seqs = int(getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", 0) or 0)
    opts = _config_options(vllm_config)
    if extra:
        more = _checked_options(extra, "speculative_config.speculator_options")
        both = sorted(set(opts) & set(more))
        if both:
            raise BadInputError(f'{both[0]}: given both in additional_config["suffixspec"] and in '
                                f'speculative_config.speculator_options; give it once', param=both[0])
        opts.update(more)
    for ours, theirs in (("max_depth", "suffix_decoding_max_tree_depth"), ("min_prob", "suffix_decoding_min_token_prob")):
        value = _changed_field(spec, theirs) if spec is not None else None
        if ours not in opts and value is not None:
            opts[ours] = value
    return VllmSetup(int(k), max_model_len, int(vocab) if vocab else 2**31 - 1, max_num_seqs, opts)
