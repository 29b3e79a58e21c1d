"""The prefix pool (`verify.prefix.PrefixPool`) against a brute-force reference, and the engine's
reuse of it: exact greedy outputs, shared prefixes read once, no draft position ever kept, the bound
held under eviction, sampling keyed as without the cache."""

import numpy as np
import pytest
import torch

from suffixspec.draft.proposer import Proposer
from suffixspec.draft.tree import DraftTree
from suffixspec.errors import BadInputError
from suffixspec.generate import SpeculativeGenerator
from suffixspec.verify.kv import KVState
from suffixspec.verify.prefix import PrefixPool

from support.prompts import VOCAB
from support.tiny_models import StandInProposer, hf_generate, tiny_model

LAYERS, HEADS, DIM = 2, 1, 3


def synthetic_kv(tokens, start, end):
    """Keys and values that name their token and position: entry [0, i] = (token, position, layer)."""
    out = []
    for layer in range(LAYERS):
        k = torch.tensor([[[float(tokens[i]), float(i), float(layer)] for i in range(start, end)]])
        out.append((k, -k))
    return out


def brute_match(kept: list[list[int]], tokens: list[int], limit: int) -> int:
    best = 0
    for seq in kept:
        n = 0
        while n < min(len(seq), len(tokens), limit) and seq[n] == tokens[n]:
            n += 1
        best = max(best, n)
    return best


@pytest.mark.parametrize("seed", range(4))
def test_the_pool_finds_the_longest_kept_prefix_and_its_exact_keys(seed):
    """Random sequences over a small alphabet (many shared prefixes, splits everywhere): every match
    equals the brute-force longest common prefix with what was inserted, and the fetched keys and
    values are those of the matched tokens at their positions."""
    rng = np.random.default_rng(seed)
    pool = PrefixPool(1 << 40)
    kept: list[list[int]] = []
    for step in range(60):
        base = kept[rng.integers(len(kept))] if kept and rng.random() < 0.7 else []
        cut = int(rng.integers(0, len(base) + 1))
        seq = base[:cut] + rng.integers(0, 4, int(rng.integers(1, 12))).tolist()
        if rng.random() < 0.5:
            pool.insert(seq, lambda s, e, seq=seq: synthetic_kv(seq, s, e))
            kept.append(seq)
        limit = int(rng.integers(0, len(seq) + 2))
        found = pool.match(seq, limit)
        assert found.length == brute_match(kept, seq, limit), (step, seq, limit)
        if found.length:
            fetched = pool.fetch(found)
            want = synthetic_kv(seq, 0, found.length)
            for (k, v), (wk, wv) in zip(fetched, want):
                assert torch.equal(k, wk) and torch.equal(v, wv)
        found.release()
    assert pool.tokens <= sum(len(s) for s in kept)
    assert all(n.pins == 0 for n in _nodes(pool))


def matched(pool, seq) -> int:
    found = pool.match(seq)
    found.release()
    return found.length


def _nodes(pool):
    stack = list(pool.root.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def test_the_pool_evicts_least_recently_used_leaves_within_its_bound_and_spares_pinned_ones():
    per_token = LAYERS * 2 * HEADS * DIM * 4  # float32 keys and values
    pool = PrefixPool(20 * per_token)
    a, b, c = [1] * 8, [2] * 8, [3] * 8
    for seq in (a, b):
        pool.insert(seq, lambda s, e, seq=seq: synthetic_kv(seq, s, e))
    assert pool.nbytes == 16 * per_token and pool.counters.evictions == 0
    pool.match(a).release()  # a is now more recent than b
    pinned = pool.match(b)  # ... but b is pinned
    pool.insert(c, lambda s, e: synthetic_kv(c, s, e))
    assert pool.nbytes <= 20 * per_token
    assert matched(pool, b) == 8 and matched(pool, a) == 0 and matched(pool, c) == 8
    pinned.release()
    big = [4] * 50  # more than the bound: kept only up to it
    pool.insert(big, lambda s, e: synthetic_kv(big, s, e))
    assert pool.nbytes <= 20 * per_token and matched(pool, big) == 20
    assert sum(1 for _ in _nodes(pool)) == 1
    pool.clear()
    assert pool.nbytes == 0 and pool.tokens == 0


def test_a_split_keeps_the_bytes_counted_equal_to_the_bytes_held():
    pool = PrefixPool(1 << 30)
    for seq in ([5, 6, 7, 8, 9], [5, 6, 1], [5, 2]):
        pool.insert(seq, lambda s, e, seq=seq: synthetic_kv(seq, s, e))
    held = sum(sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in n.kv) for n in _nodes(pool))
    assert pool.nbytes == held and pool.tokens == 5 + 1 + 1


def test_bad_bounds_are_refused_by_name():
    with pytest.raises(BadInputError, match="prefix_cache_bytes"):
        SpeculativeGenerator(tiny_model("llama"), prefix_cache_bytes=-1)
    with pytest.raises(BadInputError, match="prefix_cache_bytes"):
        SpeculativeGenerator(tiny_model("llama"), prefix_cache_bytes="lots")
    assert SpeculativeGenerator(tiny_model("llama"), prefix_cache_bytes=0).prefix_pool is None


