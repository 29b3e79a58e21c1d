"""Tree verification: one batched pass equals sequential recomputation; KV bookkeeping; acceptance."""

import numpy as np
import pytest
import torch

from suffixspec.draft.tree import DraftTree
from suffixspec.verify.accept import Sampler, accept, argmax_rows, uniform_draw
from suffixspec.verify.batch import RoundBatch
from suffixspec.verify.kv import KVState, _append, check_tree_logits
from suffixspec.verify.support import tree_attention_support

from support.tiny_models import FAMILIES, tiny_model

ALL = [(k, a) for k in (*FAMILIES, "gemma3") for a in ("sdpa", "eager")] + [
    (k, "suffixspec_sdpa") for k in ("llama", "qwen2", "gemma3")  # grouped key/value heads
]


def random_tree(rng, vocab, n):
    parents = [-1]
    for i in range(1, n):
        parents.append(int(rng.integers(-1, i)))
    tokens, seen = [], set()
    for i, p in enumerate(parents):
        while True:
            t = int(rng.integers(0, vocab))
            if (p, t) not in seen:
                seen.add((p, t))
                tokens.append(t)
                break
    return DraftTree(tokens, parents)


def sequential_logits(model, tokens):
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0].float()


@pytest.mark.parametrize("kind,attn", ALL)
def test_self_check(kind, attn):
    assert check_tree_logits(tiny_model(kind, attn)) < (1e-6 if attn == "eager" else 1e-9)


@pytest.mark.parametrize("kind,attn", ALL)
def test_rounds_match_full_recomputation(kind, attn):
    """Several rounds over a batch of mixed lengths with random trees and random accepted paths:
    after every round, every node's logits equal a from-scratch forward over its full context."""
    model = tiny_model(kind, attn)
    vocab = model.config.vocab_size
    atol = 1e-6 if attn == "eager" else 1e-9  # eager attention takes its softmax in float32
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, vocab, n).tolist() for n in (3, 11, 1, 6)]
    state = KVState(model, len(prompts))
    committed = [list(p) for p in prompts]
    pending = [list(p) for p in prompts]
    for round_ in range(6):
        # the last round drafts nothing: one token a row over a cache with holes (mask path, not _step)
        trees = [random_tree(rng, vocab, int(rng.integers(0, 9))) if round_ < 5 else DraftTree.empty() for _ in prompts]
        logits, root = state.forward(pending, trees)
        kept = []
        for r, tree in enumerate(trees):
            ref = sequential_logits(model, committed[r])
            np.testing.assert_allclose(logits[r, root[r]].numpy(), ref[-1].numpy(), atol=atol)
            for path in tree.paths():
                seq = committed[r] + tree.tokens[path].tolist()
                ref = sequential_logits(model, seq)
                got = logits[r, root[r] + 1 + path]
                np.testing.assert_allclose(got.numpy(), ref[len(committed[r]):].numpy(), atol=atol)
            # accept a random root path (possibly empty), then a fresh bonus token
            path = tree.paths()[int(rng.integers(0, len(tree.paths())))] if len(tree) else np.zeros(0, int)
            path = path[: int(rng.integers(0, len(path) + 1))]
            kept.append(path.tolist())
            bonus = int(rng.integers(0, vocab))
            committed[r] += tree.tokens[path].tolist() + [bonus]
            pending[r] = [bonus]
        state.commit(kept)
        assert state.n_cached.tolist() == [len(c) - 1 for c in committed]
        # the invariant `forward` relies on: a row's valid slots are its n_cached tokens
        assert (state.slot_pos >= 0).sum(dim=1).tolist() == state.n_cached.tolist()
        if round_ == 2:  # drop a finished request mid-way
            keep = [0, 2, 3]
            state.select_rows(keep)
            prompts = [prompts[i] for i in keep]
            committed = [committed[i] for i in keep]
            pending = [pending[i] for i in keep]
            assert (state.slot_pos >= 0).sum(dim=1).tolist() == state.n_cached.tolist()
    assert bool((state.slot_pos < 0).any())  # rows of different lengths: the last round had holes


