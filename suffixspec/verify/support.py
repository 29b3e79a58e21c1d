"""What a model must offer for tree verification, read off the model without running it.

* `tree_attention_support(model)`: None when `kv.KVState` can verify trees with `model`, else the
  reason it cannot (attention implementation, layer types, encoder-decoder, transformers' cache);
* `cache_argument`, `accepts_logits_to_keep`, `layer_types`: the probes `KVState` reads once per
  model (the cache's keyword, whether logits can be kept for the last inputs only, the layer types
  and sliding window of the text config);
* `warn_once(message)`: a `RuntimeWarning`, once per message per process.

Imports neither torch nor transformers at import time.
"""

from __future__ import annotations

import inspect
import warnings

__all__ = ["accepts_logits_to_keep", "cache_argument", "layer_types", "tree_attention_support", "warn_once"]


def cache_argument(model) -> str:
    """The name under which `model.forward` takes the KV cache."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def accepts_logits_to_keep(model) -> bool:
    """Whether `model.forward` can compute the logits of the last inputs only."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def layer_types(config) -> tuple[list[str] | None, int | None]:
    """Layer types and sliding window of a text config (None: one plain causal mask for all)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if types is not None:
        return list(types), window
    if window is not None and getattr(config, "use_sliding_window", True):
        return ["sliding_attention"] * int(getattr(config, "num_hidden_layers", 1)), window
    return None, None


def tree_attention_support(model) -> str | None:
    """None when `KVState` can verify trees with `model`, else the reason it cannot."""
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in (None, "eager", "sdpa", "suffixspec_sdpa"):
        return f"attention implementation {impl!r} does not take an explicit float tree mask (use 'sdpa' or 'eager')"
    types, window = layer_types(model.config)
    if types is not None:
        unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
        if unknown:
            return f"layer types {unknown} are not supported by tree verification"
        if "sliding_attention" in types and not window:
            return "sliding-window layers without a window size"
    if getattr(model.config, "is_encoder_decoder", False):
        return "encoder-decoder models are not supported"
    try:
        from transformers import DynamicCache

        if not hasattr(DynamicCache(), "layers"):
            return "this transformers version's DynamicCache has no per-layer tensors"
    except Exception as exc:  # pragma: no cover - very old transformers
        return f"transformers has no usable DynamicCache ({exc})"
    return None


def warn_once(message: str, _seen=set()) -> None:  # noqa: B006 - deliberate module-level memo
    """A `RuntimeWarning` with `message`, the first time only."""
    if message not in _seen:
        _seen.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
