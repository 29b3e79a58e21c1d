"""`bench/bench_vllm_replay.py`'s replay loop without vLLM: a scripted drafter whose drafts are known
gives the step and acceptance counts worked out by hand, and the adapter's `DraftCore` runs through
it on the simulated clock (the cost it learns is the replay's line)."""

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
    good = replay.replay(d, Scripted(d["outputs"], k), rows, slope=0.5)
    # after the prefill's first token, each step accepts k and adds a bonus token: 19 = 5 + 5 + 5 + 4, the
    # last step's 4 drafted tokens all accepted (its bonus past the end): 16 accepted a request, in 4 steps
    assert good["accepted"] == 3 * 16 and good["tokens"] == 3 * length
    assert good["steps"] == {1: 12, 2: 8, 3: 4}[rows]
    bad = replay.replay(d, Scripted(d["outputs"], k, right=False), rows, slope=0.5)
    assert bad["accepted"] == 0 and bad["drafted"] == 3 * (length - 1) * k
    steps_per_request = {1: 3 * 19, 2: 2 * 19, 3: 19}[rows]  # requests in waves of `rows`
    assert bad["steps"] == steps_per_request
    # a step of b rows feeding T tokens costs 1 + slope (T - b): here every step drafts k a row
    assert bad["time"] == pytest.approx(sum(1 + 0.5 * k * b for b in _wave_rows(3, rows) for _ in range(19)))


def _wave_rows(n, rows):
    return [min(rows, n - i) for i in range(0, n, rows)]


def test_the_second_turn_holds_the_prompt_the_answer_without_its_stop_and_the_followup(replay):
    d = {"prompts": [[5, 6]], "followups": [[7, 8]], "outputs": [[1, 2, 0], [3, 4, 9]], "eos": 0}
    first, second = replay.turns(d)
    assert first == [(0, [5, 6], [1, 2, 0])] and second == [(1, [5, 6, 1, 2, 7, 8], [3, 4, 9])]
    arm = Scripted({0: [1, 2, 0], 1: [3, 4, 9]}, 1)
    r = replay.replay(d, arm, 1, slope=0.0)
    assert r["tokens"] == 6 and r["accepted"] == 2  # one token drafted and accepted a turn
    assert arm.calls[0] == [(0, 3, [1])] and arm.calls[-1] == [(1, 7, [3])]


def test_the_adapter_runs_on_the_simulated_clock_and_learns_its_line(replay):
    import numpy as np

    rng = np.random.default_rng(0)
    base = rng.integers(1, 500, 120).tolist()
    d = {"prompts": [base[:60] for _ in range(4)], "followups": None, "eos": 0,
         "outputs": [base[60:] for _ in range(4)]}
    clock = replay.SimClock()
    from unittest import mock

    from suffixspec.integrations import vllm_core

    with mock.patch.object(vllm_core, "time", clock):
        arm = replay.CoreArm(8, 2, 512, {})
        r = replay.replay(d, arm, 2, slope=0.1, clock=clock)
    assert r["accepted"] > 0 and r["drafted"] >= r["accepted"]
    a, c = arm.core.cost.line(2)
    assert c / a == pytest.approx(0.1, rel=0.05)  # the replay's line: 1 + 0.1 x, in units of 0.05 s


@pytest.mark.parametrize("content, args, expected", [
    (None, [], "--outputs: cannot read"),
    ("not json", [], "is not JSON"),
    ("[1]", [], "expected a JSON object of workloads"),
    ('{"multi-turn": {}}', [], "holds no spec-bench, code-edit"),
    ('{"multi-turn": {}}', ["--workloads", "multi-turn", "--rows", "0"], "--rows: expected a comma list"),
    ('{"multi-turn": {}}', ["--workloads", "multi-turn", "--rows", "one"], "--rows: expected a comma list"),
])
def test_bad_outputs_and_rows_are_refused_by_name(replay, tmp_path, capsys, content, args, expected):
    path = tmp_path / "outputs.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as exc:
        replay.main(["--outputs", str(path), *args])
    assert exc.value.code == 2
    assert expected in capsys.readouterr().err
