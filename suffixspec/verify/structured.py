"""Structured output: answers held to a JSON schema (or to any JSON object) by the llguidance engine.

Contract:

* `Structure.json_object()` and `Structure.json_schema(schema)` describe the constraint; constructing
  one checks the schema's shape, and `compile(tokenizer)` (a suffixspec `Tokenizer`) returns the
  grammar text llguidance checked against the tokenizer, or raises `BadInputError` naming the problem
  (param `response_format`). JSON is compact: no whitespace between tokens, so a small model does
  not spend its token limit on blanks.
* `GrammarProcessor(grammar, tokenizer, prompt_len)` is a transformers-style logits processor over one
  request: called with a row's whole context (`input_ids` [1, L], the prompt then the output so far),
  it brings its matcher to that output (consuming what it has not seen, rolling back what the context
  no longer holds: the verifier walks one path of a tree, so this is a forward step almost always)
  and sets every token the grammar forbids next to -inf. Once the grammar is complete only the
  end-of-sequence token stays allowed.
* `GrammarProcessor.prune(tree, output)`: the closed subtree of a draft tree whose paths the grammar
  allows after `output` (nodes it forbids could never be accepted, so they are never verified).
* The llguidance tokenizer is built once per `Tokenizer` (by its fingerprint) and shared.
* `escaped_view(tokenizer, prompt)`: the prompt's text as it reads inside a JSON string, tokenized (None
  when escaping changes nothing). The engine opens a structured request's proposer session over the
  prompt followed by it, so an answer that quotes the prompt in a JSON field (code in `{"code": ...}`,
  a file in a tool call's arguments) drafts from text it actually repeats.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..draft.tree import DraftTree, subtree
from ..errors import BadInputError

__all__ = ["Structure", "GrammarProcessor", "ll_tokenizer", "escaped_view"]

PARAM = "response_format"
COMPACT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


@dataclass(frozen=True)
class Structure:
    """A constraint: a JSON schema (`schema_text`; None with no `lark` means any JSON object), or a
    grammar in llguidance's Lark dialect (`lark`: tool calls)."""

    schema_text: str | None = None
    lark: str | None = None

    @classmethod
    def from_lark(cls, grammar: str) -> Structure:
        return cls(None, grammar)

    @classmethod
    def json_object(cls) -> Structure:
        return cls(None)

    @classmethod
    def json_schema(cls, schema: Any) -> Structure:
        if not isinstance(schema, dict):
            raise BadInputError(f"{PARAM}: expected the JSON schema as an object, got {type(schema).__name__}",
                                param=PARAM)
        return cls(json.dumps(schema))

    def compile(self, tokenizer) -> str:
        import llguidance

        schema = {"type": "object"} if self.schema_text is None else json.loads(self.schema_text)
        try:
            if self.lark is not None:
                grammar = llguidance.LLMatcher.grammar_from_lark(self.lark)
            else:
                grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=COMPACT)
        except (ValueError, TypeError) as exc:
            raise BadInputError(f"{PARAM}: the JSON schema cannot be compiled: {exc}", param=PARAM) from None
        problem = llguidance.LLMatcher.validate_grammar(grammar, ll_tokenizer(tokenizer))
        if problem:
            raise BadInputError(f"{PARAM}: the JSON schema cannot be compiled: {problem}", param=PARAM)
        return grammar


_TOKENIZERS: dict[str, Any] = {}


def ll_tokenizer(tokenizer, n_vocab: int | None = None):
    """The llguidance tokenizer of a suffixspec `Tokenizer` (built once: about a quarter second)."""
    import llguidance

    key = f"{tokenizer.fingerprint}:{n_vocab}"
    found = _TOKENIZERS.get(key)
    if found is None:
        backend = getattr(tokenizer, "backend", None)
        if backend is None:
            raise BadInputError(f"{PARAM}: structured output needs a tokenizers-backed tokenizer", param=PARAM)
        found = llguidance.LLTokenizer(backend.to_str(), n_vocab=n_vocab, eos_token=tokenizer.eos_token_id)
        _TOKENIZERS[key] = found
    return found


@functools.lru_cache(maxsize=1)
def _bitmask_tools():
    import llguidance.numpy as lgn
    import llguidance.torch as lgt

    return lgn, lgt


class GrammarProcessor:
    def __init__(self, grammar: str, tokenizer, prompt_len: int, n_vocab: int | None = None):
        import llguidance

        self.lltok = ll_tokenizer(tokenizer, n_vocab)
        self.matcher = llguidance.LLMatcher(self.lltok, grammar, log_level=0)
        if self.matcher.is_error():
            raise BadInputError(f"{PARAM}: {self.matcher.get_error()}", param=PARAM)
        self.prompt_len = int(prompt_len)
        self.consumed: list[int] = []
        self.eos = int(self.lltok.eos_token)
        lgn, _ = _bitmask_tools()
        self._mask = lgn.allocate_token_bitmask(1, self.lltok.vocab_size)

    def sync(self, output: list[int]) -> None:
        """The matcher after exactly `output`."""
        done = self.consumed
        if len(output) >= len(done) and output[: len(done)] == done:
            extra = output[len(done):]
        else:
            same = 0
            for a, b in zip(done, output):
                if a != b:
                    break
                same += 1
            self.matcher.rollback(len(done) - same)
            del done[same:]
            extra = output[same:]
        for tok in extra:
            if self.matcher.is_stopped():
                break  # the end-of-sequence token after a complete answer: nothing more to match
            self.matcher.consume_token(int(tok))
            done.append(int(tok))

    def __call__(self, input_ids, scores):
        import torch

        if input_ids.shape[0] != 1:
            raise BadInputError(f"GrammarProcessor: expected one row per call, got {input_ids.shape[0]}")
        self.sync(input_ids[0, self.prompt_len:].tolist())
        scores = scores.clone()
        if self.matcher.is_error() or self.matcher.is_stopped():
            keep = scores[:, self.eos].clone()
            scores.fill_(float("-inf"))
            scores[:, self.eos] = keep
            return scores
        lgn, lgt = _bitmask_tools()
        lgn.fill_next_token_bitmask(self.matcher, self._mask, 0)
        vocab = scores.shape[-1]
        allowed = np.unpackbits(self._mask.view(np.uint8), bitorder="little")[:vocab].astype(bool)
        if allowed.shape[0] < vocab:
            allowed = np.concatenate([allowed, np.zeros(vocab - allowed.shape[0], bool)])
        scores[:, ~torch.from_numpy(allowed)] = float("-inf")
        return scores

    def prune(self, tree: DraftTree, output: list[int]) -> DraftTree:
        """The nodes of `tree` whose whole path the grammar allows after `output`."""
        n = len(tree)
        if n == 0:
            return tree
        self.sync(list(output))
        keep = np.zeros(n, bool)
        for leaf in tree.leaves():
            path = tree.path_to(int(leaf))
            ok = self.matcher.validate_tokens([int(t) for t in tree.tokens[path]])
            keep[path[:ok]] = True
        return tree if keep.all() else subtree(tree, keep)


def escaped_view(tokenizer, prompt: list[int]) -> list[int] | None:
    if tokenizer is None:
        return None
    text = tokenizer.decode(prompt)
    escaped = json.dumps(text, ensure_ascii=False)[1:-1]
    return list(tokenizer.encode(escaped)) if escaped != text else None
