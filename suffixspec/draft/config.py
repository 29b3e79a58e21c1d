"""`ProposerConfig`: the proposer's knobs, one validated frozen dataclass.

The one definition of every knob: its type (the field's annotation), its default, the values it
accepts (`KnobSpec`, from the field's metadata) and what it does (`metadata["doc"]`). `Proposer`
takes a `ProposerConfig` (or its fields as keyword arguments, `ProposerConfig.of`), and the vLLM
adapter (`integrations/vllm_options.py`) derives the options it accepts from `KNOBS` instead of keeping a
second list. Constructing a config checks every value and raises a `BadInputError` naming the knob,
what it expects and the value; `dataclasses.replace` (or `replace`) checks again.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import BadInputError, BadInputTypeError
from ..tokenids import MAX_TOKEN_ID
from .response_cache import MAX_GENERATIONS

__all__ = ["ProposerConfig", "KnobSpec", "KNOBS"]

_KINDS = {"int": int, "float": float, "bool": bool, "str": str}


def _knob(default, doc: str, *, low=None, high=None, above=None, choices: tuple[str, ...] = ()):
    """A config field: `low` <= value <= `high`, value > `above`, or value in `choices` (a str)."""
    return field(default=default, metadata={"doc": doc, "low": low, "high": high, "above": above, "choices": choices})


@dataclass(frozen=True)
class KnobSpec:
    """One knob as `ProposerConfig` declares it: `kind` (int, float, bool or str), `none_ok` (None
    is a value), the accepted range ([`low`, `high`], > `above`) or `choices`, default and doc."""

    name: str
    kind: type
    none_ok: bool
    default: Any
    doc: str
    low: float | None = None
    high: float | None = None
    above: float | None = None
    choices: tuple[str, ...] = ()

    @property
    def types(self) -> tuple[type, ...]:
        """The Python types a value may have (an int is a float knob's value too)."""
        types = {int: (int,), float: (int, float), bool: (bool,), str: (str,)}[self.kind]
        return types + ((type(None),) if self.none_ok else ())

    @property
    def expected(self) -> str:
        """What the knob accepts, in words ("a positive integer", "a number in [0, 1]")."""
        if self.kind is bool:
            what = "True or False"
        elif self.kind is str:
            what = " or ".join(repr(c) for c in self.choices)
        elif self.kind is int and self.low == 1 and self.high is None:
            what = "a positive integer"
        else:
            what = ("an integer" if self.kind is int else "a number") + _range(self.low, self.high, self.above)
        return f"None or {what}" if self.none_ok else what

    def check(self, value):
        """`value` as the knob's Python type; a BadInputError naming the knob when it is refused."""
        if value is None and self.none_ok:
            return None
        kind = self.kind
        if kind is bool:
            ok = isinstance(value, (bool, np.bool_))
        elif kind is str:
            ok = isinstance(value, str) and value in self.choices
        elif isinstance(value, (bool, np.bool_)):
            ok = False
        elif kind is int:
            ok = isinstance(value, (int, np.integer)) and _within(int(value), self)
        else:
            ok = (isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value)
                  and _within(float(value), self))
        if not ok:
            raise BadInputError(f"{self.name}: expected {self.expected}, got {value!r}", param=self.name)
        return kind(value)


def _within(value, spec: KnobSpec) -> bool:
    return ((spec.low is None or value >= spec.low) and (spec.high is None or value <= spec.high)
            and (spec.above is None or value > spec.above))


def _range(low, high, above) -> str:
    if above is not None:
        return f" > {above}"
    if low is not None and high is not None:
        return f" in [{low}, {high}]"
    return f" >= {low}" if low is not None else ""


