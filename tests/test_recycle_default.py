"""Recycled predictions on by default where the pass-cost curve is flat (`options.recycle_by_default`):
the rule on given curves, the generator deciding once from its curve, and `recycle=` / a request's
`recycle` / `--recycle` / `--no-recycle` overriding it."""

import numpy as np
import pytest

from suffixspec.draft.tree import DraftTree
from suffixspec.engine.costmodel import CostModel
from suffixspec.engine.options import RECYCLE_DEFAULT, RECYCLE_FLAT_AT, RECYCLE_PROBE_TOKENS, recycle_by_default
from suffixspec.generate import SpeculativeGenerator

from support.tiny_models import StandInProposer, hf_generate, tiny_model

# a 7B model on an H100-class GPU at small batch (issue 55's flat curve: 1 + 0.002 (k - 1)), this CPU's default model
FLAT = {1: 1.0, 2: 1.002, 4: 1.006, 8: 1.014, 16: 1.03, 32: 1.062, 64: 1.126}
CPU = {1: 1.0, 2: 1.04, 4: 1.06, 8: 1.22, 16: 1.47, 32: 1.89, 64: 2.77}


def test_the_rule_on_given_curves():
    assert recycle_by_default(CostModel.from_relative(FLAT)) is True
    assert recycle_by_default(CostModel.from_relative(CPU)) is False
    assert recycle_by_default(None) is RECYCLE_DEFAULT
    # the threshold itself is on, a hair above it off; read at the probe size, interpolated between sizes
    at = {1: 1.0, RECYCLE_PROBE_TOKENS: RECYCLE_FLAT_AT, 2 * RECYCLE_PROBE_TOKENS: 4.0}
    assert recycle_by_default(CostModel.from_relative(at)) is True
    assert recycle_by_default(CostModel.from_relative({**at, RECYCLE_PROBE_TOKENS: RECYCLE_FLAT_AT + 1e-3})) is False
    # the probe size a third of the way up from half of it to twice it: below the threshold
    between = {1: 1.0, RECYCLE_PROBE_TOKENS // 2: 1.0, 2 * RECYCLE_PROBE_TOKENS: 2 * RECYCLE_FLAT_AT - 1.0}
    assert recycle_by_default(CostModel.from_relative(between)) is True
    # in seconds: the shape decides, not the step's length
    assert recycle_by_default(CostModel.from_relative(FLAT, step_s=0.25)) is True
    assert recycle_by_default(CostModel.from_relative(CPU, step_s=1e-4)) is False


def test_the_generator_decides_once_from_its_curve_and_what_is_given_overrides_it():
    model = tiny_model("llama")
    assert SpeculativeGenerator(model, cost_curve=FLAT).recycle is True
    assert SpeculativeGenerator(model, cost_curve=CPU).recycle is False
    assert SpeculativeGenerator(model, cost_curve=FLAT, recycle=False).recycle is False
    assert SpeculativeGenerator(model, cost_curve=CPU, recycle=True).recycle is True
    gen = SpeculativeGenerator(model)  # no curve yet: the unknown curve's default, decided later
    assert gen.recycle is RECYCLE_DEFAULT
    gen.cost_model = CostModel.from_relative(FLAT)
    assert gen.recycle is True
    gen.cost_model = CostModel.from_relative(CPU)  # decided once: a curve corrected later does not flip it
    assert gen.recycle is True
    gen.recycle = None  # undecided again: from the curve it has now
    assert gen.recycle is False
    with pytest.raises(Exception, match="recycle: expected True, False or None"):
        gen.recycle = "yes"


def test_requests_draft_recycled_predictions_by_the_curve_unless_told():
    """An empty copy proposer: whatever is drafted is recycled. Greedy output is plain's either way."""
    model = tiny_model("llama", sharpen=2.0)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 97, n).tolist() for n in (5, 17, 9)]
    refs = [hf_generate(model, p, 24) for p in prompts]

    def drafted(curve, recycle=None, request=None):
        gen = SpeculativeGenerator(model, proposer=StandInProposer(lambda s, b: DraftTree.empty()), cost_curve=curve,
                                   learn_cost=False, recycle=recycle)
        for _ in range(2):  # the second run drafts from what the first harvested
            res = gen.generate(prompts, max_new_tokens=24, budget=8, recycle=request)
            assert res.sequences == refs
        return res.stats.drafted

    assert drafted(FLAT) > 0 and drafted(CPU) == 0
    assert drafted(FLAT, recycle=False) == 0 and drafted(CPU, recycle=True) > 0
    assert drafted(FLAT, request=False) == 0 and drafted(CPU, request=True) > 0


def test_cli_flags_override_the_rule():
    from suffixspec._commands.args import recycle_default, recycle_help
    from suffixspec.cli import build_parser

    for command, extra in (("generate", ["--prompt", "x"]), ("bench", []), ("serve", [])):
        parse = build_parser().parse_args
        assert recycle_default(parse([command, *extra]).recycle) is None  # the generator decides
        assert recycle_default(parse([command, *extra, "--recycle"]).recycle) is True
        assert recycle_default(parse([command, *extra, "--no-recycle"]).recycle) is False
    assert f"at most {RECYCLE_FLAT_AT:g} one-token steps" in recycle_help()