@pytest.mark.parametrize("kind", ["llama", "gemma3", "gpt2"])
def test_prompts_sharing_a_system_prompt_read_it_once_and_equal_plain_decoding(kind):
    """A shared system prompt over several turns and budgets: outputs equal transformers' greedy
    decoding; the system prompt is read once for all four prompts admitted together, then found."""
    model = tiny_model(kind, sharpen=4.0)
    rng = np.random.default_rng(3)
    system = rng.integers(1, VOCAB, 40).tolist()
    prompts = [system + rng.integers(1, VOCAB, n).tolist() for n in (3, 9, 20, 1)]
    refs = [hf_generate(model, p, 16) for p in prompts]
    gen = SpeculativeGenerator(model, proposer=Proposer(global_cache=False))
    first = gen.generate(prompts, max_new_tokens=16, budget=0)
    assert first.sequences == refs
    assert first.stats.prefill_tokens == 40 + sum(len(p) - 40 for p in prompts)  # the system prompt once
    assert [r.cached_tokens for r in first.stats.requests] == [0, 40, 40, 40]  # the first paid for it
    for budget in (8, "auto"):
        res = gen.generate(prompts, max_new_tokens=16, budget=budget)
        assert res.sequences == refs
        assert [r.cached_tokens for r in res.stats.requests] == [len(p) - 1 for p in prompts]
    follow = prompts[1] + refs[1] + rng.integers(1, VOCAB, 5).tolist()  # the next turn of a conversation
    res = gen.generate([follow], max_new_tokens=16, budget=8)
    assert res.sequences == [hf_generate(model, follow, 16)]
    assert res.stats.requests[0].cached_tokens >= len(prompts[1]) + len(refs[1]) - 1


def test_the_pool_never_holds_a_draft_position():
    """Every round drafts junk (rejected, its keys and values written by the pass, then dropped): what
    the pool keeps for a finished conversation equals the keys and values of its committed tokens
    computed from scratch."""
    model = tiny_model("llama", sharpen=4.0)
    junk = DraftTree.from_paths([[1, 2, 3, 4], [5, 6]], [0.5, 0.4])
    gen = SpeculativeGenerator(model, proposer=StandInProposer(lambda session, budget: junk))
    prompt = np.random.default_rng(5).integers(7, VOCAB, 30).tolist()
    res = gen.generate([prompt], max_new_tokens=20, budget=8)
    assert res.stats.drafted > res.stats.accepted
    committed = prompt + res.sequences[0]
    found = gen.prefix_pool.match(committed)
    assert found.length >= len(committed) - 1
    kept = gen.prefix_pool.fetch(found)
    found.release()
    fresh = KVState(model, 1)
    fresh.forward([committed[: found.length]], [DraftTree.empty()])
    fresh.commit([[]])
    for layer, (k, v) in enumerate(kept):
        want_k, want_v = fresh.row_kv(0, 0, found.length)[layer]
        assert torch.allclose(k, want_k, atol=1e-9) and torch.allclose(v, want_v, atol=1e-9)


def test_an_engine_keeps_its_pool_across_adds_and_cancelled_rows_join_it():
    model = tiny_model("llama", sharpen=4.0)
    gen = SpeculativeGenerator(model, proposer=Proposer(global_cache=False))
    engine = gen.serve(max_new_tokens=12, budget="auto", prefix_cache_bytes=1 << 24)
    assert engine._reuse.pool is not gen.prefix_pool  # its own pool, of its own bound
    prompt = np.random.default_rng(9).integers(1, VOCAB, 60).tolist()
    a = engine.add(prompt)
    engine.step()  # admitted: its prompt is read and kept
    engine.cancel(a)
    engine.step()
    assert engine.finished(a)
    b = engine.add(prompt + [3, 4])
    while not engine.idle:
        engine.step()
    stats = engine.request_stats(b)
    assert stats.cached_tokens >= len(prompt)
    assert engine.output(b) == hf_generate(model, prompt + [3, 4], 12)


def test_eviction_under_a_small_bound_keeps_answers_exact():
    model = tiny_model("llama", sharpen=4.0)
    per_token = 2 * 2 * 2 * 8 * 8  # layers x (k, v) x kv heads x head dim x float64
    gen = SpeculativeGenerator(model, proposer=Proposer(global_cache=False), prefix_cache_bytes=50 * per_token)
    rng = np.random.default_rng(11)
    prompts = [rng.integers(1, VOCAB, 30).tolist() for _ in range(6)]
    for p in prompts + prompts[:2]:
        res = gen.generate([p], max_new_tokens=10, budget=8)
        assert res.sequences == [hf_generate(model, p, 10)]
        assert gen.prefix_pool.nbytes <= gen.prefix_pool.max_bytes
    assert gen.prefix_pool.counters.evictions > 0


def test_sampling_draws_are_those_without_the_cache():
    """Draws are keyed by (seed, request, position): a sampled request reusing a prefix draws what it
    draws without the cache (the reused keys and values are the same numbers up to rounding)."""
    model = tiny_model("llama", sharpen=2.0)
    prompt = np.random.default_rng(2).integers(1, VOCAB, 30).tolist()
    runs = {}
    for cache in (0, None):
        gen = SpeculativeGenerator(model, proposer=Proposer(global_cache=False), prefix_cache_bytes=cache)
        outs = [gen.generate([prompt], max_new_tokens=12, do_sample=True, seed=7, budget=8).sequences[0]
                for _ in range(2)]
        runs[cache] = outs
    assert runs[0] == runs[None]
    assert runs[0][0] == runs[0][1]
