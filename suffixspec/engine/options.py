"""`DecodeOptions`: how one request is decoded, validated once at the boundary.

`DecodeOptions` holds the sampling, stopping and budget settings that `SpeculativeGenerator.generate`,
`SpeculativeGenerator.serve` and `Engine.add` take; constructing one checks every value and raises a
`BadInputError` / `BadInputTypeError` naming the parameter (its `param`), the expected range and the value.
`DecodeOptions.resolve(model, tokenizer)` turns it into a `Decoding`: the sampler the verifier uses,
the end-of-sequence set, and `Decoding.take`, the one place that decides where a request's output
ends (an EOS token, a stop sequence, or the token limit).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import BadInputError, BadInputTypeError

__all__ = ["DecodeOptions", "Decoding", "check_int", "FINISH_REASONS", "RECYCLE_DEFAULT", "RECYCLE_FLAT_AT",
           "RECYCLE_PROBE_TOKENS", "recycle_by_default"]

FINISH_REASONS = ("eos", "stop", "length", "cancelled", "error")
# whether requests draw on recycled predictions unless told, where the pass-cost curve is unknown
RECYCLE_DEFAULT = False
# ... and where it is known: on when a one-row pass of RECYCLE_PROBE_TOKENS tokens costs at most
# RECYCLE_FLAT_AT one-token steps: a judgement between the curves measured so far (on under the
# GPU-like flat curve, 1.13 at 64 tokens; off on every CPU curve, 1.5 and above), after the rollout
# grid with --grid-recycle-both found a CPU cell where recycling loses (bench/results/history.md)
RECYCLE_PROBE_TOKENS = 64
RECYCLE_FLAT_AT = 1.25


def recycle_by_default(cost_model) -> bool:
    """Whether requests draw on recycled predictions by default on a machine whose pass costs
    `cost_model` gives (a `costmodel.CostModel`, or None: unknown): a wide tree must cost little
    for the recycled branches to pay (see `RECYCLE_FLAT_AT`)."""
    if cost_model is None:
        return RECYCLE_DEFAULT
    step, probe = cost_model([1, RECYCLE_PROBE_TOKENS], batch=1)
    return bool(step > 0 and probe / step <= RECYCLE_FLAT_AT)


def check_int(value, name: str, low: int | None = None, high: int | None = None, none_ok: bool = False) -> int | None:
    """`value` as an int in [low, high]; bools, floats (2.5, and 2.0 too) and strings are refused."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise BadInputTypeError(f"{name}: expected an integer{_range(low, high)}, got {value!r}", param=name)
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise BadInputError(f"{name}: expected an integer{_range(low, high)}, got {value}", param=name)
    return value


def _check_float(value, name: str, ok: Callable[[float], bool], expected: str, none_ok: bool = False) -> float | None:
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise BadInputTypeError(f"{name}: expected {expected}, got {value!r}", param=name)
    value = float(value)
    if not (math.isfinite(value) and ok(value)):
        raise BadInputError(f"{name}: expected {expected}, got {value}", param=name)
    return value


def _range(low, high) -> str:
    if low is not None and high is not None:
        return f" in [{low}, {high}]"
    if low is not None:
        return f" >= {low}"
    if high is not None:
        return f" <= {high}"
    return ""


