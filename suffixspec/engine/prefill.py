"""Reading newcomers' prompts within a step's token budget (`Engine`'s admissions).

Contract:

* A step feeds at most `max_step_tokens` tokens to the model (padding included) for prefills, so a
  long prompt never holds the running batch for longer than one bounded pass: between two of its
  passes the running requests get a round (the engine's alternation rule), and requests that
  arrived meanwhile are admitted.
* Newcomers whose padded group fits what is left of the step are read in one pass, as their first
  round (`prefill_groups` groups them by length, each group within the step's tokens); a prompt
  longer than that becomes a `PrefillJob`: one request, its own KV state, read chunk by chunk over
  several steps (`PrefillJob.feed`), the last chunk being its first round (the pass that chooses its
  first token and may carry a draft tree). At most one job is in progress; newcomers that do not fit
  a step wait in the queue, in their order.
* A newcomer's `pending` is what the prefix pool lacks of its prompt (`reuse`): groups and jobs read
  only that, from the row's seeded cache.
* Chunking changes only how the prompt's keys and values are computed (the same positions, the same
  causal attention), never which tokens are drawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..draft.tree import DraftTree
from .lifecycle import Request

__all__ = ["DEFAULT_MAX_STEP_TOKENS", "PrefillJob", "prefill_groups"]

# a running request waits at most one chunk of this many prompt tokens between two of its tokens
DEFAULT_MAX_STEP_TOKENS = 512


def prefill_groups(requests: list[Request], waste: float = 0.25, max_tokens: int | None = None) -> list[list[Request]]:
    """Newcomers grouped by prompt length so that left padding adds at most `waste` of a group's
    tokens and (with `max_tokens`) a group's padded tokens stay within it, a longer prompt alone."""
    groups: list[list[Request]] = []
    total = 0
    for rq in sorted(requests, key=lambda rq: len(rq.pending)):
        n = len(rq.pending)
        rows = len(groups[-1]) + 1 if groups else 0
        if (groups and rows * n <= (1.0 + waste) * (total + n)
                and (max_tokens is None or rows * n <= max_tokens)):
            groups[-1].append(rq)
            total += n
        else:
            groups.append([rq])
            total = n
    return groups


@dataclass
class PrefillJob:
    """One request whose prompt is read over several steps, in its own KV state until it joins."""

    request: Request
    state: Any  # its `verify.kv.KVState` (one row), holding the prompt read so far
    chunks: int = 0  # chunk passes fed so far

    @property
    def remaining(self) -> int:
        return len(self.request.pending)

    def feed(self, tokens: int) -> int:
        """Read the next `tokens` prompt tokens (fewer than the remaining ones: the last chunk is the
        request's first round, run by the engine); returns how many were fed."""
        rq = self.request
        n = min(int(tokens), len(rq.pending) - 1)
        if n <= 0:
            return 0
        chunk, rq.pending = rq.pending[:n], rq.pending[n:]
        self.state.forward([chunk], [DraftTree.empty()])
        self.state.commit([[]])
        self.chunks += 1
        return n
