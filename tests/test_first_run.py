"""A first request's timings never include the generator's one-time work (the kernels, the tree check,
the cost curve): every engine does it before its clock starts and reports it as `stats.setup_s`, and
`SpeculativeGenerator.prepare` does it up front, each part once (`engine.warmup.Preparation`)."""

import json
import os
import subprocess
import sys

from suffixspec import CostModel, Engine, SpeculativeGenerator
from suffixspec.engine.warmup import Preparation

from support.http import make_tiny_model_dir
from support.tiny_models import tiny_model

PROMPT = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]


def run(engine):
    engine.add(PROMPT)
    while not engine.idle:
        engine.step()
    return engine.result().stats


def test_a_first_request_reports_the_one_time_work_apart_from_its_timings(monkeypatch):
    now = [0.0]
    measured = []

    def cached(model):  # the cost curve's one-time measurement: 100 s on the engine's clock
        measured.append(model)
        now[0] += 100.0
        return CostModel([1, 2, 4, 8], [1.0, 1.2, 1.4, 1.8])

    monkeypatch.setattr(CostModel, "cached", staticmethod(cached))
    gen = SpeculativeGenerator(tiny_model("llama"))
    first = run(Engine(gen, clock=lambda: now[0], max_new_tokens=6, budget="auto"))
    assert first.setup_s == 100.0  # the measurement, timed apart (the fake clock moved only there)
    assert first.e2e_s == 0.0 and first.new_tokens == 6  # and none of it in the request's own time
    assert first.to_dict()["setup_s"] == 100.0 and "one-time warm-up 100.00 s" in first.summary()
    second = run(Engine(gen, clock=lambda: now[0], max_new_tokens=6, budget="auto"))
    assert second.setup_s == 0.0 and len(measured) == 1  # done once per generator
    assert second.new_tokens == 6


def test_prepare_does_each_part_once_and_times_it():
    gen = SpeculativeGenerator(tiny_model("llama"), cost_model=None)
    assert not gen.checked
    first = gen.prepare()
    assert isinstance(first, Preparation) and gen.checked and gen.cost_model is not None
    assert first.check_s > 0 and first.cost_curve_s > 0  # the model's first passes, the curve measured or read
    assert first.total_s == first.kernels_s + first.check_s + first.cost_curve_s and first.first_pass_s == 0.0
    again = gen.prepare()
    assert again.total_s == 0.0, again  # nothing left to do
    assert "not in the timings" in first.describe()


def test_a_plain_engine_warms_no_kernels_and_no_cost_curve(monkeypatch):
    calls = []
    monkeypatch.setattr(CostModel, "cached", staticmethod(lambda model: calls.append(model)))
    gen = SpeculativeGenerator(tiny_model("llama"))
    prep = gen.prepare(drafts=False, cost_curve=False)
    assert prep.kernels_s == 0.0 and prep.cost_curve_s == 0.0 and not calls


def test_prepare_with_a_prompt_passes_over_it_each_time():
    gen = SpeculativeGenerator(tiny_model("llama"))
    gen.prepare()
    seen = []
    forward = gen.model.forward

    def counting(*args, **kwargs):
        seen.append(kwargs.get("input_ids", args[0] if args else None).shape)
        return forward(*args, **kwargs)

    gen.model.forward = counting
    try:
        prep = gen.prepare(prompt=PROMPT)
    finally:
        del gen.model.forward
    assert [tuple(s) for s in seen] == [(1, len(PROMPT))] and prep.first_pass_s > 0
    assert prep.total_s == prep.first_pass_s  # the rest was done before


def test_generate_compare_reports_its_warm_up_apart(tmp_path):
    """`suffixspec generate --compare` as a user runs it: a fresh cache folder (the cost curve is measured),
    its one-time warm-up printed on stderr and in the JSON, identical output."""
    model_dir = make_tiny_model_dir(tmp_path / "tiny")
    env = dict(os.environ, SUFFIXSPEC_CACHE=str(tmp_path / "cache"))
    args = [sys.executable, "-m", "suffixspec.cli", "generate", "--model", str(model_dir), "--prompt",
            "def f(x):\n    return x\n", "--max-new-tokens", "12", "--threads", "1", "--compare", "--json"]
    runs = [subprocess.run(args, capture_output=True, text=True, env=env, timeout=600) for _ in range(2)]
    for done in runs:
        assert done.returncode == 0, done.stderr[-3000:]
        assert "one-time warm-up" in done.stderr and "not in the timings" in done.stderr
    first, second = (json.loads(done.stdout.strip().splitlines()[-1]) for done in runs)
    parts = first["warmup"]
    assert first["identical"] is True and second["identical"] is True
    assert abs(first["warmup_s"] - sum(parts.values())) < 1e-9
    assert parts["cost_curve_s"] > 0 and parts["first_pass_s"] > 0 and parts["check_s"] > 0
    assert first["setup_s"] == 0.0  # done by the warm-up, so the timed request found nothing left
