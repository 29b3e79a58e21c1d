"""The verifier is device-clean: a pass and a commit create every tensor on the model's device, copy
from the host once, and never read device data back (shown on the `meta` device, where any read
raises); a greedy round copies the chosen tokens back once; the tree mask built on the device equals
the trees' ancestor masks."""

import collections

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

import suffixspec.verify.accept as acceptance
from suffixspec.draft.tree import DraftTree
from suffixspec.verify.accept import Sampler, accept
from suffixspec.verify.batch import RoundBatch
from suffixspec.verify.kv import KVState
from suffixspec.verify.treemask import ancestor_closure

from support.tiny_models import tiny_model

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


class Recorder(TorchFunctionMode):
    """Counts reads of tensor data on the host (`READS`), host-to-device copies, and results of torch
    functions that land on a device other than `device`."""

    def __init__(self, device: str):
        super().__init__()
        self.device = device
        self.reads, self.uploads, self.off_device = collections.Counter(), 0, collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", str(func))
        if name in READS:
            self.reads[name] += 1
        if name == "to" and isinstance(args[0], torch.Tensor) and args[0].device.type == "cpu" \
                and isinstance(out, torch.Tensor) and out.device.type != "cpu":
            self.uploads += 1
        for o in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(o, torch.Tensor) and o.device.type != self.device:
                self.off_device[name] += 1
        return out


def meta_model(kind):
    """`tiny_model(kind)`'s architecture with its parameters on the `meta` device (no data)."""
    config = tiny_model(kind).config
    with torch.device("meta"):
        import transformers

        return transformers.AutoModelForCausalLM.from_config(config).eval()


TREE = DraftTree.from_paths([[3, 4, 5], [3, 6], [7]])
EMPTY = DraftTree.empty()


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_passes_and_commits_stay_on_the_device_without_reading_it(kind):
    model = meta_model(kind)
    state = KVState(model, 2)
    steps = [  # (pending, trees, kept nodes): a prefill, a step, trees, a row with holes
        ([[1, 2, 3, 4], [5, 6, 7, 8]], [EMPTY, EMPTY], [[], []]),
        ([[1], [2]], [EMPTY, EMPTY], [[], []]),
        ([[1], [2]], [TREE, EMPTY], [[0, 1], []]),
        ([[9], [2]], [TREE, TREE], [[0], [4]]),
        ([[1], [2]], [EMPTY, TREE], [[], []]),
    ]
    for pending, trees, kept in steps:
        with Recorder("meta") as rec:
            logits, root = state.forward(pending, trees)
            assert logits.device.type == "meta"
            assert logits.shape[:2] == (2, 1 + max(len(t) for t in trees))
            state.commit(kept)
        assert not rec.reads and not rec.off_device, (rec.reads, rec.off_device)
        assert rec.uploads <= 2  # one buffer for the pass, one for the commit
    assert state.n_cached.tolist() == [4 + 1 + 3 + 2 + 1, 4 + 1 + 1 + 2 + 1]
    other = KVState(model, 1)
    other.forward([[4, 5, 6]], [EMPTY])
    other.commit([[]])
    with Recorder("meta") as rec:
        state.add_rows(other)
        state.select_rows([2, 0])
    assert not rec.reads and not rec.off_device
    assert state.n_cached.tolist() == [3, 11]


def test_greedy_round_reads_the_device_once(monkeypatch):
    """Off the CPU, greedy acceptance copies every position's argmax at once: forward, accept and
    commit of a round read device data exactly once (forced here on the CPU)."""
    monkeypatch.setattr(acceptance, "STEPWISE_DEVICES", frozenset())
    model = tiny_model("llama", sharpen=20.0)
    state = KVState(model, 2)
    state.forward([[1, 2, 3, 4], [5, 6, 7, 8]], [EMPTY, EMPTY])
    state.commit([[], []])
    sampler = Sampler()
    for trees in ([EMPTY, EMPTY], [TREE, TREE], [TREE, EMPTY]):
        batch = RoundBatch.build(trees, [10, 10], pending=[[1], [2]], auto=[True, True], samplers=[sampler] * 2,
                                 eos=[set(), set()], contexts=[[1], [2]], keys=[0, 1], generated=[1, 1])
        with Recorder("cpu") as rec:
            logits, root = state.forward(batch.pending, batch.trees)
            results = accept(logits, root, batch)
            state.commit([r.accepted_nodes for r in results])
        assert sum(rec.reads.values()) == 1, rec.reads


