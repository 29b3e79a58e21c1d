"""Decoding options beyond sampling, in the engine: penalties, the least length, stop token ids,
ignore_eos and min-p at every node of a draft tree (against a brute-force decoder that runs the whole
context through the model for each token and applies the definitions by hand); logprobs from the
verification pass (against one forward pass); samples of one prompt sharing one prefill; the grammar's
pruning of draft trees (against checking each node's path alone)."""

import numpy as np
import pytest
import torch

from suffixspec.draft.tree import DraftTree, subtree
from suffixspec.engine.budget import CostModel
from suffixspec.engine.options import DecodeOptions
from suffixspec.generate import SpeculativeGenerator
from suffixspec.verify.accept import uniform_draw

from support.prompts import NEW, VOCAB, prompts_for
from support.tiny_models import random_tree_proposer, tiny_model

EOS = 3


def brute_force(model, prompt, opts: DecodeOptions, key: int = 0) -> list[int]:
    """Plain decoding by definition: one full forward pass per token; OpenAI's penalties over the
    output, the repetition penalty over the context, min_tokens, then greedy or inverse-CDF sampling."""
    out = []
    ends = set(opts.stop_token_ids) | (set() if opts.ignore_eos else {EOS})
    while len(out) < opts.max_new_tokens:
        with torch.no_grad():
            scores = model(input_ids=torch.tensor([prompt + out])).logits[0, -1].double().clone()
        for t in set(prompt + out):
            if opts.repetition_penalty != 1.0:
                scores[t] = scores[t] / opts.repetition_penalty if scores[t] > 0 else scores[t] * opts.repetition_penalty
        for t in set(out):
            scores[t] -= out.count(t) * opts.frequency_penalty + opts.presence_penalty
        if len(out) < opts.min_tokens:
            for t in ends:
                scores[t] = -np.inf
        if opts.do_sample:
            probs = torch.softmax(scores / opts.temperature, -1)
            if opts.min_p:
                probs = torch.where(probs < opts.min_p * probs.max(), 0.0, probs)
            cdf = probs.cumsum(-1)
            u = uniform_draw(opts.seed, key, len(out)) * float(cdf[-1])
            tok = min(int(torch.searchsorted(cdf, torch.tensor([u], dtype=cdf.dtype), right=True)[0]), len(cdf) - 1)
        else:
            tok = int(scores.argmax())
        out.append(tok)
        if tok in ends:
            break
    return out


def engine_run(gen, prompts, opts, keys=None):
    server = gen.serve(options=opts)
    idx = [server.add(p, key=k) for p, k in zip(prompts, keys or range(len(prompts)))]
    logprobs = {i: [] for i in idx}
    while not server.idle:
        for ev in server.step().events:
            logprobs[ev.index].extend(ev.logprobs or [])
    res = server.result()
    return [res.sequences[i] for i in idx], [logprobs[i] for i in idx], server


OPTIONS = [dict(frequency_penalty=1.5, presence_penalty=0.5), dict(repetition_penalty=1.4),
           dict(min_tokens=NEW - 2, stop_token_ids=(7,)), dict(ignore_eos=True, presence_penalty=-0.5),
           dict(frequency_penalty=0.8, min_tokens=4)]


@pytest.mark.parametrize("params", OPTIONS)
@pytest.mark.parametrize("sampling", [{}, dict(do_sample=True, temperature=0.8, seed=9),
                                      dict(do_sample=True, temperature=1.0, min_p=0.1, seed=2)])
def test_options_hold_at_every_tree_node(params, sampling):
    model = tiny_model("llama", sharpen=2.0)
    model.generation_config.eos_token_id = EOS
    prompts = prompts_for()[:3]
    gen = SpeculativeGenerator(model, proposer=random_tree_proposer(VOCAB), cost_model=CostModel([1, 1024], [1.0, 1.0]))
    opts = DecodeOptions(max_new_tokens=NEW, budget=6, logprobs=0, **params, **sampling)
    got, logprobs, _ = engine_run(gen, prompts, opts)
    for k, (p, out, lps) in enumerate(zip(prompts, got, logprobs)):
        assert out == brute_force(model, p, opts, key=k), (params, sampling)
        assert [e.token for e in lps] == out
        with torch.inference_mode():
            ref = torch.log_softmax(model(input_ids=torch.tensor([p + out])).logits[0].double(), -1)
        want = [float(ref[len(p) - 1 + i, t]) for i, t in enumerate(out)]
        assert np.max(np.abs(np.array([e.logprob for e in lps]) - want)) < 1e-6  # (the pass returns float32 logits)