def test_growing_cache_append_equals_concatenation():
    """Appends, crops, in-place rewrites and regathers against a plain concatenated tensor."""
    rng = np.random.default_rng(11)
    ref = torch.zeros((2, 3, 0, 4), dtype=torch.float64)
    view, buf, in_place = torch.tensor([], dtype=torch.float64), None, 0
    for step in range(300):
        op = rng.integers(0, 6)
        if op == 0 and ref.shape[2]:  # crop, as KVState does after acceptance
            n = int(rng.integers(0, ref.shape[2]))
            ref, view = ref[:, :, :n], view[:, :, :n]
        elif op == 1 and ref.shape[2] > 1:  # rewrite a tail in place
            start = int(rng.integers(0, ref.shape[2]))
            fresh = torch.randn(2, 3, ref.shape[2] - start, 4, dtype=torch.float64)
            ref = torch.cat([ref[:, :, :start], fresh], 2)
            view[:, :, start:] = fresh
        elif op == 2 and ref.shape[2]:  # regather (compaction): a new tensor, no longer the buffer's view
            idx = torch.from_numpy(np.sort(rng.choice(ref.shape[2], int(rng.integers(1, ref.shape[2] + 1)), replace=False)))
            ref, view = ref[:, :, idx], view[:, :, idx]
        else:
            new = torch.randn(2, 3, int(rng.integers(1, 90)), 4, dtype=torch.float64)
            before = buf.data_ptr() if buf is not None else None
            ref = torch.cat([ref, new], 2)
            view, buf = _append(view, buf, new)
            in_place += buf.data_ptr() == before
        assert torch.equal(view, ref)
    assert in_place > 50  # the point: most appends write into the existing buffer


def test_growing_layer_fast_path_equals_concatenation():
    """The cache layer's updates (fast path while its views are its own), crops, in-place tail
    rewrites, regathers and row selections (new tensors: the checked path) against plain tensors,
    keys and values of different widths."""
    from suffixspec.verify.kv import _growing_layer_class

    rng = np.random.default_rng(12)
    layer = _growing_layer_class()()
    rows = 3
    ref_k, ref_v = torch.zeros((rows, 2, 0, 4), dtype=torch.float64), torch.zeros((rows, 2, 0, 5), dtype=torch.float64)
    fast = 0
    for step in range(400):
        op = rng.integers(0, 8)
        n = ref_k.shape[2]
        if op == 0 and n:  # crop, as KVState._crop does after acceptance
            m = int(rng.integers(0, n + 1))
            layer.crop_to(m)
            ref_k, ref_v = ref_k[:, :, :m], ref_v[:, :, :m]
        elif op == 1 and n > 1:  # rewrite a tail in place (KVState._rewrite_tail)
            start = int(rng.integers(0, n))
            fk, fv = torch.randn(rows, 2, n - start, 4, dtype=torch.float64), torch.randn(rows, 2, n - start, 5, dtype=torch.float64)
            layer.keys[:, :, start:] = fk
            layer.values[:, :, start:] = fv
            ref_k, ref_v = torch.cat([ref_k[:, :, :start], fk], 2), torch.cat([ref_v[:, :, :start], fv], 2)
        elif op == 2 and n:  # regather slots (compaction): new tensors
            idx = torch.from_numpy(np.sort(rng.choice(n, int(rng.integers(1, n + 1)), replace=False)))
            layer.keys, layer.values = layer.keys[:, :, idx], layer.values[:, :, idx]
            ref_k, ref_v = ref_k[:, :, idx], ref_v[:, :, idx]
        elif op == 3 and n and rows > 1:  # finished rows leave (select_rows): new tensors, fewer rows
            keep = torch.tensor(sorted(rng.choice(rows, rows - 1, replace=False)))
            layer.keys, layer.values = layer.keys.index_select(0, keep), layer.values.index_select(0, keep)
            ref_k, ref_v = ref_k.index_select(0, keep), ref_v.index_select(0, keep)
            rows -= 1
        else:
            k = int(rng.integers(1, 70))
            nk, nv = torch.randn(rows, 2, k, 4, dtype=torch.float64), torch.randn(rows, 2, k, 5, dtype=torch.float64)
            fast += layer.keys is not None and layer.keys is layer._klast
            got_k, got_v = layer.update(nk, nv)
            ref_k, ref_v = torch.cat([ref_k, nk], 2), torch.cat([ref_v, nv], 2)
            assert got_k is layer.keys and got_v is layer.values
        if rows == 1 and step % 50 == 49:  # new rows arrive: start again with more
            rows = 3
            layer = _growing_layer_class()()
            ref_k, ref_v = torch.zeros((rows, 2, 0, 4), dtype=torch.float64), torch.zeros((rows, 2, 0, 5), dtype=torch.float64)
        if layer.keys is not None and layer.keys.numel():
            assert torch.equal(layer.keys, ref_k) and torch.equal(layer.values, ref_v)
    assert fast > 60  # most updates took the fast path


