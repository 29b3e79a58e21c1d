"""Fill-in-the-middle prompts.

Contract: `fim_tokens(tokenizer)` finds the first fill-in-the-middle token family the tokenizer's
vocabulary holds whole (`FIM_FAMILIES`: Qwen2.5-Coder's `<|fim_prefix|>`/`<|fim_suffix|>`/`<|fim_middle|>`,
then StarCoder's `<fim_prefix>`/`<fim_suffix>`/`<fim_middle>`) and returns the three ids (prefix,
suffix, middle), else None. `fim_prompt(tokenizer, ids, prefix, suffix)` builds the prefix-suffix-middle
prompt as token ids: PREFIX_TOKEN + encode(prefix) + SUFFIX_TOKEN + encode(suffix) + MIDDLE_TOKEN; the
special tokens are placed by id, never parsed out of the user's text. The suffix is part of the prompt
the request's automaton is built over, so a middle that runs into the suffix is drafted from it.
`missing_message()` names what a tokenizer without FIM tokens lacks. `fim_end_tokens(tokenizer)`: the
ids a FIM request also stops at (`FIM_ENDS`: a model's end-of-turn token is often not the one it
writes after a middle).
"""

from __future__ import annotations

__all__ = ["FIM_FAMILIES", "FIM_ENDS", "fim_tokens", "fim_end_tokens", "fim_prompt", "missing_message"]

# tokens a FIM-trained model writes where the middle ends (besides its chat end-of-turn token): the
# end of text, padding, and the tokens that open another file or another FIM part
FIM_ENDS = ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<|fim_prefix|>", "<|fim_suffix|>",
            "<|fim_middle|>", "<fim_pad>", "<file_sep>", "<reponame>", "<filename>", "<fim_prefix>", "<fim_suffix>",
            "<fim_middle>")

FIM_FAMILIES = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
)


def token_id(tokenizer, token: str) -> int | None:
    """The id of `token` as one vocabulary entry (a suffixspec.Tokenizer or a Hugging Face tokenizer)."""
    backend = getattr(tokenizer, "backend", None)
    if backend is not None and hasattr(backend, "token_to_id"):
        found = backend.token_to_id(token)
        return None if found is None else int(found)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    found = vocab.get(token)
    return None if found is None else int(found)


def fim_end_tokens(tokenizer) -> tuple[int, ...]:
    """The ids of the `FIM_ENDS` tokens the vocabulary holds: a FIM request ends at any of them."""
    return tuple(sorted({i for i in (token_id(tokenizer, t) for t in FIM_ENDS) if i is not None}))


def fim_tokens(tokenizer) -> tuple[int, int, int] | None:
    for family in FIM_FAMILIES:
        ids = [token_id(tokenizer, t) for t in family]
        if all(i is not None for i in ids):
            return ids[0], ids[1], ids[2]
    return None


def fim_prompt(tokenizer, ids: tuple[int, int, int], prefix: str, suffix: str) -> list[int]:
    pre, suf, mid = ids
    return [pre, *tokenizer.encode(prefix), suf, *tokenizer.encode(suffix), mid]


def missing_message() -> str:
    families = " or ".join("/".join(f) for f in FIM_FAMILIES)
    return (f"suffix: fill-in-the-middle needs the model's FIM tokens, and this model's tokenizer has none "
            f"(looked for {families})")