def random_tree(rng, n):
    parents = [-1]
    for i in range(1, n):
        parents.append(int(rng.integers(-1, i)))
    return DraftTree(rng.permutation(1000)[:n], parents)


def test_ancestor_closure_equals_the_trees_masks():
    rng = np.random.default_rng(0)
    for _ in range(30):
        n = int(rng.integers(1, 40))
        tree = random_tree(rng, n)
        parents = torch.from_numpy(tree.parents.astype(np.int64))[None]
        got = ancestor_closure(parents, int(tree.depths.max()))[0].numpy()
        want = np.zeros((n, n), bool)  # brute force: follow each node's parents to the root
        for i in range(n):
            j = i
            while j >= 0:
                want[i, j] = True
                j = int(tree.parents[j])
        assert np.array_equal(got, want)
        assert np.array_equal(got, tree.ancestor_mask())


def test_host_walk_equals_the_stepwise_walk(monkeypatch):
    """Greedy acceptance from every position's argmax equals the walk that argmaxes level by level."""
    rng = np.random.default_rng(1)
    sampler = Sampler()
    for _ in range(40):
        b = int(rng.integers(1, 5))
        trees = [random_tree(rng, int(rng.integers(1, 12))) if rng.random() < 0.8 else EMPTY for _ in range(b)]
        vocab = 1000
        K = 1 + max(len(t) for t in trees)
        logits = torch.randn(b, K, vocab)
        for r, t in enumerate(trees):  # make the target follow some drafted children
            root = K - 1 - len(t)
            for i in range(len(t)):
                if rng.random() < 0.7:
                    at = root + (1 + int(t.parents[i]) if t.parents[i] >= 0 else 0)
                    logits[r, at, int(t.tokens[i])] = 50.0 + rng.random()
        root_index = np.array([K - 1 - len(t) for t in trees])
        eos = [{int(rng.integers(0, vocab))} if rng.random() < 0.3 else set() for _ in range(b)]
        limits = rng.integers(0, 8, b).tolist()
        batch = RoundBatch.build(trees, limits, pending=[[1]] * b, auto=[True] * b, samplers=[sampler] * b, eos=eos,
                                 contexts=[[1]] * b, keys=list(range(b)), generated=[1] * b)
        monkeypatch.setattr(acceptance, "STEPWISE_DEVICES", frozenset({"cpu"}))
        stepwise = accept(logits, root_index, batch)
        monkeypatch.setattr(acceptance, "STEPWISE_DEVICES", frozenset())
        once = accept(logits, root_index, batch)
        assert [(r.tokens, r.accepted_nodes, r.stopped_on_eos) for r in once] == \
            [(r.tokens, r.accepted_nodes, r.stopped_on_eos) for r in stepwise]


def test_cpu_only_layers_stay_off_other_devices():
    """`prepare_model` packs linear layers and switches to the grouped attention on the CPU only."""
    from suffixspec.models import prepare_model

    on_meta = meta_model("llama").float()
    assert prepare_model(on_meta) == {"device": "meta", "packed_layers": 0, "grouped_attention": False}
    assert on_meta.config._attn_implementation == "sdpa"
    on_cpu = tiny_model("llama").float()
    done = prepare_model(on_cpu)
    assert done["device"] == "cpu" and done["grouped_attention"]
    assert done["packed_layers"] == (7 * 2 + 1 if torch.backends.mkldnn.is_available() else 0)


def test_masked_passes_on_cuda_use_a_kernel_that_takes_the_mask():
    """`tree_sdpa` leaves out flash attention (no arbitrary mask); under it a masked attention still
    runs (here on the CPU through the math kernel) and gives the unrestricted result."""
    from suffixspec.verify.treemask import TREE_SDPA_BACKENDS, tree_sdpa

    assert "FLASH_ATTENTION" not in TREE_SDPA_BACKENDS and "EFFICIENT_ATTENTION" in TREE_SDPA_BACKENDS
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 4, 9, 16)
    mask = torch.zeros(2, 1, 5, 9)
    mask[..., ::3] = torch.finfo(torch.float32).min
    want = torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=mask)
    with tree_sdpa():
        got = torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=mask)
    assert torch.allclose(got, want, atol=1e-5)