def test_logprobs_report_the_top_alternatives_in_order():
    model = tiny_model("llama", sharpen=2.0)
    prompt = prompts_for()[0]
    gen = SpeculativeGenerator(model, proposer=random_tree_proposer(VOCAB), cost_model=CostModel([1, 1024], [1.0, 1.0]))
    (out,), (lps,), _ = engine_run(gen, [prompt], DecodeOptions(max_new_tokens=NEW, budget=6, logprobs=5))
    for i, e in enumerate(lps):
        with torch.inference_mode():
            ref = torch.log_softmax(model(input_ids=torch.tensor([prompt + out[:i]])).logits[0, -1].double(), -1)
        values, ids = torch.topk(ref, 5)
        assert [a.token for a in e.top] == ids.tolist()
        assert np.allclose([a.logprob for a in e.top], values.numpy(), atol=1e-6)


def test_samples_of_one_prompt_share_one_prefill_and_equal_their_own_runs():
    model = tiny_model("llama", sharpen=2.0)
    prompt = prompts_for(lengths=(40,))[0]
    gen = SpeculativeGenerator(model, proposer=random_tree_proposer(VOCAB),
                               cost_model=CostModel([1, 1024], [1.0, 1.0]))
    opts = DecodeOptions(max_new_tokens=NEW, budget=6, do_sample=True, temperature=0.8, seed=5)
    alone = []
    for k in range(4):
        server = gen.serve(options=opts)
        server.add(prompt, key=k)
        alone.append(server.run().sequences[0])
    for cache, read in [(0, len(prompt) - 1 + 4), (None, 4)]:
        # without a prefix cache the prompt is read once, then one token per sample; with the
        # generator's cache (which holds it from the runs above) only the one token per sample
        server = gen.serve(options=opts, prefix_cache_bytes=cache)
        first = server.add(prompt, key=0)
        family = [first] + [server.add(prompt, key=k, sibling=first) for k in range(1, 4)]
        res = server.run()
        assert [res.sequences[i] for i in family] == alone
        assert server.stats.prefill_tokens == read
        assert server.stats.cached_tokens == (0 if cache == 0 else 4 * (len(prompt) - 1))


def test_grammar_prunes_exactly_the_nodes_it_forbids():
    pytest.importorskip("llguidance")
    from suffixspec.tokenizer import load_tokenizer
    from suffixspec.verify.structured import GrammarProcessor, Structure

    tok = load_tokenizer()
    grammar = Structure.json_schema({"type": "object", "properties": {"code": {"type": "string"}},
                                     "required": ["code"]}).compile(tok)
    rng = np.random.default_rng(0)
    answer = tok.encode('{"code":"def f(x):\\n    return x"}')
    for trial in range(20):
        done = int(rng.integers(0, len(answer) - 3))
        paths = [answer[done: done + int(rng.integers(1, 5))]]  # the right continuation, and variations of it
        for _ in range(5):
            path = list(paths[0])
            path[int(rng.integers(0, len(path)))] = int(rng.choice([int(rng.integers(0, tok.vocab_size)), *answer]))
            paths.append(path)
        tree = DraftTree.from_paths(paths)
        proc = GrammarProcessor(grammar, tok, prompt_len=0)
        kept = proc.prune(tree, answer[:done])
        allowed = []
        for node in range(len(tree)):  # brute force: a fresh matcher over the output and the node's path
            fresh = GrammarProcessor(grammar, tok, prompt_len=0)
            fresh.sync(answer[:done])
            path = [int(t) for t in tree.tokens[tree.path_to(node)]]
            allowed.append(fresh.matcher.validate_tokens(path) == len(path))
        assert sorted(map(tuple, (kept.tokens[kept.path_to(i)].tolist() for i in range(len(kept))))) == sorted(
            tuple(tree.tokens[tree.path_to(i)].tolist()) for i in range(len(tree)) if allowed[i])


def test_subtree_keeps_the_marked_nodes_and_their_links():
    rng = np.random.default_rng(1)
    for _ in range(50):
        paths = [rng.integers(0, 6, int(rng.integers(1, 5))).tolist() for _ in range(6)]
        tree = DraftTree.from_paths(paths)
        keep = np.zeros(len(tree), bool)
        for node in rng.choice(len(tree), size=int(rng.integers(0, len(tree) + 1)), replace=False):
            keep[tree.path_to(int(node))] = True  # closed under parents
        sub = subtree(tree, keep)
        assert sorted(tuple(sub.tokens[sub.path_to(i)].tolist()) for i in range(len(sub))) == sorted(
            tuple(tree.tokens[tree.path_to(i)].tolist()) for i in np.flatnonzero(keep))
