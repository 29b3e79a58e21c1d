"""Prompts and checks shared by the generation tests: the tiny-model vocabulary and output length,
fixed random prompts, the exact distribution of the first sampled tokens and a chi-square fit of
samples against it."""

import numpy as np
import torch

VOCAB = 97
LENGTHS = (5, 17, 1, 9)
NEW = 24


def prompts_for(seed=1, lengths=LENGTHS, vocab=VOCAB):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


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


def sampled_fit_pvalue(sequences, exact: dict) -> float:
    """Chi-square p-value of sampled `sequences` against the `exact` distribution ({sequence: prob});
    cells expected below 5 are pooled. A sequence outside `exact` fails at once."""
    from scipy.stats import chisquare

    n = len(sequences)
    counts = {}
    for s in sequences:
        counts[tuple(s)] = counts.get(tuple(s), 0) + 1
    assert set(counts) <= set(exact)
    obs, exp, rest_o, rest_e = [], [], 0.0, 0.0
    for c in sorted(exact, key=exact.get, reverse=True):
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
    return float(chisquare(obs, exp).pvalue)
