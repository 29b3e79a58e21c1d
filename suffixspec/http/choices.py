"""One choice of a response: its text, its logprobs in OpenAI's two shapes, and the merging of choices.

Contract:

* `ChoiceJob(index, prompt, sample)`: what one engine request generates: the prompt (`PromptInput`)
  at position `prompt` of the request, sample number `sample` (its sampling key: sample i of a seeded
  request always draws the same, and sample 0 equals the same request with n = 1).
* `ChoiceText(asm, decode, token_text, token_bytes)` follows one choice's events: `feed(tokens,
  logprobs)` returns the text that may be sent now and keeps the logprobs of tokens not yet reported;
  `finish(reason, tokens, logprobs)` the rest; `kept_logprobs()` the entries of the tokens that made
  the final text (an end-of-sequence token and tokens wholly past a stop string are not text).
* `completion_logprobs(...)` builds `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`
  (each top dictionary holds the `n` most likely tokens and the chosen one; with `echo` the prompt's
  tokens come first, the first of them with null entries); `chat_logprobs(...)` builds
  `{"content": [{"token", "logprob", "bytes", "top_logprobs": [exactly n]}], "refusal": None}`.
* `merge_stats(stats)` sums per-choice engine statistics into the one `usage.suffixspec` object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..verify.logprobs import TokenLogprob
from .protocol import PromptInput
from .text import TextAssembler

__all__ = ["ChoiceJob", "ChoiceText", "completion_logprobs", "chat_logprobs", "merge_stats"]


@dataclass(frozen=True)
class ChoiceJob:
    index: int  # position among the request's engine requests (prompt-major, then sample)
    prompt: int  # which of the request's prompts
    sample: int  # the sample number among that prompt's: its sampling key
    input: PromptInput


@dataclass
class ChoiceText:
    asm: TextAssembler
    decode: Callable[[list[int]], str]
    logprobs: list[TokenLogprob] = field(default_factory=list)  # every token's, in order
    reported: int = 0  # entries already sent in a stream

    def feed(self, tokens: list[int], logprobs) -> str:
        if logprobs:
            self.logprobs.extend(logprobs)
        return self.asm.feed(tokens)

    def finish(self, reason: str, tokens: list[int], logprobs) -> str:
        if logprobs:
            self.logprobs.extend(logprobs)
        return self.asm.finish(reason, tokens)

    def kept_logprobs(self) -> list[TokenLogprob]:
        """The entries of the tokens whose text is in the final text."""
        tokens, text = self.asm.tokens, self.asm.text()
        if not text:
            return []
        kept = len(tokens)
        while kept > 0 and len(self.decode(tokens[: kept - 1])) >= len(text):
            kept -= 1
        return self.logprobs[:kept]

    def unreported(self, final: bool = False) -> list[TokenLogprob]:
        """Entries not sent yet (in a stream): all received so far, or at the end those kept."""
        entries = self.kept_logprobs() if final else self.logprobs
        out = entries[self.reported:]
        self.reported = max(self.reported, len(entries))
        return out


def completion_logprobs(entries: list[TokenLogprob | None], token_ids: list[int], token_text, start_offset: int,
                        decode: Callable[[list[int]], str]) -> dict:
    """The completions shape over `token_ids` (with `entries` aligned; None: no logprob, the first
    echoed token). `start_offset`: the text offset of the first token."""
    tokens, token_lps, tops = [], [], []
    offsets = [start_offset + k for k in _text_lengths(token_ids, decode)]
    for tok, entry in zip(token_ids, entries):
        tokens.append(token_text(tok))
        if entry is None:
            token_lps.append(None)
            tops.append(None)
            continue
        token_lps.append(entry.logprob)
        top = {token_text(a.token): a.logprob for a in entry.top}
        top.setdefault(token_text(entry.token), entry.logprob)
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def _text_lengths(ids: list[int], decode, window: int = 8) -> list[int]:
    """The length of the text before each token, decoding a window of tokens per token rather than
    the whole prefix (a character spans at most four byte tokens, well inside the window)."""
    lengths = [0]
    for i in range(1, len(ids)):
        start = max(0, i - window)
        lengths.append(lengths[start] + len(decode(ids[start:i])) if start else len(decode(ids[:i])))
    return lengths[: len(ids)]


def chat_logprobs(entries: list[TokenLogprob], token_text, token_bytes) -> dict:
    def item(tok: int, lp: float) -> dict:
        return {"token": token_text(tok), "logprob": lp, "bytes": list(token_bytes(tok))}

    content = [dict(item(e.token, e.logprob), top_logprobs=[item(a.token, a.logprob) for a in e.top])
               for e in entries]
    return {"content": content, "refusal": None}


SUMMED = ("rounds", "drafted", "accepted", "proposer_ms", "verifier_ms")


def merge_stats(stats: list[dict], tokens: list[int]) -> dict:
    """One statistics object for several choices: counts and times summed, the earliest first token,
    the longest queueing; `tokens`: each choice's completion tokens."""
    if len(stats) == 1:
        return dict(stats[0])
    out = {k: sum(s.get(k, 0) for s in stats) for k in SUMMED}
    for k in ("proposer_ms", "verifier_ms"):
        out[k] = round(out[k], 3)
    out["tokens_per_round"] = round(sum(tokens) / out["rounds"], 4) if out["rounds"] else 0.0
    out["acceptance_rate"] = round(out["accepted"] / out["drafted"], 4) if out["drafted"] else 0.0
    out["ttft_ms"] = min(s.get("ttft_ms", 0.0) for s in stats)
    out["queue_ms"] = max(s.get("queue_ms", 0.0) for s in stats)
    out["choices"] = len(stats)
    return out