@dataclass(frozen=True)
class ProposerConfig:
    """The knobs of a `Proposer`, fixed at its construction (see each field's `metadata["doc"]`,
    or `KNOBS[name].doc`)."""

    max_nodes: int = _knob(64, "default draft-tree budget: nodes per proposal", low=1)
    max_depth: int = _knob(0, "tree depth limit (0: unbounded)", low=0)
    min_match: int = _knob(1, "shortest matched suffix worth drafting from", low=1)
    min_prob: float = _knob(0.0, "drop tree nodes less likely than this to be accepted", low=0, high=1)
    match_prior: float = _knob(1.0, "confidence of a match of length L without learning: L / (L + match_prior)", low=0)
    recency: float = _knob(0.5, "weight of a source's most recent continuation against its counts", low=0)
    corpus_locality: float = _knob(4.0, "weight, in a corpus, of the continuation found nearest the request's "
                                        "place there (where its last unique match ended, moved on since) against "
                                        "the counts (replaces `recency` for corpora)", low=0)
    recover: float = _knob(0.0, "weight of the request's own copy going on past a token the model replaced or inserted "
                                "(the continuation after, or at, its longest earlier match's most recent one; 0: off)",
                           low=0, high=1)
    max_children: int = _knob(4, "branching: children per tree node", low=1)
    global_cache: bool = _knob(True, "learn from closed sessions: keep their outputs in a cache of past responses")
    cache_tokens: int = _knob(1 << 20, "tokens the cache of past responses holds", low=1)
    cache_generations: int = _knob(4, "generations the cache of past responses rotates", low=1, high=MAX_GENERATIONS)
    max_session_tokens: int = _knob(1 << 20, "tokens a session's automaton holds (past it: rebuilt over the last half)",
                                    low=1)
    resync_tokens: int = _knob(1024, "context re-matched against a changed cache snapshot", low=1)
    threads: int = _knob(1, "threads of `propose_batch` (1: a plain loop, no parallel region)", low=1)
    match_levels: int = _knob(3, "matched suffixes expanded per source: the longest, then the next shorter ones "
                                 "along suffix links, which see more occurrences", low=1)
    vocab_size: int | None = _knob(None, "when given, `start` and `extend` refuse token ids >= it", low=1,
                                   high=MAX_TOKEN_ID + 1)
    learn: bool = _knob(True, "learn each source's confidence and the sibling calibration from committed tokens")
    prior_strength: float = _knob(8.0, "weight of the prior against the proposer's learned counts", above=0)
    session_strength: float = _knob(16.0, "weight of the proposer's counts against a session's own", above=0)
    calibration_strength: float = _knob(16.0, "weight of 1 against the learned calibration ratios", above=0)
    cache_upkeep: str = _knob("inline", "'inline': a closed session's output joins the cache inside `close`; "
                                        "'background': `close` queues it for one upkeep thread",
                              choices=("inline", "background"))

    def __post_init__(self):
        for name, spec in KNOBS.items():
            object.__setattr__(self, name, spec.check(getattr(self, name)))

    def replace(self, **changes) -> ProposerConfig:
        """A copy with `changes` (knob names, checked like `of`'s)."""
        return ProposerConfig.of(self, changes)

    @classmethod
    def of(cls, config: ProposerConfig | None = None, knobs: dict | None = None) -> ProposerConfig:
        """`config` (default: the defaults) with the keyword `knobs` on top; an unknown name is a
        BadInputTypeError naming it (a TypeError, as an unknown keyword argument is)."""
        if config is not None and not isinstance(config, cls):
            raise BadInputTypeError(f"config: expected a ProposerConfig or None, got {type(config).__name__}", param="config")
        unknown = sorted(set(knobs or ()) - set(KNOBS))
        if unknown:
            raise BadInputTypeError(f"unknown proposer knob(s) {', '.join(map(repr, unknown))}; "
                                    f"expected one of {sorted(KNOBS)}")
        if not knobs:
            return config if config is not None else cls()
        return dataclasses.replace(config if config is not None else cls(), **knobs)


def _specs() -> dict[str, KnobSpec]:
    specs = {}
    for f in dataclasses.fields(ProposerConfig):
        base, _, none = f.type.partition(" | ")
        specs[f.name] = KnobSpec(f.name, _KINDS[base], none == "None", f.default, **f.metadata)
    return specs


KNOBS: dict[str, KnobSpec] = _specs()  # name -> spec, in field order
