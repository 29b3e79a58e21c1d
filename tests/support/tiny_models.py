"""Tiny randomly initialised causal LMs (float64) and stand-in proposers for the verifier tests."""

import zlib

import numpy as np
import torch

from suffixspec.draft.tree import DraftTree

# Tiny models run ~100x faster on one thread than on a contended multi-threaded pool.
torch.set_num_threads(1)

FAMILIES = ("llama", "qwen2", "gpt2")


def tiny_model(kind="llama", attn="sdpa", vocab=97, seed=0, sharpen=1.0, window=4, positions=512):
    """A 2-3 layer model of family `kind` in float64 with attention implementation `attn`.

    `sharpen` scales the output head so next-token distributions are far from uniform.
    """
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, bos_token_id=0, eos_token_id=None, pad_token_id=0)
    if kind == "llama":
        cfg = tf.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, max_position_embeddings=positions, **common)
        model = tf.LlamaForCausalLM(cfg)
    elif kind == "qwen2":
        cfg = tf.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, max_position_embeddings=positions, **common)
        model = tf.Qwen2ForCausalLM(cfg)
    elif kind == "gpt2":
        cfg = tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=512, vocab_size=vocab,
                            bos_token_id=0, eos_token_id=0)
        model = tf.GPT2LMHeadModel(cfg)
    elif kind == "gemma3":
        cfg = tf.Gemma3TextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                                  sliding_window=window,
                                  layer_types=["sliding_attention", "sliding_attention", "full_attention"], **common)
        model = tf.Gemma3ForCausalLM(cfg)
    else:
        raise ValueError(kind)
    model.config._attn_implementation = "sdpa" if attn == "suffixspec_sdpa" else attn
    if attn == "suffixspec_sdpa":
        from suffixspec.attention import use_grouped_sdpa

        assert use_grouped_sdpa(model), kind
    model.generation_config.eos_token_id = None
    model = model.double().eval()
    if sharpen != 1.0:
        with torch.no_grad():
            head = model.get_output_embeddings()
            head.weight.copy_(head.weight * sharpen)  # (tied embeddings get scaled too; fine for tests)
    return model


def hf_generate(model, prompt, max_new_tokens, eos_token_id=None, logits_processor=None):
    """transformers' plain greedy decoding of one unpadded prompt (the reference)."""
    ids = torch.tensor([prompt])
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0,
                  attention_mask=torch.ones_like(ids), eos_token_id=eos_token_id)
    if logits_processor is not None:
        kwargs["logits_processor"] = logits_processor
    with torch.no_grad():
        out = model.generate(ids, **kwargs)
    return out[0, len(prompt):].tolist()


class _Session:
    def __init__(self, proposer, prompt, request_id):
        self.proposer, self.prompt, self.out, self.request_id = proposer, list(prompt), [], request_id
        # crc32, not hash(): hash(None) differs between processes before Python 3.12
        self.rng = np.random.default_rng(zlib.crc32(repr((tuple(prompt), request_id)).encode()))

    def extend(self, tokens):
        self.out.extend(int(t) for t in tokens)

    def propose(self, budget):
        tree = self.proposer.draft(self, budget)
        self.proposer.calls += 1
        return tree

    def close(self):
        self.proposer.closed += 1


class StandInProposer:
    """Drafts from a function `draft(session, budget) -> DraftTree` (the real Proposer's interface)."""

    def __init__(self, draft):
        self._draft = draft
        self.calls = self.closed = self.started = 0

    def draft(self, session, budget):
        return self._draft(session, budget)

    def start(self, prompt_ids, request_id=None, filter=None):
        self.started += 1
        return _Session(self, prompt_ids, request_id)


def oracle_proposer(references, vocab, wrong=True, junk=0):
    """Drafts the known continuation `references[tuple(prompt)]`, hidden among wrong siblings:
    a wrong first token scored above it, a branch that agrees for a while then diverges, and
    `junk` random paths."""

    def draft(session, budget):
        ref = references[tuple(session.prompt)]
        n = len(session.out)
        cont = ref[n : n + budget]
        paths, scores = [], []
        if wrong and cont:
            paths.append([(cont[0] + 1) % vocab, (cont[0] + 2) % vocab])
            scores.append(0.9)
        if cont:
            paths.append(cont)
            scores.append(0.8)
        if wrong and len(cont) > 2:
            paths.append(cont[:2] + [(cont[2] + 3) % vocab, 1, 2])
            scores.append(0.7)
        for _ in range(junk):
            paths.append(session.rng.integers(0, vocab, int(session.rng.integers(1, 6))).tolist())
            scores.append(0.1)
        tree = DraftTree.from_paths(paths, scores) if paths else DraftTree.empty()
        return _sorted(tree)

    return StandInProposer(draft)


def random_tree_proposer(vocab, size=8):
    """Pure junk trees (random tokens and shapes), sometimes empty."""

    def draft(session, budget):
        k = int(session.rng.integers(0, min(size, budget) + 1))
        if k == 0:
            return DraftTree.empty()
        paths = [session.rng.integers(0, vocab, int(session.rng.integers(1, 5))).tolist() for _ in range(k)]
        return _sorted(DraftTree.from_paths(paths, session.rng.random(k)))

    return StandInProposer(draft)


def _sorted(tree):
    """Re-order siblings by descending score and make scores non-increasing along paths
    (the DraftTree contract), keeping a topological order."""
    n = len(tree)
    if n == 0:
        return tree
    scores = tree.scores.copy()
    for i in range(n):
        if tree.parents[i] >= 0:
            scores[i] = min(scores[i], scores[tree.parents[i]])
    order = []

    def visit(node):
        kids = [int(c) for c in np.flatnonzero(tree.parents == node)]
        kids.sort(key=lambda c: -scores[c])
        for c in kids:
            order.append(c)
        for c in kids:
            visit(c)

    visit(-1)
    order = np.array(order)
    remap = np.empty(n, np.int64)
    remap[order] = np.arange(n)
    parents = np.where(tree.parents[order] >= 0, remap[np.maximum(tree.parents[order], 0)], -1)
    return DraftTree(tree.tokens[order], parents, scores[order])