@dataclass(frozen=True)
class DecodeOptions:
    """`temperature`, `top_k` (0 or None: off), `top_p` and `min_p` apply when `do_sample`; `seed` keys
    the sampling draws (None: a random one per run). `eos_token_id`: an id or ids (None: the model's
    generation config). `stop`: a string, a token-id list, or a list of either. `budget`: "auto" or
    the draft nodes per request and round (0: plain decoding).

    Penalties (`processors`): `frequency_penalty` and `presence_penalty` in [-2, 2] over the output,
    `repetition_penalty` > 0 over the whole context. `min_tokens`: the output's least length (its
    end tokens are forbidden before). `ignore_eos`: the end-of-sequence token does not end the output.
    `stop_token_ids`: more tokens that end it. `logprobs`: None, or report each output token's log
    probability under the model's raw logits with this many top alternatives (0..20).
    `structure`: a `structured.Structure` the output must follow. `recycle`: draft from the model's
    own past predictions too (`recycle.RecycleTable`; None: the generator's default)."""

    max_new_tokens: int = 128
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    eos_token_id: Any = None
    stop: Any = None
    logits_processor: Any = None
    budget: Any = "auto"
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple = ()
    logprobs: int | None = None
    structure: Any = None
    recycle: bool | None = None

    def __post_init__(self):
        check_int(self.max_new_tokens, "max_new_tokens", low=0)
        if not isinstance(self.do_sample, (bool, np.bool_)):
            raise BadInputTypeError(f"do_sample: expected True or False, got {self.do_sample!r}", param="do_sample")
        _check_float(self.temperature, "temperature", (lambda t: t > 0) if self.do_sample else (lambda t: t >= 0),
                     "a number > 0 when sampling" if self.do_sample else "a number >= 0")
        check_int(self.top_k, "top_k", low=0, none_ok=True)
        _check_float(self.top_p, "top_p", lambda p: 0.0 < p <= 1.0, "a number in (0, 1]", none_ok=True)
        check_int(self.seed, "seed", low=0, high=2**63 - 1, none_ok=True)
        if self.budget != "auto" and (isinstance(self.budget, bool) or not isinstance(self.budget, (int, np.integer))
                                      or self.budget < 0):
            raise BadInputError(f"budget: expected 'auto' or an integer >= 0, got {self.budget!r}",
                                param="budget")
        for name in ("frequency_penalty", "presence_penalty"):
            _check_float(getattr(self, name), name, lambda v: -2.0 <= v <= 2.0, "a number in [-2, 2]")
        _check_float(self.repetition_penalty, "repetition_penalty", lambda v: v > 0, "a number > 0")
        _check_float(self.min_p, "min_p", lambda p: 0.0 <= p <= 1.0, "a number in [0, 1]", none_ok=True)
        check_int(self.min_tokens, "min_tokens", low=0)
        check_int(self.logprobs, "logprobs", low=0, high=20, none_ok=True)
        if self.recycle is not None and not isinstance(self.recycle, (bool, np.bool_)):
            raise BadInputTypeError(f"recycle: expected True, False or None, got {self.recycle!r}", param="recycle")
        if not isinstance(self.ignore_eos, (bool, np.bool_)):
            raise BadInputTypeError(f"ignore_eos: expected True or False, got {self.ignore_eos!r}", param="ignore_eos")
        if isinstance(self.stop_token_ids, (str, bytes)) or not isinstance(self.stop_token_ids, (list, tuple)):
            raise BadInputTypeError(f"stop_token_ids: expected a list of token ids, got {self.stop_token_ids!r}",
                                    param="stop_token_ids")
        for t in self.stop_token_ids:
            check_int(t, "stop_token_ids", low=0)
        if self.eos_token_id is not None:
            ids = [self.eos_token_id] if isinstance(self.eos_token_id, (int, np.integer)) else self.eos_token_id
            for t in ids:
                check_int(t, "eos_token_id", low=0)
        if self.stop is not None:
            for s in _stop_list(self.stop):
                if isinstance(s, str):
                    if not s:
                        raise BadInputError("stop: expected non-empty stop sequences, got an empty string",
                                          param="stop")
                else:
                    seq = list(s)
                    if not seq:
                        raise BadInputError("stop: expected non-empty stop sequences, got an empty token list",
                                          param="stop")
                    for t in seq:
                        check_int(t, "stop", low=0)

    def replace(self, **changes) -> DecodeOptions:
        return dataclasses.replace(self, **changes)

    @property
    def speculative(self) -> bool:
        return self.budget == "auto" or int(self.budget) > 0

    @property
    def per_request(self) -> bool:
        """Whether resolving needs the request's prompt length (penalties over the output, a least
        length, a grammar): such options are resolved once per request, never shared."""
        return bool(self.frequency_penalty or self.presence_penalty or self.min_tokens or self.structure is not None)

    def resolve(self, model, tokenizer=None, prompt_len: int = 0) -> Decoding:
        """The sampler, EOS set and stop matchers of these options for `model` (and `tokenizer`,
        needed for string stop sequences and structured output) and a prompt of `prompt_len` tokens."""
        from ..verify.accept import Sampler
        from ..verify.processors import MinTokens, OutputPenalties

        eos = _eos_set(self.eos_token_id, model)
        ends = eos | frozenset(int(t) for t in self.stop_token_ids)
        processors = list(self.logits_processor or [])
        if self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0:
            processors.append(OutputPenalties(prompt_len, self.frequency_penalty, self.presence_penalty,
                                              self.repetition_penalty))
        if self.min_tokens:
            processors.append(MinTokens(prompt_len, self.min_tokens, ends))
        grammar = None
        if self.structure is not None:
            from ..verify.structured import GrammarProcessor

            if tokenizer is None:
                raise BadInputError("structure: structured output needs a tokenizer", param="structure")
            grammar = GrammarProcessor(self.structure.compile(tokenizer), tokenizer, prompt_len, _vocab(model))
            processors.append(grammar)
        sampler = Sampler(self.do_sample, self.temperature, self.top_k, self.top_p, self.seed, processors,
                          min_p=self.min_p, logprobs=self.logprobs)
        ends = frozenset(int(t) for t in self.stop_token_ids) if self.ignore_eos else ends
        return Decoding(self, sampler, ends, _stop_matchers(self.stop, tokenizer), grammar)


