"""SuffixSpecDraftModel inside a real llama-cpp-python `Llama`, on the embedded SmolLM2 GGUF.

Greedy output with our draft model must equal llama-cpp-python's own output without one, or
diverge first at a token where the two best logits are within rounding of each other (a batched
evaluation of a draft does not round exactly as a one-token step), never at a clear choice. The
contexts are longer than `n_batch`, which needs `logits_all=True` with any draft model: without it
such a context raises (the trap docs/serving.md describes)."""

import numpy as np
import pytest
from conftest import COPY_EDITS, chat_ids, greedy, top_two

from suffixspec.integrations.llama_cpp import LlamaDrafter

llama_cpp = pytest.importorskip("llama_cpp")

N_BATCH = 128
NEW_TOKENS = 128
TIE = 0.1  # logits this close are a tie a different summation order may break either way
SETTINGS = dict(n_ctx=2048, n_batch=N_BATCH, n_threads=2, logits_all=True, seed=0, verbose=False)
LONG_CHAT = ("Summarise the following notes in three bullet points.\n\n" + " ".join(
    f"Note {i}: the build step {i} compiles module m{i} and then links it against the runtime; "
    f"when step {i} fails, the log names the module and the first error." for i in range(12)))
CASES = {
    "code-edit-0": lambda llm: chat_ids(llm, COPY_EDITS[0]["prompt"]),
    "code-edit-2": lambda llm: chat_ids(llm, COPY_EDITS[2]["prompt"]),
    "chat-short": lambda llm: chat_ids(llm, "What is a Python list comprehension? Give two short examples."),
    "chat-long": lambda llm: chat_ids(llm, LONG_CHAT),
}


@pytest.fixture(scope="module")
def engines(gguf):
    from suffixspec.integrations.llama_cpp import SuffixSpecDraftModel

    plain = llama_cpp.Llama(model_path=gguf, **SETTINGS)
    # a fixed cost (a drafted token costs 5% of an evaluation): drafts as long as the tree makes
    # them likely, whatever else loads the machine while the cost would be measured
    model = SuffixSpecDraftModel(step_cost=[[1, 1.0], [11, 1.5]])
    drafted = llama_cpp.Llama(model_path=gguf, draft_model=model, **SETTINGS)
    return plain, drafted


def test_the_draft_model_is_llama_cpps():
    from llama_cpp.llama_speculative import LlamaDraftModel

    from suffixspec.integrations.llama_cpp import SuffixSpecDraftModel

    assert issubclass(SuffixSpecDraftModel, LlamaDraftModel) and issubclass(SuffixSpecDraftModel, LlamaDrafter)


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_output_matches_plain_decoding(engines, case):
    plain, drafted = engines
    prompt = CASES[case](plain)
    if case != "chat-short":
        assert len(prompt) > N_BATCH
    want = greedy(plain, prompt, NEW_TOKENS)
    model = drafted.draft_model
    before = dict(model.stats)
    got = greedy(drafted, prompt, NEW_TOKENS)
    calls = model.stats["calls"] - before.get("calls", 0)
    drafted_tokens = model.stats["draft_tokens"] - before.get("draft_tokens", 0)
    assert calls > 0 and len(want) > 16
    if got == want:
        if case.startswith("code-edit"):
            # drafts were taken
            assert calls < 0.8 * len(want) and drafted_tokens > len(want) // 2, (calls, drafted_tokens, model.cost.line(1))
        return
    i = next(j for j in range(min(len(got), len(want))) if got[j] != want[j]) if got[: len(want)] != want[: len(got)] else None
    assert i is not None, f"{case}: one output stops early ({len(got)} vs {len(want)} tokens) without a differing token"
    row = len(prompt) + i - 1  # the logits that chose token i
    for llm, name in ((plain, "plain"), (drafted, "drafted")):
        a, la, b, lb = top_two(np.asarray(llm.scores[row]))
        assert {a, b} == {want[i], got[i]} and la - lb <= TIE, (
            f"{case}: outputs first differ at token {i} ({want[i]} plain, {got[i]} drafted), "
            f"where {name}'s two best logits are {a}: {la:.4f} and {b}: {lb:.4f}")


def test_without_logits_all_a_context_longer_than_n_batch_raises(gguf):
    """The trap: llama-cpp-python keeps n_batch rows of logits unless logits_all=True, while a draft
    model makes every evaluation write one row per token."""
    from suffixspec.integrations.llama_cpp import SuffixSpecDraftModel

    settings = {**SETTINGS, "logits_all": False}
    llm = llama_cpp.Llama(model_path=gguf, draft_model=SuffixSpecDraftModel(), **settings)
    assert llm.scores.shape[0] == N_BATCH
    prompt = chat_ids(llm, LONG_CHAT)
    assert len(prompt) > N_BATCH
    with pytest.raises(ValueError):
        greedy(llm, prompt, 4)
    short = chat_ids(llm, "Say hello.")
    assert len(greedy(llm, short, 8)) > 0  # a context within n_batch decodes
