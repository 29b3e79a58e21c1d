"""Model loading helpers: oneDNN pre-packed linear layers against the dense ones."""

import copy

import pytest
import torch

from suffixspec.generate import CostModel, SpeculativeGenerator
from suffixspec.models import prepack_linear_layers

from support.tiny_models import hf_generate, oracle_proposer, tiny_model

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN not in this torch build")


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("tied", [False, True])
def test_prepacked_layers_compute_what_the_dense_ones_do(kind, tied):
    dense = tiny_model(kind).float()
    if tied:
        dense.lm_head.weight = dense.get_input_embeddings().weight
    packed = copy.deepcopy(dense)
    n_linear = sum(type(m) is torch.nn.Linear for m in dense.modules())
    embedding = packed.get_input_embeddings().weight
    replaced = prepack_linear_layers(packed)
    assert replaced == n_linear  # a tied head gets its own packed copy
    assert sum(type(m) is torch.nn.Linear for m in packed.modules()) == 0
    assert packed.get_input_embeddings().weight is embedding  # the input side keeps the original
    assert torch.equal(embedding, dense.get_input_embeddings().weight)
    torch.manual_seed(0)
    for shape in [(1, 1), (1, 7), (3, 5)]:  # one-token steps, multi-token passes, batches
        ids = torch.randint(0, 97, shape)
        with torch.inference_mode():
            want, got = dense(ids).logits, packed(ids).logits
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("reorder", ["available", "fails", "missing"])
def test_prepacked_layouts_compute_what_the_dense_ones_do(reorder, monkeypatch, caplog):
    """The blocked layout where torch can reorder weights for linear layers, else oneDNN's plain layout
    (a logged warning when the reorder operator fails): the same logits either way."""
    dense = tiny_model("llama").float()
    packed = copy.deepcopy(dense)
    if reorder != "available":
        class Ops:  # torch.ops.mkldnn without the reorder operator, or with one that raises
            _linear_pointwise = torch.ops.mkldnn._linear_pointwise

            def __getattr__(self, name):
                if name == "_reorder_linear_weight" and reorder == "fails":
                    def fail(*args):
                        raise RuntimeError("no kernel")

                    return fail
                raise AttributeError(name)

        monkeypatch.setattr(torch.ops, "mkldnn", Ops())
    with caplog.at_level("WARNING", logger="suffixspec.models"):
        prepack_linear_layers(packed)
    monkeypatch.undo()
    layouts = {m.layout for m in packed.modules() if hasattr(m, "layout")}
    assert layouts == ({"blocked"} if reorder == "available" else {"plain"})
    assert ("could not reorder" in caplog.text) == (reorder == "fails")
    ids = torch.randint(0, 97, (2, 6))
    with torch.inference_mode():
        assert torch.allclose(packed(ids).logits, dense(ids).logits, atol=1e-5, rtol=1e-5)


def test_prepacked_model_speculates_to_plain_greedy_output():
    dense = tiny_model("llama", sharpen=4.0).float()
    packed = copy.deepcopy(dense)
    assert prepack_linear_layers(packed) > 0
    prompts = [[5, 6, 7, 8, 5, 6, 7], [9, 10, 11, 9, 10]]
    refs = {tuple(p): hf_generate(dense, p, 12) for p in prompts}
    gen = SpeculativeGenerator(packed, proposer=oracle_proposer(refs, 97), cost_model=CostModel([1, 64], [1.0, 1.5]))
    out = gen.generate(prompts, max_new_tokens=12, budget=6)
    assert out.sequences == [refs[tuple(p)] for p in prompts]
    assert out.stats.tokens_per_round > 2  # the drafts were verified, not skipped


def test_prepack_skips_what_it_cannot_pack():
    model = tiny_model("gpt2").float()  # GPT-2 projects through Conv1D; its only Linear is the tied head
    dense = copy.deepcopy(model)
    assert prepack_linear_layers(model) == 1
    assert type(model.lm_head) is not torch.nn.Linear and model.transformer.wte.weight is not None
    ids = torch.randint(0, 97, (2, 6))
    with torch.inference_mode():
        assert torch.allclose(model(ids).logits, dense(ids).logits, atol=1e-5, rtol=1e-5)
    double = tiny_model("llama")  # float64 stays dense
    assert prepack_linear_layers(double) == 0
