"""What decodes when the fast path cannot: transformers' own `generate` for models tree verification
cannot serve, and a minimal prompt-lookup proposer for when `suffixspec.Proposer` is unavailable.

`plain_generate` decodes one prompt with the model's own `generate` under resolved `Decoding`
options and returns the output cut where `Decoding.take` ends it, with the finish reason;
`serve_plain` is the `Engine`'s step for such a model.
"""

from __future__ import annotations

import numpy as np

from ..draft.tree import DraftTree

__all__ = ["plain_generate", "serve_plain", "PromptLookupProposer"]


def plain_generate(model, prompt: list[int], decoding, key: int, max_new: int) -> tuple[list[int], str]:
    """Decode `prompt` with transformers' `generate` (sampling draws seeded by the sampler's seed plus
    `key`); the output up to its end and the finish reason."""
    import torch

    sampler, eos, opts = decoding.sampler, decoding.eos, decoding.options
    device = next(model.parameters()).device
    kwargs = dict(max_new_tokens=max_new, do_sample=opts.do_sample, logits_processor=sampler.processors,
                  pad_token_id=next(iter(eos)) if eos else 0)
    if eos:
        kwargs["eos_token_id"] = sorted(eos)
    if opts.do_sample:
        torch.manual_seed(sampler.seed + key)
        kwargs.update(temperature=opts.temperature, top_k=opts.top_k or 0,
                      top_p=opts.top_p if opts.top_p is not None else 1.0, min_p=opts.min_p)
    with torch.inference_mode():
        ids = torch.tensor([prompt], device=device)
        seq = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)[0, len(prompt):].tolist()
    out: list[int] = []
    _, reason = decoding.take(out, seq, max_new)
    return out, reason or "length"


class PromptLookupProposer:
    """A minimal stand-in proposer (used when `suffixspec.Proposer` is unavailable): the tokens
    that followed the most recent earlier occurrence of the longest matching suffix n-gram."""

    def __init__(self, corpus=None, max_ngram: int = 3, **_options):
        self.max_ngram = max_ngram

    def start(self, prompt_ids, request_id=None, filter=None):
        return LookupSession(list(map(int, prompt_ids)), self.max_ngram)


class LookupSession:
    def __init__(self, tokens, max_ngram):
        self.tokens, self.max_ngram = tokens, max_ngram

    def extend(self, tokens):
        self.tokens.extend(int(t) for t in tokens)

    def propose(self, budget):
        toks = self.tokens
        for n in range(min(self.max_ngram, len(toks) - 1), 0, -1):
            tail = toks[-n:]
            for start in range(len(toks) - n - 1, -1, -1):
                if toks[start : start + n] == tail:
                    draft = toks[start + n : start + n + budget]
                    if draft:
                        scores = 0.8 ** np.arange(1, len(draft) + 1)
                        return DraftTree(draft, np.arange(len(draft)) - 1, scores)
        return DraftTree.empty()

    def close(self):
        pass


def serve_plain(engine, rq, step) -> None:
    """`Engine`'s path for a model tree verification cannot serve: transformers' own generate for
    request `rq`, in one step (`step` gets its admission and its event)."""
    from ..verify.support import warn_once
    from .lifecycle import Event, Stage

    warn_once(f"suffixspec: speculation disabled for this model ({engine.unsupported}); using plain decoding")
    step.admitted.append(rq.index)
    rq.move(Stage.RUNNING)
    rs = rq.stats
    start = engine.now()
    rs.queue_s = start - rq.added_s
    try:
        out, reason = plain_generate(engine.model, rq.context, rq.decoding, rq.key, rq.max_new)
    except Exception as exc:  # noqa: BLE001 - this request's own failure
        engine.end_request(rq, "error", f"{type(exc).__name__}: {exc}", step.events, engine.now())
        return
    end = engine.now()
    engine.stats.verifier_s += end - start
    rs.new_tokens, rs.rounds, rs.committed_per_round = len(out), len(out), [1] * len(out)
    rs.ttft_s = rs.e2e_s = end - rq.added_s
    rs.finish_reason = reason
    engine.stats.rounds += len(out)
    engine.stats.plain_rounds += len(out)
    engine.stats.fallback = engine.unsupported
    rq.output.extend(out)
    rq.context.extend(out)
    rq.move(Stage.FINISHED)
    if engine.stream is not None and out:
        engine.stream(rq.index, list(out))
    step.events.append(Event(rq.index, list(out), end, reason))
