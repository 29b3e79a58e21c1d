"""A clairvoyant drafter for vLLM's `custom_class` method (bench only): it knows plain greedy
decoding's outputs and drafts each row's true continuation, up to the draft-length cap. Every draft
token is accepted (outputs stay plain's), so its run is the ceiling of accepted tokens and the
throughput of perfect drafts at that cap in the same engine.

The outputs come from a JSON file named by SUFFIXSPEC_CLAIRVOYANT: [[prompt ids, output ids], ...].
A row is matched by content (vLLM gives no request ids): the known prompt that prefixes its valid
tokens, with what follows equal to the start of that prompt's output; a row matching nothing
(warm-up prompts) gets no draft.
"""

from __future__ import annotations

import json
import os

import numpy as np

ENV = "SUFFIXSPEC_CLAIRVOYANT"


class ClairvoyantProposer:
    def __init__(self, vllm_config):
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        pairs = json.load(open(os.environ[ENV]))
        self.known: dict[int, dict[bytes, np.ndarray]] = {}
        for prompt, output in pairs:
            key = np.asarray(prompt, np.int64)
            self.known.setdefault(len(key), {})[key.tobytes()] = np.asarray(output, np.int64)
        self.lengths = sorted(self.known, reverse=True)

    def load_model(self, *args, **kwargs) -> None:
        """No draft model."""

    def _continuation(self, row: np.ndarray) -> list[int]:
        for n in self.lengths:
            if n > len(row):
                continue
            out = self.known[n].get(np.ascontiguousarray(row[:n], np.int64).tobytes())
            if out is None:
                continue
            done = len(row) - n
            if done >= len(out) or not np.array_equal(row[n:], out[:done]):
                return []
            return out[done:done + self.k].tolist()
        return []

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        table = np.asarray(token_ids_cpu)
        lengths = np.asarray(num_tokens_no_spec)
        return [self._continuation(table[r, :int(lengths[r])]) if len(s) else []
                for r, s in enumerate(sampled_token_ids)]
