"""Logits processors of the decoding options: penalties and a minimum output length.

Contract: each is a transformers-style `LogitsProcessor` (`processor(input_ids [m, L], scores [m, V])
-> scores`), where `input_ids` is a row's whole token context (prompt, then the output so far) and
`prompt_len` (given at construction, one request per processor) says where its output starts. The
verifier calls them at every node of a draft tree with that node's own context, and transformers'
`generate` (the fallback) calls them the same way, so a request decodes identically on either path.

* `OutputPenalties`: OpenAI's `frequency_penalty` and `presence_penalty` over the output so far
  (`score[j] -= count[j] * frequency + (count[j] > 0) * presence`), and the `repetition_penalty`
  (as transformers and vLLM define it) over the whole context: a seen token's positive score is
  divided by it, a negative one multiplied.
* `MinTokens`: until the output holds `min_tokens` tokens, the ids that would end it (end-of-sequence
  and stop token ids) score -inf.
"""

from __future__ import annotations

__all__ = ["OutputPenalties", "MinTokens"]


class OutputPenalties:
    def __init__(self, prompt_len: int, frequency: float = 0.0, presence: float = 0.0, repetition: float = 1.0):
        self.prompt_len = int(prompt_len)
        self.frequency, self.presence, self.repetition = float(frequency), float(presence), float(repetition)

    def __call__(self, input_ids, scores):
        import torch

        scores = scores.clone()
        if self.repetition != 1.0 and input_ids.shape[1]:
            seen = torch.gather(scores, 1, input_ids)
            seen = torch.where(seen > 0, seen / self.repetition, seen * self.repetition)
            scores.scatter_(1, input_ids, seen)
        out = input_ids[:, self.prompt_len:]
        if (self.frequency or self.presence) and out.shape[1]:
            counts = torch.zeros_like(scores).scatter_add_(1, out, torch.ones(out.shape, dtype=scores.dtype,
                                                                               device=scores.device))
            scores -= counts * self.frequency + (counts > 0).to(scores.dtype) * self.presence
        return scores


class MinTokens:
    def __init__(self, prompt_len: int, min_tokens: int, banned):
        self.prompt_len, self.min_tokens = int(prompt_len), int(min_tokens)
        self.banned = sorted(int(t) for t in banned)

    def __call__(self, input_ids, scores):
        if not self.banned or input_ids.shape[1] - self.prompt_len >= self.min_tokens:
            return scores
        scores = scores.clone()
        scores[:, self.banned] = float("-inf")
        return scores
