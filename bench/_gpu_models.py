"""Random-weight Llama-style models for `gpu_check.py`, built from a config on the device, and the
verifier's pass timed on them.

Contract
--------
- ``SHAPES``: name -> ``LlamaConfig`` fields. ``0.5B`` / ``1.5B`` / ``7B`` have the shapes of
  Qwen2.5-0.5B / 1.5B / 7B (layers, widths, grouped key/value heads, vocabulary; no attention
  biases); ``tiny-s`` / ``tiny-m`` are the CPU path's stand-ins.
- ``build(name, device, dtype, init_range=0.02, seed=0, cast=None)``: the model, eval, "sdpa"
  attention, its weights drawn on `device` in `dtype` (``torch.device`` context: no CPU copy, no
  download), then cast to `cast` if given; on the CPU also prepared (unless `prepare` is False) as
  `suffixspec.models.load_model` prepares models (`prepare_model`: oneDNN layers, grouped attention).
- ``pass_times(model, points, past, warmup, repeats, deadline)``: the verifier's pass time at each
  ``(batch, width)`` of `points` (width: tokens fed per row, a one-token step at width 1, else a
  chain of width - 1 draft nodes after the pending token) over a `past`-token cache; on CUDA with
  CUDA events around `KVState.forward` (``gpu_ms``), always with the host clock up to the
  synchronisation that follows (``wall_ms``); medians of `repeats` after `warmup` passes. Points
  not reached by `deadline` (``time.monotonic``) are left out.
"""

from __future__ import annotations

import time

import numpy as np

SHAPES = {
    "0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    "tiny-s": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True),
    "tiny-m": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=8,
                   num_key_value_heads=2, vocab_size=2048, tie_word_embeddings=True),
}


def build(name: str, device, dtype, init_range: float = 0.02, seed: int = 0, cast=None, prepare: bool = True):
    import torch
    import transformers

    fields = SHAPES[name] if isinstance(name, str) else dict(name)
    config = transformers.LlamaConfig(max_position_embeddings=8192, initializer_range=init_range,
                                      bos_token_id=0, eos_token_id=None, pad_token_id=0, **fields)
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    if cast is not None:
        model.to(cast)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    if prepare and torch.device(device).type == "cpu":
        from suffixspec.models import prepare_model

        prepare_model(model)
    return model


def parameters(model) -> int:
    return int(sum(p.numel() for p in model.parameters()))


def _filled_state(model, batch: int, past: int, rng):
    """A `KVState` of `batch` rows holding the same `past` random tokens (one row's prefill, its rows
    repeated: the cost of a pass depends on the cache's length, not its contents)."""
    from suffixspec.draft.tree import DraftTree
    from suffixspec.verify.kv import KVState

    vocab = int(model.get_input_embeddings().weight.shape[0])
    state = KVState(model, 1)
    state.forward([rng.integers(0, vocab, past).tolist()], [DraftTree.empty()])
    state.commit([[]])
    state.select_rows([0] * batch)
    return state


def pass_times(model, points, past: int, warmup: int = 2, repeats: int = 5, deadline: float | None = None) -> list[dict]:
    """See the module docstring; one dict per measured point."""
    import torch

    from suffixspec.draft.tree import DraftTree

    rng = np.random.default_rng(0)
    vocab = int(model.get_input_embeddings().weight.shape[0])
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    out, state, rows = [], None, 0
    for batch, width in points:
        if deadline is not None and time.monotonic() > deadline:
            break
        if batch != rows:
            state, rows = None, batch
            if cuda:
                torch.cuda.empty_cache()
            state = _filled_state(model, batch, past, rng)
        tree = DraftTree(rng.integers(0, vocab, width - 1), np.arange(width - 1) - 1) if width > 1 else DraftTree.empty()
        gpu, wall = [], []
        for rep in range(warmup + repeats):
            pending = [[int(t)] for t in rng.integers(0, vocab, batch)]
            if cuda:
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t = time.perf_counter()
            state.forward(pending, [tree] * batch)
            if cuda:
                end.record()
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t
            state.commit([[]] * batch)  # keeps the pending tokens: the cache grows by one a pass
            if rep >= warmup:
                wall.append(seconds * 1e3)
                if cuda:
                    gpu.append(start.elapsed_time(end))
        point = {"batch": batch, "width": width, "tokens": batch * width,
                 "wall_ms": round(float(np.median(wall)), 4)}
        if gpu:
            point["gpu_ms"] = round(float(np.median(gpu)), 4)
        out.append(point)
    return out


def prefill_ms(model, past: int) -> float:
    """The host-clock time of one row's prefill of `past` tokens (after one of a quarter the length)."""
    import torch

    rng = np.random.default_rng(1)
    cuda = next(model.parameters()).device.type == "cuda"
    _filled_state(model, 1, max(1, past // 4), rng)
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    _filled_state(model, 1, past, rng)
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3