@pytest.mark.parametrize("kind,attn", [(k, "sdpa") for k in FAMILIES] + [("llama", "suffixspec_sdpa"), ("qwen2", "eager")])
def test_one_token_steps_without_holes_match_recomputation(kind, attn):
    """Rows of one prompt length, one token a round, and a tree round whose rows all keep one node:
    the cache never has holes, so every one-token pass takes the maskless path (`_step`, for Qwen2
    with its full-attention layer types too), and its logits, slot positions and counts equal a
    from-scratch forward."""
    model = tiny_model(kind, attn)
    vocab = model.config.vocab_size
    atol = 1e-6 if attn == "eager" else 1e-9
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, vocab, 5).tolist() for _ in range(3)]
    state = KVState(model, 3)
    steps = []
    real_step = state._step
    state._step = lambda tokens: (steps.append(len(tokens)), real_step(tokens))[1]
    committed = [list(p) for p in prompts]
    pending = [list(p) for p in prompts]
    for round_ in range(8):
        trees = [random_tree(rng, vocab, 3) if round_ == 3 else DraftTree.empty() for _ in prompts]
        logits, root = state.forward(pending, trees)
        for r in range(3):
            ref = sequential_logits(model, committed[r])
            np.testing.assert_allclose(logits[r, root[r]].numpy(), ref[-1].numpy(), atol=atol)
        kept = [[0] if round_ == 3 else [] for _ in range(3)]
        state.commit(kept)
        for r in range(3):
            bonus = int(rng.integers(0, vocab))
            committed[r] += ([int(trees[r].tokens[0])] if kept[r] else []) + [bonus]
            pending[r] = [bonus]
        assert state.n_cached.tolist() == [len(c) - 1 for c in committed]
        assert bool((state.slot_pos >= 0).all())
        assert state.slot_pos.tolist() == [list(range(len(c) - 1)) for c in committed]
    assert steps == [3] * 6  # every round but the prefill and the tree round


def test_greedy_accept_without_drafts_equals_the_walk():
    """The one-argmax shortcut (greedy, no processors, no drafts) against the general walk, which an
    identity logits processor forces: ties, limits of 0, end-of-sequence tokens."""
    rng = np.random.default_rng(4)

    class Identity:
        def __call__(self, input_ids, scores):
            return scores

    for _ in range(50):
        b, vocab = int(rng.integers(1, 6)), 7
        logits = torch.from_numpy(rng.integers(0, 3, (b, 1, vocab)).astype(np.float32))  # many ties
        trees = [DraftTree.empty() for _ in range(b)]
        limits = rng.integers(0, 3, b).tolist()
        eos = frozenset(int(t) for t in rng.integers(0, vocab, 2))
        def batch(sampler):
            return RoundBatch.build(trees, limits, samplers=sampler, eos=eos, contexts=[[1, 2]] * b,
                                    keys=list(range(b)), generated=[0] * b)

        fast = accept(logits, np.zeros(b, np.int64), batch(Sampler()))
        walk = accept(logits, np.zeros(b, np.int64), batch(Sampler(logits_processor=[Identity()])))
        assert [(x.tokens, x.accepted_nodes, x.stopped_on_eos) for x in fast] == \
            [(x.tokens, x.accepted_nodes, x.stopped_on_eos) for x in walk]


