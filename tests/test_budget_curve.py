"""The pinned cost curve: `--cost-curve FILE` / `--no-learn-cost` on `generate`, `bench` and `serve`,
`SpeculativeGenerator(cost_curve=..., learn_cost=...)`. The file is a JSON object of tree size ->
cost relative to a one-token step; the `cost_curve` object in the last line of `generate --json` is
a valid file; a bad file is refused with one line naming the option and exit status 2."""

import json
import subprocess
import sys

import pytest

from suffixspec import SpeculativeGenerator
from suffixspec.engine.costmodel import CostModel, check_relative_curve
from suffixspec.errors import BadInputError

from support.http import ROOT, make_tiny_model_dir
from support.tiny_models import tiny_model


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "suffixspec.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))


BAD = {
    "not_json": "{1: 1.0",
    "a_list": "[1.0, 1.1]",
    "one_size": '{"1": 1.0}',
    "no_size_1": '{"2": 1.0, "4": 1.2}',
    "size_0": '{"0": 1.0, "1": 1.0}',
    "a_word": '{"1": 1.0, "two": 1.1}',
    "negative": '{"1": 1.0, "2": -1}',
    "falls": '{"1": 1.0, "2": 0.9}',
    "a_string_cost": '{"1": 1.0, "2": "1.1"}',
    "infinite": '{"1": 1.0, "2": Infinity}',
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_curves_are_refused_by_name(case):
    with pytest.raises(BadInputError, match="cost_curve"):
        try:
            data = json.loads(BAD[case])
        except ValueError:
            raise BadInputError("cost_curve: malformed JSON") from None
        check_relative_curve(data)


@pytest.mark.parametrize("command", ["generate", "bench", "serve"])
@pytest.mark.parametrize("case", ["not_json", "falls", "missing"])
def test_the_commands_refuse_a_bad_file_in_one_line_exit_2(tmp_path, command, case):
    path = tmp_path / "curve.json"
    if case != "missing":
        path.write_text(BAD[case])
    extra = ["--prompt", "x"] if command == "generate" else []
    r = cli(command, *extra, "--cost-curve", str(path))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--cost-curve" in lines[0] and "Traceback" not in r.stderr


def test_bench_against_an_endpoint_refuses_the_curve_flags(tmp_path):
    path = tmp_path / "curve.json"
    path.write_text('{"1": 1.0, "2": 1.01}')
    for flags in (["--cost-curve", str(path)], ["--no-learn-cost"]):
        r = cli("bench", "--url", "http://127.0.0.1:9", *flags)
        assert r.returncode == 2 and flags[0] in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_the_generator_takes_a_pinned_curve():
    model = tiny_model("llama")
    curve = {1: 1.0, 2: 1.06, 4: 1.1, 64: 1.3}
    gen = SpeculativeGenerator(model, cost_curve=curve, learn_cost=False)
    assert gen.cost_model.relative() == pytest.approx(curve)
    before = gen.cost_model.relative()
    gen.policy.observe_pass(1, 8, 5.0)  # learn_cost=False: no online correction
    assert gen.cost_model.relative() == before
    assert gen.generate([[1, 2, 3, 1, 2, 3, 1, 2]], max_new_tokens=8).sequences  # decodes
    with pytest.raises(BadInputError, match="cost_curve"):
        SpeculativeGenerator(model, cost_curve={"2": 1.0, "4": 1.0})
    with pytest.raises(BadInputError, match="not both"):
        SpeculativeGenerator(model, cost_curve=curve, cost_model=CostModel([1, 2], [1.0, 2.0]))


def test_a_learning_pinned_curve_takes_its_scale_from_the_first_pass_and_keeps_its_shape():
    cost = CostModel.from_relative({"1": 1.0, "8": 1.2, "64": 2.0})
    assert cost.unscaled
    cost.observe(1, 0.05)  # a one-token step of 50 ms
    assert not cost.unscaled
    assert float(cost(1)) == pytest.approx(0.05, rel=0.11)  # scaled, then moved by one observation
    assert cost.relative() == pytest.approx({1: 1.0, 8: 1.2, 64: 2.0}, rel=0.05)


def test_generate_json_curve_is_a_valid_file_and_pins_the_next_run(tmp_path):
    model_dir = make_tiny_model_dir(tmp_path / "tiny")
    args = ["generate", "--model", str(model_dir), "--prompt", "def f(x):\n    return x\n", "--max-new-tokens", "8",
            "--threads", "1", "--json"]
    first = cli(*args, timeout=300)
    assert first.returncode == 0, first.stderr
    curve = json.loads(first.stdout.strip().splitlines()[-1])["cost_curve"]
    path = tmp_path / "curve.json"
    path.write_text(json.dumps(curve))
    pinned = cli(*args, "--cost-curve", str(path), "--no-learn-cost", timeout=300)
    assert pinned.returncode == 0, pinned.stderr
    report = json.loads(pinned.stdout.strip().splitlines()[-1])
    assert report["cost_curve"] == pytest.approx({k: float(v) for k, v in curve.items()})
    assert report["warmup"]["cost_curve_s"] == 0  # pinned: nothing measured
    assert pinned.stdout.splitlines()[:-1] == first.stdout.splitlines()[:-1]  # the same text
