"""`bench/bench_recycle.py --flat-cost`'s pass accounting: every decode pass charged what the pinned
curve says for the tokens it feeds (all rows together, as the engine prices it), against plain
decoding of the same outputs in the same batches. Plain decoding charged pass by pass must equal the
closed form when a batch's rows start together, and a speculative run's counted passes must be its
rounds after the prefill."""

import numpy as np
import pytest

from support.http import ROOT
from support.tiny_models import tiny_model


@pytest.fixture
def br(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its sibling modules, as `python bench/x.py` finds them
    import bench_recycle

    return bench_recycle


def test_plain_steps_against_a_brute_force_count(br):
    for lengths in ([1], [5], [3, 5, 5], [7, 2, 9, 9], [4, 4, 4, 4]):
        want = 0.0
        for t in range(2, max(lengths) + 1):  # pass t gives every output at least t long its t-th token
            rows = sum(1 for n in lengths if n >= t)
            want += 1.0 + 0.002 * (rows - 1)
        assert br.plain_steps(lengths) == pytest.approx(want, abs=1e-12)
    assert br.plain_steps([]) == 0.0


def _prompts(seed, n, length=24, vocab=97):
    """Prompts of one length with distinct first tokens (a batch is read in one pass, its rows start
    together), each repeating its own motif (the copy source drafts)."""
    rng = np.random.default_rng(seed)
    firsts = rng.permutation(np.arange(1, vocab))[:n]
    return [([int(f)] + rng.integers(1, vocab, 5).tolist()) * (length // 6) for f in firsts]


@pytest.mark.parametrize("source", ["copy", "both"])
def test_plain_decoding_charged_pass_by_pass_is_the_closed_form(br, source):
    model = tiny_model("llama", vocab=97, seed=3)
    got = br.run_setting(model, None, _prompts(0, 6), source, 0, 4, 12, True, [])
    assert got["drafted"] == 0
    assert got["pass_steps"] == pytest.approx(got["plain_steps"], rel=1e-12)
    assert got["passes"] == sum(max(len(o) for o in got["outputs"][a: a + 4]) - 1 for a in (0, 4))


@pytest.mark.parametrize("budget", [8, "auto"])
def test_a_speculative_run_counts_its_rounds_after_the_prefill(br, monkeypatch, budget):
    """Each request-round after the first is in one counted pass with the batch's other rows; a
    pass feeds at least one token a row and every drafted node."""
    rounds = []
    import suffixspec.engine.engine as eng

    real = eng.Engine.run

    def run(self):
        result = real(self)
        rounds.append(max(r.rounds for r in result.stats.requests))  # the batch's rows start together
        return result

    monkeypatch.setattr(eng.Engine, "run", run)
    model = tiny_model("llama", vocab=97, seed=3)
    got = br.run_setting(model, None, _prompts(1, 6), "copy", budget, 4, 16, True, [])
    assert got["passes"] == sum(r - 1 for r in rounds)
    assert got["drafted"] > 0 and got["passes"] < sum(len(o) - 1 for o in got["outputs"])
    assert got["pass_steps"] > got["passes"]  # a pass of trees costs more than a one-token step