def test_kv_cache_is_not_copied_on_every_pass():
    model = tiny_model("llama")
    state = KVState(model, 2)
    rng = np.random.default_rng(5)
    state.forward([[1, 2, 3], [4, 5]], [DraftTree.empty(), DraftTree.empty()])
    state.commit([[], []])
    buffers = [layer._kbuf.data_ptr() for layer in state.cache.layers]
    for _ in range(6):
        trees = [random_tree(rng, model.config.vocab_size, 4) for _ in range(2)]
        state.forward([[7], [8]], trees)
        state.commit([[0], []])
    assert [layer._kbuf.data_ptr() for layer in state.cache.layers] == buffers


def test_added_rows_keep_the_slot_invariant_and_logits():
    """Rows joining a running batch (`add_rows`): the shorter cache is padded with holes, every
    row's valid slots stay its `n_cached` tokens, and one-token passes over the joined cache (holes:
    the mask path) and then, after compaction, without holes (the maskless step) equal recomputation."""
    model = tiny_model("llama")
    vocab = model.config.vocab_size
    rng = np.random.default_rng(11)
    seqs = [rng.integers(0, vocab, n).tolist() for n in (9, 4)]
    running = KVState(model, 1)
    running.forward([seqs[0]], [DraftTree.empty()])
    running.commit([[]])
    newcomer = KVState(model, 1)
    newcomer.forward([seqs[1]], [DraftTree.empty()])
    newcomer.commit([[]])
    running.add_rows(newcomer)
    assert running.n_cached.tolist() == [9, 4] and running.cache_len == 9
    assert (running.slot_pos >= 0).sum(dim=1).tolist() == running.n_cached.tolist()
    steps = []
    real_step = running._step
    running._step = lambda tokens: (steps.append(len(tokens)), real_step(tokens))[1]
    for round_ in range(3):
        if round_ == 2:
            running.select_rows([1])  # the longer request finished: compaction leaves no hole
        nxt = [[int(rng.integers(0, vocab))] for _ in range(running.batch_size)]
        logits, root = running.forward(nxt, [DraftTree.empty()] * running.batch_size)
        running.commit([[]] * running.batch_size)
        if round_ == 2:
            seqs = [seqs[1]]
        for r in range(running.batch_size):
            seqs[r] = seqs[r] + nxt[r]
            ref = sequential_logits(model, seqs[r])[-1]
            np.testing.assert_allclose(logits[r, root[r]].numpy(), ref.numpy(), atol=1e-9)
        assert (running.slot_pos >= 0).sum(dim=1).tolist() == running.n_cached.tolist()
    assert steps == [1]  # only the round without holes took the maskless step


def test_compaction_keeps_logits():
    model = tiny_model("llama")
    state = KVState(model, 2)
    seqs = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [5]]
    state.forward([seqs[0], seqs[1]], [DraftTree.empty(), DraftTree.empty()])
    state.commit([[], []])
    assert (state.slot_pos < 0).sum() == 9  # the short row's holes
    state.compact()
    assert state.cache_len == 10 and (state.slot_pos[1] >= 0).sum() == 1
    logits, root = state.forward([[11], [6]], [DraftTree.empty(), DraftTree.empty()])
    np.testing.assert_allclose(logits[0, root[0]].numpy(), sequential_logits(model, seqs[0] + [11])[-1].numpy(), atol=1e-9)
    np.testing.assert_allclose(logits[1, root[1]].numpy(), sequential_logits(model, [5, 6])[-1].numpy(), atol=1e-9)


def test_sliding_window_mask_matters():
    """With a window smaller than the context, ignoring the window changes the logits (so the
    window test above is meaningful)."""
    model = tiny_model("gemma3", window=3)
    prompt = list(range(1, 12))
    state = KVState(model, 1)
    state._types = None  # pretend there is no window
    logits, root = state.forward([prompt], [DraftTree.empty()])
    ref = sequential_logits(model, prompt)[-1]
    assert float((logits[0, root[0]] - ref).abs().max()) > 1e-6


def test_unsupported_attention_is_detected():
    model = tiny_model("llama")
    assert tree_attention_support(model) is None
    model.config._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in tree_attention_support(model)


# ------------------------------------------------------------------------------------ acceptance


