"""bench/replay_generate.py: its prompt-lookup rule is transformers' own, its stand-in model makes
the real generator reproduce recorded answers, its clairvoyant budget never loses to plain, and its
clairvoyant copier charges what a verbatim copy costs."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "corpora" / "copy_edit_prompts.jsonl"
CURVE = {1: 1.0, 2: 1.05, 4: 1.05, 8: 1.18, 16: 1.44, 32: 2.06, 64: 3.28, 128: 5.63}


@pytest.fixture(scope="module")
def replay():
    spec = importlib.util.spec_from_file_location("replay_generate", ROOT / "bench" / "replay_generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lookup_draft_is_transformers_prompt_lookup(replay):
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    rng = np.random.default_rng(0)
    plain = PromptLookupCandidateGenerator(num_output_tokens=10, max_matching_ngram_size=2, max_length=10**6)
    with_eos = PromptLookupCandidateGenerator(eos_token_id=torch.tensor([2]), num_output_tokens=10,
                                              max_matching_ngram_size=2, max_length=10**6)
    found = cut = 0
    for _ in range(300):
        context = rng.integers(0, int(rng.integers(3, 30)), int(rng.integers(2, 80))).tolist()
        for hf, eos in ((plain, None), (with_eos, 2)):
            candidate, _ = hf.get_candidates(torch.tensor([context]))
            want = candidate[0, len(context) :].tolist()
            assert replay.lookup_draft(context, 10, eos=eos) == want
            found += bool(want)
        cut += len(replay.lookup_draft(context, 10)) > len(replay.lookup_draft(context, 10, eos=2))
    assert found > 400 and cut > 20  # most contexts of a small vocabulary repeat a token; some drafts hold a 2


def test_trace_model_reproduces_recorded_answers(replay):
    from suffixspec.draft.proposer import Proposer
    from suffixspec.generate import CostModel, SpeculativeGenerator

    rows = [json.loads(line) for line in SHIPPED.read_text().splitlines()][:3]
    model = replay.trace_model(vocab=1 << 16, eos=-1)
    sizes = sorted(CURVE)
    gen = SpeculativeGenerator(model, proposer=Proposer(global_cache=False),
                               cost_model=CostModel(sizes, [CURVE[s] for s in sizes]))
    gen.assume_support(None)
    drafted = 0
    for row in rows:
        answer = row["output_ids"][:60]
        model.tokens = np.array(row["prompt_ids"] + answer + [0], np.int64)
        model.charged = []
        res = gen.generate([row["prompt_ids"]], max_new_tokens=len(answer))
        assert res.sequences[0] == answer
        drafted += res.stats.accepted
        # the prompt is fed once (with any drafts riding along), then one token plus a tree a round
        assert len(row["prompt_ids"]) <= model.charged[0] <= len(row["prompt_ids"]) + 64
        assert all(1 <= t <= 65 for t in model.charged[1:]) and len(model.charged) == res.stats.rounds
    assert drafted > 60  # copy edits: most tokens came from accepted drafts


def test_clairvoyant_never_slower_than_plain_and_main_reports(replay, tmp_path, capsys):
    cost = replay.StepCost(CURVE, 0.037)
    assert cost(1) == 1.0 and cost(128) == 5.63 and cost(1000) == pytest.approx(37.0) and cost(129) == 5.63
    rows = [json.loads(line) for line in SHIPPED.read_text().splitlines()][:2]
    for row in rows:
        answer = row["output_ids"][:50]
        steps = replay.clairvoyant_steps(row["prompt_ids"], answer, cost)
        assert steps <= (len(answer) - 1) * cost(1) + 1e-9  # every round at least plain's rate
        assert replay.lookup_steps(row["prompt_ids"], answer, cost, 10) < (len(answer) - 1) * cost(1)  # copies pay
    prompt = np.random.default_rng(1).integers(3, 1000, 100).tolist()
    answer = prompt[:70]  # a verbatim copy: one 64-token chain, then the last 3 of the 69 left
    assert replay.copier_steps(prompt, answer, cost) == pytest.approx(cost(65) + cost(4))
    # prompt lookup: the prompt's pass drafts what follows its last token's first occurrence (none in
    # a prompt of distinct tokens), then 10 a round from the copy: rounds of 11 tokens
    distinct = list(range(3, 103))
    steps = replay.lookup_steps(distinct, distinct[:45], cost, 10)
    assert steps == pytest.approx(cost(100) + 4 * cost(11))  # 1 + 4 x 11 = 45 tokens
    assert replay.copier_steps(prompt, answer, cost) < replay.clairvoyant_steps(prompt, answer, cost) + 1e-9
    small = tmp_path / "two.jsonl"
    small.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert replay.main([str(small), "--max-new-tokens", "40", "--curve", json.dumps(CURVE)]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    got = report["sets"]["two.jsonl"]
    assert got["prompts"] == 2 and got["ours_vs_plain"] > 1.0 and got["clairvoyant_vs_pld"] > 0
    assert got["copier_vs_pld"] >= got["clairvoyant_vs_pld"] * 0.95  # copies of any span beat our trees' paths


@pytest.mark.parametrize("text, got", [("[1]", "got list"), ("{bad", "got '{bad'")])
def test_options_not_a_json_object_is_refused_by_name(replay, text, got, capsys):
    with pytest.raises(SystemExit) as exit_info:
        replay.main(["--options", text])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --options: expected a JSON object of proposer knobs" in err and got in err
