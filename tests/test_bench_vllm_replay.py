"""`bench/bench_vllm_replay.py`'s replay loop without vLLM: a scripted drafter whose drafts are known
gives the step and acceptance counts and the simulated seconds worked out by hand (vLLM's scheduling:
joins a step after a row is freed, finished requests still drafted for), the adapter's `DraftCore`
runs through it on the simulated clock (the cost it learns is the replay's line), and the step clock
fitted to a trace is the line that made it."""

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def replay(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its sibling modules, as `python bench/x.py` finds them
    spec = importlib.util.spec_from_file_location("bench_vllm_replay", ROOT / "bench" / "bench_vllm_replay.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_vllm_replay", mod)
    spec.loader.exec_module(mod)
    return mod


class Scripted:
    """Drafts the next `k` tokens of each request's output (`right`) or `k` wrong tokens."""

    def __init__(self, outputs, k, right=True):
        self.outputs, self.k, self.right = outputs, k, right
        self.calls = []

    def step(self, batch):
        self.calls.append([(rid, len(tokens), list(sampled)) for rid, tokens, sampled, _ in batch])
        out = []
        for rid, tokens, _, n_prompt in batch:
            done = len(tokens) - n_prompt
            nxt = self.outputs[rid][done: done + self.k]
            out.append(list(nxt) if self.right else [-1] * self.k)
        return out


def data(n=3, length=20):
    prompts = [[100 + i, 200 + i] for i in range(n)]
    outputs = [[1000 * (i + 1) + j for j in range(length)] for i in range(n)]
    return {"prompts": prompts, "followups": None, "outputs": outputs, "eos": 0}


@pytest.mark.parametrize("rows", [1, 2, 3])
def test_counts_of_a_perfect_and_a_useless_drafter_are_worked_out_by_hand(replay, rows):
    d = data()
    k, length = 4, 20
    clock = replay.StepClock(1.0, 0.25, 0.5, 0.125, 0.001)
    good = replay.replay(d, Scripted(d["outputs"], k), rows, clock)
    # after the prefill's first token, each step accepts k and adds a bonus token: 19 = 5 + 5 + 5 + 4, the
    # last step's 4 drafted tokens all accepted (its bonus past the end): 16 accepted a request, in 4 steps
    assert good["accepted"] == 3 * 16 and good["tokens"] == 3 * length
    waves = _wave_rows(3, rows)  # a request joins in the step after the rows before it finished
    assert good["steps"] == len(waves) * (1 + 4)
    bad = replay.replay(d, Scripted(d["outputs"], k, right=False), rows, clock)
    assert bad["accepted"] == 0 and bad["drafted"] == 3 * (length - 1) * k
    assert bad["steps"] == len(waves) * (1 + 19)
    # per wave of w requests: a prefill step (w prompts of 2 tokens), then 19 steps drafting k a row
    want = sum(clock(w, 0, 2 * w) + 19 * clock(w, k * w, 0) for w in waves)
    assert bad["time"] == pytest.approx(want)
    assert clock(2, 3, 4) == pytest.approx(1.0 + 0.25 * 2 + 0.5 * 3 + 0.125 * 4 + 0.001 * 16)


def _wave_rows(n, rows):
    return [min(rows, n - i) for i in range(0, n, rows)]


def test_the_second_turn_holds_the_prompt_the_answer_without_its_stop_and_the_followup(replay):
    d = {"prompts": [[5, 6]], "followups": [[7, 8]], "outputs": [[1, 2, 0], [3, 4, 9]], "eos": 0}
    first, second = replay.turns(d)
    assert first == [(0, [5, 6], [1, 2, 0])] and second == [(1, [5, 6, 1, 2, 7, 8], [3, 4, 9])]
    arm = Scripted({0: [1, 2, 0], 1: [3, 4, 9]}, 1)
    r = replay.replay(d, arm, 1, replay.StepClock())
    assert r["tokens"] == 6 and r["accepted"] == 2 and r["steps"] == 4  # one token drafted and accepted a turn
    # the prefill samples the first token; the step that finishes a request still hands it to the drafter
    assert arm.calls == [[(0, 3, [1])], [(0, 5, [2, 0])], [(1, 7, [3])], [(1, 9, [4, 9])]]


def test_a_request_joins_in_the_step_after_a_row_is_freed_and_a_finished_draft_is_dropped(replay):
    d = {"prompts": [[1], [2]], "followups": None, "outputs": [[10, 11], [20, 21, 22]], "eos": 0}
    arm = Scripted(d["outputs"], 2)
    r = replay.replay(d, arm, 1, replay.StepClock())
    # request 0: prefill (samples 10), then one step accepting 11; request 1 is prefilled the step after
    assert [[c[0] for c in call] for call in arm.calls] == [[0], [0], [1], [1]]
    assert r["drafted"] == 1 + 2 and r["accepted"] == 1 + 2 and r["steps"] == 4


def test_the_adapter_runs_on_the_simulated_clock_and_learns_its_line(replay):
    import numpy as np

    rng = np.random.default_rng(0)
    base = rng.integers(1, 500, 120).tolist()
    d = {"prompts": [base[:60] for _ in range(4)], "followups": None, "eos": 0,
         "outputs": [base[60:] for _ in range(4)]}
    clock = replay.SimClock()
    arm = replay.CoreArm(8, 2, 512, {}, clock)
    r = replay.replay(d, arm, 2, replay.StepClock(0.04, 0.005, 0.005, 0.0, 0.0), clock=clock)
    assert r["accepted"] > 0 and r["drafted"] >= r["accepted"]
    a, c = arm.core.cost.line(2)
    assert c / a == pytest.approx(0.1, rel=0.05)  # two rows: 0.04 + 2 * 0.005 a step, 0.005 a drafted token


def test_the_step_clock_fitted_to_a_trace_is_its_line(replay):
    import numpy as np

    truth = replay.StepClock(0.1, 0.004, 0.002, 0.0018, 2e-7)
    rng = np.random.default_rng(3)
    trace = []
    for _ in range(40):
        rows, prefilling = int(rng.integers(1, 9)), int(rng.integers(0, 3))
        drafted = int(rng.integers(0, 8 * rows))
        prefill = int(rng.integers(50, 400)) * prefilling
        tokens = drafted + (rows - prefilling) + prefill
        total = truth(rows, drafted, prefill)
        trace.append([rows, tokens, drafted, prefilling, 0.9 * total, 0.1 * total])  # forward + sampling
    fit = replay.fit_step_clock(trace)
    for got, want in zip(dataclasses.astuple(fit), dataclasses.astuple(truth)):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-12)
    with pytest.raises(ValueError, match="at least 5 rows"):
        replay.fit_step_clock(trace[:3])


