"""`SpeculativeGenerator`: the facade over the engine for one model.

It owns the model, the tokenizer, the proposer (`suffixspec.Proposer` by default) and the budget
policy (`budget.BudgetPolicy`: cost model and calibration, shared by every engine it builds), and
checks once whether tree verification works with the model. `generate` decodes a list of prompts by
queueing them on a continuous-batching `engine.engine.Engine` (`serve`) and stepping it until all are done;
the round itself (draft, size, verify, settle, feed, learn) is `engine.round.RoundRunner`.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np

from .draft.tree import prune_tree
from .engine.budget import DEFAULT_MAX_BUDGET, BudgetPolicy, CostModel, RankCalibration
from .engine.engine import Engine, model_vocab_size
from .engine.fallback import PromptLookupProposer
from .engine.options import DecodeOptions, recycle_by_default
from .engine.reuse import make_prefix_pool
from .engine.stats import GenerationResult, GenerationStats, RequestStats
from .errors import BadInputError, BadInputTypeError
from .tokenids import as_tokens

__all__ = ["SpeculativeGenerator", "GenerationResult", "GenerationStats", "RequestStats", "CostModel",
           "RankCalibration", "PromptLookupProposer", "DecodeOptions", "prune_tree"]

log = logging.getLogger(__name__)


class SpeculativeGenerator:
    """Speculative decoding with model-free draft trees over a transformers causal LM.

    `model`: any transformers causal LM (device and dtype are the model's). `tokenizer`: optional,
    lets `generate` take strings and return texts (a `suffixspec.Tokenizer` or an HF tokenizer).
    `proposer`: an object with `start(prompt_ids, request_id=None, filter=None)` returning sessions
    (`extend`, `propose(budget) -> DraftTree`, `close`); default `suffixspec.Proposer(**proposer_options)`.
    `policy`: the automatic budget (`BudgetPolicy`); by default one built from `max_budget`,
    `cost_model`, `min_gain`, `batch_margin`, `prefill_margin`, `prefill_slack` and `learn_cost` (see
    `BudgetPolicy`). `cost_curve`: the pass-cost curve pinned instead of measured (tree size -> cost
    relative to a one-token step, e.g. `{1: 1.0, 2: 1.06}`, what `cost_model.relative()` returns);
    `learn_cost=False`: the curve stays as given (no online correction, no exploring).
    `recycle`: whether requests draft from the model's own past predictions by default (None: decided
    once from the cost curve when it is first known, `options.recycle_by_default`: on where passes are
    nearly free, off where they cost in proportion to their tokens or the curve is unknown; a
    request's `DecodeOptions.recycle` overrides it); `recycle_table` is
    that source's `RecycleTable`. `prefix_cache_bytes`: the bound of `prefix_pool`, the keys and
    values of prompts read before (None: `engine.reuse.default_prefix_cache_bytes`; 0: none).
    """

    def __init__(self, model, tokenizer=None, proposer=None, *, max_budget: int = DEFAULT_MAX_BUDGET,
                 cost_model: CostModel | None = None, min_gain: float = 1.0, batch_margin: float = 0.06,
                 prefill_margin: float = 2.0, prefill_slack: float = 0.1, policy: BudgetPolicy | None = None,
                 recycle: bool | None = None, cost_curve: dict | None = None, learn_cost: bool = True,
                 prefix_cache_bytes: int | None = None, **proposer_options):
        self.model = model
        self.tokenizer = tokenizer
        self._proposer = proposer
        self._proposer_options = proposer_options
        if cost_curve is not None:  # a pinned curve (`CostModel.from_relative`), not measured
            if cost_model is not None:
                raise BadInputError("cost_curve: give cost_curve or cost_model, not both", param="cost_curve")
            cost_model = CostModel.from_relative(cost_curve)
        self.policy = policy if policy is not None else BudgetPolicy(
            max_budget=max_budget, cost_model=cost_model, min_gain=min_gain, batch_margin=batch_margin,
            prefill_margin=prefill_margin, prefill_slack=prefill_slack, learn_cost=learn_cost)
        self._unsupported: str | None = None
        self._checked = False
        self.recycle = recycle
        self._recycle_table = None
        if prefix_cache_bytes is not None:
            make_prefix_pool(prefix_cache_bytes, None)  # checked now, made on first use
        self._prefix_cache_bytes = prefix_cache_bytes
        self._prefix_pool = None

    # the policy's state, under the names callers have used
    @property
    def cost_model(self) -> CostModel | None:
        return self.policy.cost_model

    @cost_model.setter
    def cost_model(self, value: CostModel | None) -> None:
        self.policy.cost_model = value

    @property
    def calibration(self) -> RankCalibration:
        return self.policy.calibration

    @calibration.setter
    def calibration(self, value: RankCalibration) -> None:
        self.policy.calibration = value

    @property
    def max_budget(self) -> int:
        return self.policy.max_budget

    @property
    def proposer(self):
        if self._proposer is None:
            from .draft.proposer import Proposer

            self._proposer = Proposer(**self._proposer_options)
        return self._proposer

    @property
    def prefix_pool(self):
        """The keys and values of prompts and outputs this generator's engines have read
        (`verify.prefix.PrefixPool`, made empty on first use; None when `prefix_cache_bytes` is 0):
        a later prompt reads only what follows its longest prefix found there."""
        if self._prefix_pool is None and self._prefix_cache_bytes != 0:
            self._prefix_pool = make_prefix_pool(self._prefix_cache_bytes, self.model)
        return self._prefix_pool

    @property
    def recycle(self) -> bool:
        """Whether requests draft from recycled predictions unless told: as given, else decided once
        from the cost curve (`recycle_by_default`) when it is known, else the unknown curve's default."""
        if self._recycle is None and self.policy.cost_model is not None:
            self._recycle = recycle_by_default(self.policy.cost_model)
        return recycle_by_default(None) if self._recycle is None else self._recycle

    @recycle.setter
    def recycle(self, value: bool | None) -> None:
        if value is not None and not isinstance(value, (bool, np.bool_)):
            raise BadInputTypeError(f"recycle: expected True, False or None, got {value!r}", param="recycle")
        self._recycle = None if value is None else bool(value)

    @property
    def recycle_table(self):
        """The model's `RecycleTable` (made empty on first use; assignable, e.g. a loaded one)."""
        if self._recycle_table is None:
            from .draft.recycle import RecycleTable, model_identity

            vocab = model_vocab_size(self.model)
            if vocab is None:
                raise BadInputError("recycle: the model's vocabulary size is unknown", param="recycle")
            self._recycle_table = RecycleTable(vocab, identity=model_identity(self.model))
        return self._recycle_table

    @recycle_table.setter
    def recycle_table(self, table) -> None:
        from .draft.recycle import RecycleTable

        if not isinstance(table, RecycleTable):
            raise BadInputTypeError(f"recycle_table: expected a RecycleTable, got {type(table).__name__}",
                                    param="recycle_table")
        vocab = model_vocab_size(self.model)
        if vocab is not None and table.vocab_size != vocab:
            raise BadInputError(f"recycle_table: made for a vocabulary of {table.vocab_size} tokens, the model has "
                                f"{vocab}", param="recycle_table")
        self._recycle_table = table

    def encode(self, inputs) -> list[list[int]]:
        """Prompts as token-id lists: `inputs` is one prompt or a list of them (strings need a tokenizer)."""
        if isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], (int, np.integer))):
            inputs = [inputs]
        if not isinstance(inputs, (list, tuple)) or not inputs:
            raise BadInputTypeError(f"inputs: expected a non-empty list of token-id lists or strings, got {type(inputs).__name__}",
                                    param="inputs")
        return [self.encode_one(item, f"inputs[{i}]") for i, item in enumerate(inputs)]

    def encode_one(self, item, name: str = "prompt") -> list[int]:
        """One prompt (token ids, or a string with a tokenizer) as token ids; errors name `name`."""
        if isinstance(item, str):
            if self.tokenizer is None:
                raise BadInputError(f"{name}: strings need a tokenizer (SpeculativeGenerator(model, tokenizer=...))",
                                    param=name)
            ids = list(self.tokenizer.encode(item))
        else:
            ids = as_tokens(item, name).tolist()
        if not ids:
            raise BadInputError(f"{name}: a prompt needs at least one token", param=name)
        return [int(t) for t in ids]

    def check_support(self) -> str | None:
        """None when tree verification works with this model (checked once), else the reason."""
        from .verify.kv import check_tree_logits
        from .verify.support import tree_attention_support

        if not self._checked:
            self._unsupported = tree_attention_support(self.model)
            if self._unsupported is None:
                try:
                    check_tree_logits(self.model)
                except Exception as exc:  # noqa: BLE001 - any failure means we cannot trust tree passes
                    self._unsupported = f"tree verification self-check failed: {exc}"
            self._checked = True
        return self._unsupported

    @property
    def checked(self) -> bool:
        """Whether tree verification was checked (or declared) for this model."""
        return self._checked

    def prepare(self, *, drafts: bool = True, cost_curve: bool = True, prompt=None, clock=None):
        """Do this generator's one-time work now, each part once (the proposer's kernels compiled or
        loaded, the tree-verification check, the cost curve of the automatic budget; with `prompt`,
        one pass over it) and return what it cost (`engine.warmup.Preparation`). Every engine calls
        it before its clock starts, so a first request's timings never include it; call it before
        timing anything else."""
        import time

        from .engine.warmup import prepare_generator

        return prepare_generator(self, drafts=drafts, cost_curve=cost_curve, prompt=prompt,
                                clock=clock or time.perf_counter)

    def assume_support(self, unsupported: str | None = None) -> None:
        """Skip the self-check: declare that tree verification works with this model (None), or that
        it does not and why (for stand-in models whose passes are known without checking)."""
        self._unsupported, self._checked = unsupported, True

    def serve(self, *, options: DecodeOptions | None = None, max_batch: int | None = None,
              stream: Callable[[int, list[int]], Any] | None = None, **option_fields) -> Engine:
        """A continuous-batching `Engine` over this generator: `add` requests at any time, `step`
        rounds; takes `DecodeOptions` (or its fields as keyword arguments), `max_batch` and `stream`."""
        return Engine(self, options=options, max_batch=max_batch, stream=stream, **option_fields)

    def generate(self, inputs, max_new_tokens: int = 128, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 eos_token_id=None, stop=None, stream: Callable[[int, list[int]], Any] | None = None,
                 logits_processor=None, budget="auto", filter=None, request_ids=None,
                 max_batch: int | None = None, recycle: bool | None = None) -> GenerationResult:
        """Generate for every prompt of `inputs` (one prompt or a list; strings need a tokenizer).

        The decoding settings are `DecodeOptions`' fields. `stream(request_index, tokens)` receives
        each round's committed tokens. `filter`: one corpus filter for every request, or a list with
        one per request (passed to the proposer). Sampling draws are keyed by (seed, request index in
        `inputs`, output position). `max_batch`: decode at most this many requests together,
        refilling freed slots in input order (continuous batching; default: all at once).
        """
        options = DecodeOptions(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature,
                                top_k=top_k, top_p=top_p, seed=seed, eos_token_id=eos_token_id, stop=stop,
                                logits_processor=logits_processor, budget=budget, recycle=recycle)
        prompts = self.encode(inputs)
        filters = list(filter) if isinstance(filter, (list, tuple)) else [filter] * len(prompts)
        if len(filters) != len(prompts):
            raise BadInputError(f"filter: expected one filter or {len(prompts)} (one per prompt), got {len(filters)}", param="filter")
        if request_ids is not None and len(request_ids) != len(prompts):
            raise BadInputError(f"request_ids: expected {len(prompts)} ids (one per prompt), got {len(request_ids)}", param="request_ids")
        engine = self.serve(options=options, max_batch=max_batch, stream=stream)
        if engine.device.type == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(engine.device)
        for q, prompt in enumerate(prompts):
            engine.add(prompt, key=q, filter=filters[q], request_id=request_ids[q] if request_ids is not None else None)
        return engine.run()
