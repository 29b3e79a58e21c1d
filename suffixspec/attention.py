"""An attention implementation for transformers models on the CPU: PyTorch's scaled-dot-product
attention fed the grouped key/value heads as they are (``enable_gqa``), also under an explicit mask.

Contract:

* ``NAME`` (``"suffixspec_sdpa"``) is registered with transformers' attention and mask interfaces by
  `use_grouped_sdpa(model)`, which switches a model that uses ``"sdpa"`` to it and returns whether
  it did. The outputs are those of transformers' ``"sdpa"`` within float rounding.
* With a mask (every draft-tree pass) transformers' ``"sdpa"`` copies each layer's keys and values
  once per query head group before attending; the CPU kernel takes grouped heads with a mask
  directly. Other devices, calls without a mask and calls with a position bias or a softcap go to
  transformers' own function unchanged.
"""

from __future__ import annotations

NAME = "suffixspec_sdpa"

__all__ = ["NAME", "use_grouped_sdpa"]

_registered = False
_default_sdpa = None  # transformers' own sdpa attention, bound by _register (imported once, not per layer call)


def _grouped_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """query [b, heads, q, d], key/value [b, kv_heads, k, d], mask [b, 1, q, k] -> ([b, q, heads, d], None)."""
    if (attention_mask is None or query.device.type != "cpu" or getattr(module, "num_key_value_groups", 1) <= 1
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or kwargs.get("output_attentions", False)):
        default = _default_sdpa
        if default is None:  # registered by hand, or this module reloaded
            from transformers.integrations.sdpa_attention import sdpa_attention_forward as default
        return default(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                       is_causal=is_causal, **kwargs)
    import torch

    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )  # [b, heads, q, d]
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    global _registered, _default_sdpa
    if not _registered:
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import sdpa_mask

        _default_sdpa = sdpa_attention_forward

        AttentionInterface.register(NAME, _grouped_sdpa)
        AttentionMaskInterface.register(NAME, sdpa_mask)
        _registered = True


def use_grouped_sdpa(model) -> bool:
    """Switch `model` (on the CPU, ``"sdpa"`` attention, fewer key/value heads than query heads) to `NAME`."""
    config = model.config
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if (getattr(config, "_attn_implementation", None) != "sdpa" or not heads or not kv_heads or kv_heads >= heads
            or next(model.parameters()).device.type != "cpu" or not hasattr(model, "set_attn_implementation")):
        return False
    try:
        _register()
        model.set_attn_implementation(NAME)
    except (ImportError, ValueError, AttributeError, TypeError):  # an older transformers: keep "sdpa"
        return False
    return getattr(model.config, "_attn_implementation", None) == NAME
