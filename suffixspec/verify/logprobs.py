"""Log probabilities of chosen tokens and their top alternatives, from a pass's logits.

Contract: logprobs are the model's own: `log_softmax` of the raw logits at the position that chose
the token, before any logits processor, penalty, grammar mask, temperature or truncation (vLLM's
"raw_logprobs" mode). Output tokens' come from the verification pass that accepted them (no pass of
their own), so they equal plain decoding's for the same output up to float rounding.

* `TokenLogprob(token, logprob, top)`: one position; `top` holds the `n` most likely tokens
  (`Alternative`s, most likely first, ties by token id).
* `of_rows(raw [m, V], chosen, n)`: one `TokenLogprob` per row.
* `score_prompt(model, ids, n)`: the prompt's own tokens scored by one pass of the model: entry 0 is
  None (the first token has no context), entry i the logprob of `ids[i]` after `ids[:i]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Alternative", "TokenLogprob", "of_rows", "score_prompt"]


@dataclass(frozen=True)
class Alternative:
    token: int
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[Alternative, ...] = field(default_factory=tuple)


def of_rows(raw, chosen: list[int], n: int) -> list[TokenLogprob]:
    """raw: [m, V] logits; chosen: m token ids; n: alternatives per row (0..20)."""
    import torch

    logp = torch.log_softmax(raw.double(), dim=-1)
    picked = logp.gather(1, torch.tensor(chosen, device=logp.device).view(-1, 1))[:, 0].tolist()
    tops: list[tuple[Alternative, ...]] = [()] * len(chosen)
    if n > 0:
        values, ids = torch.topk(logp, k=min(int(n), logp.shape[-1]), dim=-1)
        tops = [tuple(Alternative(int(t), float(v)) for t, v in zip(row_ids, row_vals))
                for row_ids, row_vals in zip(ids.tolist(), values.tolist())]
    return [TokenLogprob(int(tok), float(lp), top) for tok, lp, top in zip(chosen, picked, tops)]


def score_prompt(model, ids: list[int], n: int, chunk: int = 512) -> list[TokenLogprob | None]:
    """The prompt's tokens scored by the model (read in chunks of `chunk` tokens over a cache)."""
    import torch
    from transformers import DynamicCache

    device = next(model.parameters()).device
    out: list[TokenLogprob | None] = [None]
    cache = DynamicCache()
    with torch.inference_mode():
        for start in range(0, len(ids) - 1, chunk):
            piece = ids[start : start + chunk]
            logits = model(input_ids=torch.tensor([piece], device=device), past_key_values=cache,
                           use_cache=True).logits[0]
            nxt = ids[start + 1 : start + 1 + len(piece)]
            out.extend(of_rows(logits[: len(nxt)], nxt, n))
    return out[: len(ids)]