@pytest.mark.parametrize("content, args, expected", [
    (None, [], "--outputs: cannot read"),
    ("not json", [], "is not JSON"),
    ("[1]", [], "expected a JSON object of workloads"),
    ('{"multi-turn": {}}', [], "holds no spec-bench, code-edit"),
    ('{"multi-turn": {}}', ["--workloads", "multi-turn", "--rows", "0"], "--rows: expected a comma list"),
    ('{"multi-turn": {}}', ["--workloads", "multi-turn", "--rows", "one"], "--rows: expected a comma list"),
    ('{"multi-turn": {}}', ["--workloads", "multi-turn", "--step-clock", "1,2,3"], "--step-clock: expected"),
    ('{"multi-turn": {}}', ["--workloads", "multi-turn", "--step-clock", "0,0,0,0,0"], "--step-clock: expected"),
    ('{"multi-turn": {}}', ["--workloads", "multi-turn", "--fit-trace", "/nonexistent.json"], "--fit-trace: expected"),
])
def test_bad_outputs_and_rows_are_refused_by_name(replay, tmp_path, capsys, content, args, expected):
    path = tmp_path / "outputs.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as exc:
        replay.main(["--outputs", str(path), *args])
    assert exc.value.code == 2
    assert expected in capsys.readouterr().err
