"""A first request's timings never include the generator's one-time work (the kernels, the tree check,
the cost curve): every engine does it before its clock starts and reports it as `stats.setup_s`, and
`SpeculativeGenerator.prepare` does it up front, each part once (`engine.warmup.Preparation`)."""

from suffixspec import CostModel, Engine, SpeculativeGenerator
from suffixspec.engine.warmup import Preparation

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