def naive_greedy_walk(tree, targets_at):
    """Brute force: the longest root path whose tokens equal the target's argmax choices."""
    best = []
    for path in tree.paths():
        for cut in range(len(path) + 1):
            prefix = path[:cut].tolist()
            ok = all(tree.tokens[n] == targets_at(prefix[:i]) for i, n in enumerate(prefix))
            if ok and len(prefix) > len(best):
                best = prefix
    return best


def test_greedy_accept_matches_brute_force():
    rng = np.random.default_rng(11)
    vocab = 6
    for _ in range(200):
        tree = random_tree(rng, vocab, int(rng.integers(0, 12)))
        logits = torch.randn(1, len(tree) + 1, vocab)
        def target(prefix_nodes):
            node = prefix_nodes[-1] if prefix_nodes else -1
            return int(logits[0, node + 1].argmax())
        res = accept(logits, np.array([0]), RoundBatch.build([tree], [100], contexts=[[0]], samplers=Sampler()))[0]
        best = naive_greedy_walk(tree, target)
        assert res.accepted_nodes == best
        assert res.tokens[:-1] == tree.tokens[best].tolist()
        assert res.tokens[-1] == target(best)


def test_accept_respects_limit_and_eos():
    tree = DraftTree([1, 2, 3], [-1, 0, 1])
    logits = torch.full((1, 4, 5), -10.0)
    for i, tok in enumerate([1, 2, 3, 4]):
        logits[0, i, tok] = 10.0
    full = accept(logits, np.array([0]), RoundBatch.build([tree], [10], contexts=[[0]], samplers=Sampler()))[0]
    assert full.tokens == [1, 2, 3, 4] and full.accepted_nodes == [0, 1, 2]
    cut = accept(logits, np.array([0]), RoundBatch.build([tree], [2], contexts=[[0]], samplers=Sampler()))[0]
    assert cut.tokens == [1, 2] and cut.accepted_nodes == [0]
    eos = accept(logits, np.array([0]), RoundBatch.build([tree], [10], contexts=[[0]], eos=frozenset([2]), samplers=Sampler()))[0]
    assert eos.tokens == [1, 2] and eos.stopped_on_eos and eos.accepted_nodes == [0]


def test_uniform_draw_is_deterministic_and_uniform():
    assert uniform_draw(1, 2, 3) == uniform_draw(1, 2, 3)
    assert len({uniform_draw(1, 2, p) for p in range(100)}) == 100
    u = np.array([uniform_draw(5, r, p) for r in range(50) for p in range(100)])
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.02


def test_sampler_inverse_cdf_distribution():
    scores = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
    sampler = Sampler(do_sample=True, seed=3)
    draws = [sampler.choose(scores, [(r, 0)])[0] for r in range(4000)]
    freq = np.bincount(draws, minlength=4) / 4000
    np.testing.assert_allclose(freq, [0.1, 0.2, 0.3, 0.4], atol=0.03)


def test_sampler_warpers_follow_transformers_order():
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = torch.randn(3, 50)
    ours = Sampler(do_sample=True, temperature=0.7, top_k=10, top_p=0.8).process([], scores.clone())
    ref = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(10), TopPLogitsWarper(0.8)])(
        torch.zeros(3, 1, dtype=torch.long), scores.clone())
    assert torch.equal(ours, ref)


def test_argmax_rows_equals_torch_argmax():
    """Ties (the first maximum), strided rows (a slice of [b, K, vocab] logits), float64, rows of
    -inf, NaN (torch counts it as the maximum), and a dtype numpy cannot read (torch's own path)."""
    rng = np.random.default_rng(8)
    for _ in range(30):
        b, k, vocab = int(rng.integers(1, 7)), int(rng.integers(1, 4)), int(rng.integers(2, 50))
        logits = torch.from_numpy(rng.integers(0, 3, (b, k, vocab)).astype(np.float32))  # many ties
        if rng.random() < 0.3:
            logits[0, :, :] = float("-inf")
        if rng.random() < 0.3:
            logits[-1, 0, int(rng.integers(0, vocab))] = float("nan")
        for scores in (logits[:, 0], logits[:, -1], logits[:, 0].double(), logits[:, 0].to(torch.bfloat16)):
            assert argmax_rows(scores) == scores.argmax(dim=-1).tolist()