def _vocab(model) -> int | None:
    try:
        return int(model.get_input_embeddings().weight.shape[0])
    except (AttributeError, TypeError, NotImplementedError):
        return None


def _stop_list(stop) -> list:
    if isinstance(stop, str) or (isinstance(stop, (list, tuple)) and stop and isinstance(stop[0], (int, np.integer))):
        return [stop]
    if not isinstance(stop, (list, tuple)):
        raise BadInputTypeError("stop: expected a string, a token-id list or a list of either, got "
                                f"{type(stop).__name__}", param="stop")
    return list(stop)


def _eos_set(eos_token_id, model) -> frozenset[int]:
    if eos_token_id is None:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, (int, np.integer)):
        return frozenset([int(eos_token_id)])
    return frozenset(int(t) for t in eos_token_id)


def _stop_matchers(stop, tokenizer) -> list[Callable[[list[int]], bool]]:
    if stop is None:
        return []
    matchers = []
    for s in _stop_list(stop):
        if isinstance(s, str):
            if tokenizer is None:
                raise BadInputError("stop: string stop sequences need a tokenizer", param="stop")
            window = 2 * len(s) + 4
            matchers.append(lambda out, s=s, w=window: s in tokenizer.decode(out[-w:]))
        else:
            seq = [int(t) for t in s]
            matchers.append(lambda out, seq=seq: out[-len(seq):] == seq)
    return matchers


@dataclass(frozen=True)
class Decoding:
    """Resolved `DecodeOptions`: `sampler` (a `verify.accept.Sampler`), the ids that end the output (`eos`:
    end-of-sequence unless ignored, and the stop token ids), stop matchers, the grammar."""

    options: DecodeOptions
    sampler: Any
    eos: frozenset
    stops: list
    grammar: Any = None  # its `structured.GrammarProcessor` (also among the sampler's processors)

    @property
    def max_new_tokens(self) -> int:
        return int(self.options.max_new_tokens)

    def take(self, output: list[int], tokens, limit: int | None = None) -> tuple[list[int], str]:
        """Append `tokens` to `output` one by one up to the first that ends the request; returns the
        tokens taken and the finish reason ("eos", "stop", "length", or "" when the request goes on).
        `limit`: the request's token limit (default `max_new_tokens`)."""
        limit = self.max_new_tokens if limit is None else limit
        taken: list[int] = []
        for tok in tokens:
            tok = int(tok)
            taken.append(tok)
            output.append(tok)
            if tok in self.eos:
                return taken, "eos"
            if self.stops and any(m(output) for m in self.stops):
                return taken, "stop"
            if len(output) >= limit:
                return taken, "length"
        return taken, ""
